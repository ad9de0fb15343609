package cmd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint/stores"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

type reportParams struct {
	Key string `param:"key,key" help:"run key"`
	Out string `param:"out" format:"path" help:"file the report line is appended to"`
}

// reportRegistry has report: one step appending "report KEY" to out.
func reportRegistry() *jobs.Registry {
	return oneJob("report", func(ctx context.Context, run *steps.Run, p reportParams) error {
		_, err := steps.Do(ctx, run, "write", func(ctx context.Context) (string, error) {
			return p.Out, appendLine(p.Out, "report "+p.Key)
		})
		return err
	})
}

func execTargets(t *testing.T, args ...string) (int, string) {
	t.Helper()
	return execWith(t, reportRegistry(), args...)
}

// execWith runs the command line args of a program with reg's jobs and
// returns its exit code and output (stdout, then stderr). A serve or
// worker that should have refused its flags stops anyway, after 5s.
func execWith(t *testing.T, reg *jobs.Registry, args ...string) (int, string) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	code := Execute(ctx, reg, args, &out, &errb, Schedules())
	return code, out.String() + errb.String()
}

// run, resume and rerun resolve the target names a run stores (the
// API's runs) from their own --target and --targets, as serve and worker
// do: a run naming one they do not configure fails naming it.
func TestRunResolvesTargetNames(t *testing.T) {
	db := testDB(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "report.txt")

	code, text := execTargets(t, "--db", db, "run", "report", "-p", "key=a", "-p", "out=target:report")
	if code != ExitFailed || !strings.Contains(text, `target "report"`) || !strings.Contains(text, "none are configured") {
		t.Fatalf("a run naming an unconfigured target: exit %d\n%s\nwant %d naming the target", code, text, ExitFailed)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("the refused run wrote its file")
	}

	// A targets file, owner-only, its relative path against its directory.
	file := filepath.Join(dir, "targets")
	if err := os.WriteFile(file, []byte("# where reports go\nreport = report.txt\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, text = execTargets(t, "--db", db, "resume", "report/a", "--targets", file)
	if code != ExitOK {
		t.Fatalf("resume with --targets: exit %d\n%s", code, text)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "report a\n" {
		t.Fatalf("the report file holds %q (%v); want the run's line", b, err)
	}
	st, err := stores.Open(context.Background(), db, stores.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	info, err := st.Run(context.Background(), "report/a")
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"key":"a","out":"target:report"}`; string(info.Run.Params) != want {
		t.Errorf("the run stores %s; want %s", info.Run.Params, want)
	}

	// --target as well; a shell path still works as before.
	other := filepath.Join(dir, "other.txt")
	if code, text := execTargets(t, "--db", db, "run", "report", "-p", "key=b", "-p", "out=target:report", "--target", "report="+other); code != ExitOK {
		t.Fatalf("run with --target: exit %d\n%s", code, text)
	}
	if code, text := execTargets(t, "--db", db, "run", "report", "-p", "key=c", "-p", "out="+other); code != ExitOK {
		t.Fatalf("run with a path: exit %d\n%s", code, text)
	}
	if b, _ := os.ReadFile(other); string(b) != "report b\nreport c\n" {
		t.Errorf("the other file holds %q; want runs b and c", b)
	}
}

// Bad targets are usage errors naming what to fix: a targets file others
// may read, a password on the command line, a malformed line; and neither
// shows the password.
func TestTargetFlagsRefuseBadTargets(t *testing.T) {
	db := testDB(t)
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	if err := os.WriteFile(open, []byte("ledger=postgres://app:s3cret@127.0.0.1:5432/ledger\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dup := filepath.Join(dir, "dup")
	if err := os.WriteFile(dup, []byte("ledger=/srv/a.db\n\nledger=/srv/b.db\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"worker", "--targets", open}, "chmod 600 " + open},
		{[]string{"serve", "--targets", open}, "mode 0644"},
		{[]string{"worker", "--target", "ledger=postgres://app:s3cret@127.0.0.1:5432/ledger"}, "holds a password"},
		{[]string{"worker", "--target", "ledger"}, "write NAME=LOCATION"},
		{[]string{"worker", "--target", "Ledger=/srv/a.db"}, `target name "Ledger"`},
		{[]string{"worker", "--target", "ledger=mysql://h/db"}, "give a postgres:// URL or an absolute file path"},
		{[]string{"worker", "--targets", dup}, "line 3: target ledger is configured twice"},
	} {
		code, text := execTargets(t, append([]string{"--db", db}, c.args...)...)
		if code != ExitUsage || !strings.Contains(text, c.want) {
			t.Errorf("%v: exit %d\n%s\nwant %d saying %q", c.args, code, text, ExitUsage, c.want)
		}
		if strings.Contains(text, "s3cret") {
			t.Errorf("%v: the error shows the password:\n%s", c.args, text)
		}
	}
}

func TestTargetFlagsHelp(t *testing.T) {
	for _, cmd := range []string{"serve", "worker", "run", "resume", "rerun", "backfill"} {
		code, text := execTargets(t, cmd, "--help")
		text = oneLine(text)
		if code != ExitOK || !strings.Contains(text, "--target=NAME=LOCATION") || !strings.Contains(text, "--targets=FILE") ||
			!strings.Contains(text, "chmod 600") {
			t.Errorf("%s --help: exit %d; want --target and --targets explained:\n%s", cmd, code, text)
		}
	}
}
