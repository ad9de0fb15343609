package cmd

import (
	"os"

	"path/filepath"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

// TestDBRefusesPostgresURL: a postgres:// or postgresql:// URL in --db or
// $STEPWISE_DB is refused with exit 2 and a message saying this build has
// no PostgreSQL store, naming the server but never the password, and no
// file is created for it.
func TestDBRefusesPostgresURL(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for _, url := range []string{"postgres://ops:s3cret@db.example:5432/stepwise", "postgresql://ops:s3cret@db.example/stepwise?sslmode=disable", "POSTGRES://ops:s3cret@db.example/x"} {
		o := cliRun(t, []string{"--db", url, "runs"})
		if o.code != ExitUsage || !strings.Contains(o.stderr, "no PostgreSQL store") || !strings.Contains(o.stderr, "db.example") {
			t.Errorf("--db %s: exit %d, want 2 and an error saying there is no PostgreSQL store, naming the server\n%s", url, o.code, o)
		}
		if strings.Contains(o.stderr+o.stdout, "s3cret") {
			t.Errorf("--db %s: the password is printed\n%s", url, o)
		}
	}
	t.Setenv("STEPWISE_DB", "postgres://ops:s3cret@db.example/stepwise")
	if o := cliRun(t, []string{"runs"}); o.code != ExitUsage || !strings.Contains(o.stderr, "no PostgreSQL store") {
		t.Errorf("$STEPWISE_DB=postgres://…: exit %d, want 2\n%s", o.code, o)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("refusing a URL created %v", ents)
	}
}

// TestDBPathIsAbsolute: a relative --db path is made absolute when parsed
// (as kong's path type did), and a URL is kept as it is.
func TestDBPathIsAbsolute(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for arg, want := range map[string]string{
		"rel.db":                        filepath.Join(dir, "rel.db"),
		"/abs/x.db":                     "/abs/x.db",
		"postgres://u:p@h/db":           "postgres://u:p@h/db",
		"postgresql://h/db?sslmode=off": "postgresql://h/db?sslmode=off",
	} {
		c := &struct{ Globals }{}
		parser, err := kong.New(c, cliConventions()...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := parser.Parse([]string{"--db", arg}); err != nil {
			t.Fatalf("--db %s: %v", arg, err)
		}
		if c.DB != want {
			t.Errorf("--db %s parsed as %q; want %q", arg, c.DB, want)
		}
	}
}
