package cmd

import (
	"strings"
	"testing"
)

// Library errors carry data; the command line adds what to type, in the
// program's own name. These hold each hint and that the library's part of
// the message names no command or flag.
func TestHintsComeFromTheCommandLine(t *testing.T) {
	t.Parallel()
	db, side := testFiles(t)
	name := []Option{Name("mytool")}
	if o := cliRun(t, []string{"--db", db, "run", "crashy", "-p", "key=h", "-p", "side=" + side, "-p", "steps=1"}, name...); o.code != ExitOK {
		t.Fatalf("first run: %s", o)
	}

	o := cliRun(t, []string{"--db", db, "run", "crashy", "-p", "key=h", "-p", "side=" + side, "-p", "steps=1"}, name...)
	if o.code != ExitOK || !strings.Contains(o.stdout, "already succeeded") && !strings.Contains(o.stdout, "nothing to do") ||
		!strings.Contains(o.stdout, "--force runs it again") {
		t.Errorf("a succeeded run again: want exit 0 and the --force hint on stdout\n%s", o)
	}

	for _, c := range []struct {
		args []string
		code int
		lib  string // the library's own words
		hint string // what the command line adds
	}{
		{[]string{"show", "crashy/nosuch"}, ExitUsage, `no run "crashy/nosuch"`, "mytool: `mytool runs` lists the runs"},
		{[]string{"abandon", "crashy/nosuch", "--reason", "x"}, ExitUsage, `no run "crashy/nosuch"`, "mytool: `mytool runs` lists the runs"},
		{[]string{"run", "nosuch"}, ExitUsage, `"nosuch" (registered: [`, "mytool: `mytool jobs` lists the jobs"},
	} {
		o := cliRun(t, append([]string{"--db", db}, c.args...), name...)
		if o.code != c.code || !strings.Contains(o.stderr, c.lib) || !strings.Contains(o.stderr, c.hint) {
			t.Errorf("%v: exit %d, want %d with %q and %q\n%s", c.args, o.code, c.code, c.lib, c.hint, o)
		}
		first, _, _ := strings.Cut(o.stderr, "\n")
		if strings.Contains(first, "`") || strings.Contains(first, "stepwise ") {
			t.Errorf("%v: the library's message names a command: %q", c.args, first)
		}
	}
}
