package checkpoint_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
)

func TestRedactLocation(t *testing.T) {
	for in, want := range map[string]string{
		"/var/lib/stepwise.db":                                         "/var/lib/stepwise.db",
		"postgres://app@db/ledger":                                     "postgres://app@db/ledger",
		"postgres://app:s3cret@db/ledger":                              "postgres://app:xxxxx@db/ledger",
		"postgres://app@db/ledger?password=s3cret&sslmode=verify-full": "postgres://app@db/ledger?password=xxxxx&sslmode=verify-full",
		"postgresql://app@db/x?sslpassword=s3cret":                     "postgresql://app@db/x?sslpassword=xxxxx",
		"postgres://app:s3cret%zz@db/x":                                "postgres://(a URL that does not parse)",
	} {
		if got := checkpoint.RedactLocation(in); got != want {
			t.Errorf("RedactLocation(%q) = %q; want %q", in, got, want)
		}
		if strings.Contains(checkpoint.RedactLocation(in), "s3cret") {
			t.Errorf("RedactLocation(%q) shows the password", in)
		}
	}
	for in, want := range map[string]bool{
		"postgres://app@db/x":                 false,
		"postgres://app:pw@db/x":              true,
		"postgres://app@db/x?password=pw":     true,
		"postgres://app@db/x?sslpassword=pw":  true,
		"postgres://app@db/x?sslmode=disable": false,
	} {
		u, err := url.Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := checkpoint.HasSecret(u); got != want {
			t.Errorf("HasSecret(%s) = %v; want %v", in, got, want)
		}
	}
}

func TestIsPostgresURL(t *testing.T) {
	for in, want := range map[string]bool{
		"postgres://app@db/x":          true,
		"postgresql://app@db/x":        true,
		"POSTGRES://app@db/x":          true,
		"/var/lib/stepwise.db":         false,
		"stepwise.db":                  false,
		"mysql://app@db/x":             false,
		"file:postgres://not-one.db":   false,
		"postgres:/missing-slashes.db": false,
	} {
		if got := checkpoint.IsPostgresURL(in); got != want {
			t.Errorf("IsPostgresURL(%q) = %v; want %v", in, got, want)
		}
	}
}
