package steps_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/steps"
)

func TestID(t *testing.T) {
	for _, tc := range []struct {
		name string
		keys []string
		want string
	}{
		{"load", nil, "load"},
		{"post", []string{"T-1001"}, "post/T-1001"},
		{"post", []string{"acct:42", "2026-11-28"}, "post/acct:42/2026-11-28"},
	} {
		got := steps.ID(tc.name, tc.keys...)
		if got != tc.want {
			t.Errorf("ID(%q, %q) = %q; want %q", tc.name, tc.keys, got, tc.want)
		}
		if err := steps.ValidateID(got); err != nil {
			t.Errorf("ValidateID(%q) = %v; want nil", got, err)
		}
	}
}

func TestValidateID(t *testing.T) {
	valid := []string{
		"load", "post/T-1001", "a.b_c-d:e@f=g+h", "UPPER/lower/0123456789",
		strings.Repeat("x", steps.MaxIDLength),
	}
	for _, id := range valid {
		if err := steps.ValidateID(id); err != nil {
			t.Errorf("ValidateID(%.20q) = %v; want nil", id, err)
		}
	}
	invalid := []struct {
		id, mention string
	}{
		{"", "empty"},
		{"has space", `' '`},
		{"post/T#1", `'#'`},
		{"a//b", "empty part"},
		{"/lead", "empty part"},
		{"trail/", "empty part"},
		{"tab\there", `'\t'`},
		{"naïve", `'ï'`},
		{"semi;colon", `';'`},
		{strings.Repeat("x", steps.MaxIDLength+1), "257 bytes"},
	}
	for _, tc := range invalid {
		err := steps.ValidateID(tc.id)
		if !errors.Is(err, steps.ErrInvalidID) {
			t.Errorf("ValidateID(%.20q) = %v; want ErrInvalidID", tc.id, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("ValidateID(%.20q) = %q; want it to mention %s", tc.id, err, tc.mention)
		}
	}
}

func FuzzValidateID(f *testing.F) {
	for _, s := range []string{"load", "post/T-1001", "a//b", "", "x y", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := steps.ValidateID(id)
		if err != nil && !errors.Is(err, steps.ErrInvalidID) {
			t.Fatalf("ValidateID(%q) = %v; want nil or ErrInvalidID", id, err)
		}
		if err != nil {
			return
		}
		// A valid ID is short, has no empty part and only allowed bytes.
		if len(id) == 0 || len(id) > steps.MaxIDLength {
			t.Fatalf("ValidateID accepted %q of length %d", id, len(id))
		}
		for _, part := range strings.Split(id, "/") {
			if part == "" {
				t.Fatalf("ValidateID accepted %q with an empty part", id)
			}
			if strings.Trim(part, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:@=+") != "" {
				t.Fatalf("ValidateID accepted %q with a character outside the set", id)
			}
		}
	})
}
