package cmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBareInvocationPrintsShortUsage: the program with no arguments lists
// the common commands it has (not kong's "expected one of"), and exits 2.
func TestBareInvocationPrintsShortUsage(t *testing.T) {
	t.Parallel()
	o := cliRun(t, nil)
	if o.code != ExitUsage {
		t.Fatalf("bare invocation: exit %d, want %d\n%s", o.code, ExitUsage, o)
	}
	for _, want := range []string{"Usage: stepwise COMMAND", "stepwise run JOB -p NAME=VALUE", "stepwise runs ", "stepwise show RUN_ID", "stepwise --help"} {
		if !strings.Contains(o.stderr, want) {
			t.Errorf("short usage lacks %q:\n%s", want, o.stderr)
		}
	}
	if strings.Contains(o.stderr, "expected one of") || strings.Contains(o.stderr, "stepwise demo") {
		t.Errorf("short usage shows kong's error or a command this program lacks:\n%s", o.stderr)
	}
}

// TestVersionCommand: version prints what --version prints.
func TestVersionCommand(t *testing.T) {
	t.Parallel()
	flag, cmd := cliRun(t, []string{"--version"}), cliRun(t, []string{"version"})
	if cmd.code != ExitOK || cmd.stdout != flag.stdout || !strings.HasPrefix(cmd.stdout, "stepwise ") {
		t.Fatalf("version: exit %d, %q; want exit 0 and --version's %q", cmd.code, cmd.stdout, flag.stdout)
	}
}

// TestStatusFlagsNameTheirValues: runs --status takes stale (as the API and
// the dashboard do), and a wrong value of an enumerated flag is exit 2
// naming the values, never the empty default as one of them.
func TestStatusFlagsNameTheirValues(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db, fail := filepath.Join(dir, "stepwise.db"), filepath.Join(dir, "fail")
	if err := os.WriteFile(fail, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if o := cliRun(t, []string{"--db", db, "run", "opsbatch", "-p", "key=k1", "-p", "side=" + filepath.Join(dir, "side"), "-p", "fail=" + fail, "--progress", "none"}); o.code == ExitOK {
		t.Fatalf("opsbatch with its fail file succeeded\n%s", o)
	}
	o := cliRun(t, []string{"--db", db, "runs", "--status", "stale"})
	if o.code != ExitOK || strings.Contains(o.stdout, "opsbatch/k1") {
		t.Fatalf("runs --status stale: exit %d (want 0, listing no failed run)\n%s", o.code, o)
	}
	if o := cliRun(t, []string{"--db", db, "runs", "--status", "failed"}); o.code != ExitOK || !strings.Contains(o.stdout, "opsbatch/k1") {
		t.Fatalf("runs --status failed does not list opsbatch/k1\n%s", o)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"runs", "--status", "bogus"}, "queued, running, stale, succeeded"},
		{[]string{"show", "opsbatch/k1", "--items", "bogus"}, "rejected, skipped, completed, planned"},
		{[]string{"outbox", "--status", "bogus"}, "queued, sent, dead"},
	} {
		o := cliRun(t, append([]string{"--db", db}, c.args...))
		if o.code != ExitUsage || !strings.Contains(o.stderr, c.want) || strings.Contains(o.stderr, `""`) {
			t.Errorf("%v: exit %d, want %d naming %q and never \"\"\n%s", c.args, o.code, ExitUsage, c.want, o)
		}
	}
}
