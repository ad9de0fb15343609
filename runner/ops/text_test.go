package ops_test

import (
	"errors"
	"net/url"
	"testing"

	"github.com/stepwise-run/stepwise/runner/ops"
)

func TestCheckText(t *testing.T) {
	for _, c := range []struct {
		field, text string
		ok          bool
	}{
		{"reason", "the bank was down\nuntil 10:00\tUTC", true},
		{"reason", "café ✓ \uFFFD", true}, // a real U+FFFD is text
		{"operator", "ops-alice", true},
		{"operator", "", true},
		{"reason", "why\x00not", false},
		{"reason", "caf\xe9", false},
		{"reason", "red \x1b[31malert", false},
		{"reason", "\u0085next line", false}, // C1
		{"reason", "del\x7f", false},
		{"operator", "alice\nbob", false}, // newlines only in reasons
		{"from_step", "load\t", false},
		{"--reason", "two\nlines", true},
		{"--output", "{\n\t\"id\": \"rcpt-77\"\n}", true},
		{"--output", "{\"id\": \"\x00\"}", false},
		{"reason", "approved\u202e", false},  // a right-to-left override
		{"reason", "ok\u2066x\u2069", false}, // an isolate
		{"operator", "ali\u200bce", false},   // a zero-width space
	} {
		err := ops.CheckText(c.field, c.text)
		if c.ok != (err == nil) {
			t.Errorf("CheckText(%q, %q) = %v; want ok %t", c.field, c.text, err, c.ok)
		}
		var te *ops.TextError
		if err != nil && (!errors.Is(err, ops.ErrBadText) || !errors.As(err, &te) || te.Field != c.field) {
			t.Errorf("CheckText(%q, %q) = %v; want a *TextError naming %s", c.field, c.text, err, c.field)
		}
	}
}

func TestCheckJSON(t *testing.T) {
	for _, c := range []struct {
		doc, field string // field "" means accepted
	}{
		{`{"reason":"two\nlines","force":true,"output":{"id":"x"}}`, ""},
		{`{"reason":"a\u0000b"}`, "reason"},
		{"{\"reason\":\"caf\xe9\"}", "reason"},
		{`{"job":"report","params":{"date":"2026-11-28","note":"x\u001b"}}`, "params.note"},
		{`{"keys":["ok","b\u0000"],"reason":"fixed"}`, "keys[1]"},
		{`{"from_step":"load\n","reason":"x"}`, "from_step"},
		{"{\"re\xffason\":\"x\"}", "a field name in the body"},
		{`{"a\u0000":"x"}`, `the name of field "a\x00"`},
		{`not json`, ""}, // the decoder refuses it
	} {
		err := ops.CheckJSON([]byte(c.doc))
		var te *ops.TextError
		switch {
		case c.field == "" && err != nil:
			t.Errorf("CheckJSON(%q) = %v; want it accepted", c.doc, err)
		case c.field != "" && (!errors.As(err, &te) || te.Field != c.field):
			t.Errorf("CheckJSON(%q) = %v; want a *TextError naming %s", c.doc, err, c.field)
		}
	}
}

func TestCheckURL(t *testing.T) {
	for _, c := range []struct {
		raw, field string
	}{
		{"/api/v1/runs/report/2026-11-28?status=failed&limit=10", ""},
		{"/api/v1/runs/report%2F2026-11-28", ""},
		{"/api/v1/runs/report/2026%0011", "path"},
		{"/api/v1/runs/report/caf%E9", "path"},
		{"/api/v1/runs?job=a%00b", "job"},
		{"/api/v1/runs?status=%FF", "status"},
		{"/api/v1/runs?x%00=1", `"x\x00"`},
	} {
		u, err := url.Parse(c.raw)
		if err != nil {
			t.Fatal(err)
		}
		err = ops.CheckURL(u)
		var te *ops.TextError
		switch {
		case c.field == "" && err != nil:
			t.Errorf("CheckURL(%s) = %v; want it accepted", c.raw, err)
		case c.field != "" && (!errors.As(err, &te) || te.Field != c.field):
			t.Errorf("CheckURL(%s) = %v; want a *TextError naming %s", c.raw, err, c.field)
		}
	}
}
