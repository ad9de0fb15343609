package cmd

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// gatedParams are the parameters of the gated test job.
type gatedParams struct {
	Key string `param:"key,key" help:"run key"`
}

// gated is a job whose second step stops inside its function until the
// test lets it go, so the test can take the database's write lock from
// another connection exactly before that step's checkpoint commits.
type gated struct {
	entered chan struct{} // receives when the second step's function starts
	proceed chan struct{} // closed to let it return
	ran     atomic.Int32  // how often the second step's function ran
	input   atomic.Int32  // the first step's input (steps.Input)
	fail    atomic.Bool   // makes the second step fail
}

func newGated() *gated {
	return &gated{entered: make(chan struct{}, 4), proceed: make(chan struct{})}
}

func (g *gated) registry() *jobs.Registry {
	var reg jobs.Registry
	reg.MustRegister(jobs.Define("gated", func(ctx context.Context, run *steps.Run, p gatedParams) error {
		if _, err := steps.Do(ctx, run, "first", func(ctx context.Context) (int, error) { return 1, nil },
			steps.Input(g.input.Load())); err != nil {
			return err
		}
		_, err := steps.Do(ctx, run, "second", func(ctx context.Context) (int, error) {
			g.ran.Add(1)
			g.entered <- struct{}{}
			<-g.proceed
			if g.fail.Load() {
				return 0, steps.Permanent(errors.New("second: payee unknown"))
			}
			return 2, nil
		})
		return err
	}, jobs.Help("test job: its second step waits for the test")))
	return &reg
}

func (g *gated) exec(db string, args ...string) opsOut {
	args = append([]string{"--db", db}, args...)
	var out, errb syncBuffer
	code := Execute(context.Background(), g.registry(), args, &out, &errb)
	return opsOut{args: args, code: code, stdout: out.String(), stderr: errb.String()}
}

// startGated runs the gated job in the background and returns once its
// second step is inside its function, the first one checkpointed.
func startGated(t *testing.T, g *gated, db string, args ...string) <-chan opsOut {
	t.Helper()
	done := make(chan opsOut, 1)
	go func() {
		done <- g.exec(db, append([]string{"--busy-timeout", "100ms", "run", "gated", "-p", "key=k"}, args...)...)
	}()
	select {
	case <-g.entered:
	case o := <-done:
		t.Fatalf("the run ended before its second step:\n%s", o)
	case <-time.After(30 * time.Second):
		t.Fatal("the second step did not start within 30s")
	}
	return done
}

// A lock taken mid-run, without --wait: the run fails with the write's own
// error (which step could not be checkpointed), says its end could not be
// recorded either, exits 4 with a hint to add --wait, and a resume finishes
// it without running the first step again.
func TestLockMidRunWithoutWait(t *testing.T) {
	t.Parallel()
	db := sqliteDB(t) // about SQLite's write lock
	g := newGated()
	// A short lease: in this one process the runner's PID stays alive, so
	// the resume takes the run over when the lease expires (a real
	// process would be gone, and taken over at once). Not too short: the
	// held lock blocks the heartbeats too, and the runner fences itself a
	// third of the lease before it ends (with 300ms, 200ms in: under load
	// sooner than the checkpoint write gives up on its 100ms busy
	// timeout, and the run then reports its lease lost, not the lock).
	done := startGated(t, g, db, "--lease", "3s")
	release := holdWriteLock(t, db)
	close(g.proceed)
	var o opsOut
	select {
	case o = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the run without --wait did not give up on the lock within 30s")
	}
	if o.code != ExitHeld {
		t.Fatalf("exit %d; want %d (locked)\n%s", o.code, ExitHeld, o)
	}
	for _, s := range []string{
		"run gated/k failed: checkpoint step second", // the real error, not only the end's (no Go package prefix)
		"database is locked",
		"its end (failed) could not be recorded",
		"add --wait to wait for it",
	} {
		if !strings.Contains(o.stderr, s) {
			t.Errorf("stderr does not say %q\n%s", s, o)
		}
	}
	release()
	for deadline := time.Now().Add(30 * time.Second); ; { // the lease runs out first
		o = g.exec(db, "resume", "gated/k")
		if o.code != ExitHeld || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if o.code != ExitOK || !strings.Contains(o.stdout, "run gated/k succeeded (attempt 2): 1 step executed, 1 skipped") {
		t.Errorf("resume after the lock: exit %d; want 0, the second step run again and the first skipped\n%s", o.code, o)
	}
	if n := g.ran.Load(); n != 2 {
		t.Errorf("second step's function ran %d times; want 2 (its checkpoint never committed the first time)", n)
	}
}

// A lock taken mid-run, with --wait: the step's checkpoint write waits for
// it (well past the busy timeout) and the run succeeds once it is
// released, each step run once.
func TestLockMidRunWithWait(t *testing.T) {
	t.Parallel()
	db := sqliteDB(t) // about SQLite's write lock
	g := newGated()
	done := startGated(t, g, db, "--wait")
	release := holdWriteLock(t, db)
	close(g.proceed)
	select {
	case o := <-done:
		t.Fatalf("--wait gave up on a lock taken mid-run:\n%s", o)
	case <-time.After(time.Second): // ten busy timeouts
	}
	release()
	select {
	case o := <-done:
		if o.code != ExitOK || !strings.Contains(o.stdout, "run gated/k succeeded (attempt 1): 2 steps executed") ||
			!strings.Contains(o.stderr, "database locked by another process; waiting for it") {
			t.Errorf("exit %d; want 0, the run succeeded after logging its wait\n%s", o.code, o)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the --wait run did not finish 30s after the lock was released")
	}
	if n := g.ran.Load(); n != 1 {
		t.Errorf("second step's function ran %d times; want 1", n)
	}
}

// A command without --wait is not told to add it.
func TestLockedHintWithoutWaitFlag(t *testing.T) {
	t.Parallel()
	c := newSQLiteOpsCLI(t) // about SQLite's write lock
	c.runCrashy("h")
	holdWriteLock(t, c.db)
	o := c.want(ExitHeld, []string{"database is locked", "--busy-timeout"},
		"--busy-timeout", "100ms", "abandon", "crashy/h", "--reason", "x")
	if strings.Contains(o.stderr, "--wait") {
		t.Errorf("abandon has no --wait, yet the hint names it\n%s", o)
	}
}

// Opening a database whose schema must be set up (a ledger file, or any
// database a newer binary migrates) while another process holds its write
// lock gives up after about the busy timeout, not one busy timeout per
// retry (200ms took 4s; the default 5s took 42 minutes).
func TestOpenLockedNewSchemaWaitsOneBusyTimeout(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "t.db") // about SQLite's busy timeout
	conn, err := sql.Open("sqlite", "file:"+db+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(`CREATE TABLE ledger (account TEXT PRIMARY KEY, balance INTEGER)`); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	holdWriteLock(t, db)
	// A busy timeout of 500ms: one busy timeout per retry (the old bug,
	// 4s at 200ms) would take some 10s; giving up within 4s leaves a
	// loaded machine 3.5s of slack and still tells the two apart.
	start := time.Now()
	o := (&opsCLI{t: t, db: db}).exec("--busy-timeout", "500ms", "runs")
	took := time.Since(start)
	if o.code != ExitHeld || !strings.Contains(o.stderr, "database is locked") || !strings.Contains(o.stderr, "busy timeout 500ms") {
		t.Errorf("exit %d; want %d naming the lock and its busy timeout\n%s", o.code, ExitHeld, o)
	}
	if took > 4*time.Second {
		t.Errorf("gave up after %s; want about the 500ms busy timeout, not one per retry", took)
	}
}

// A run stopped by a step that changed since it ran (exit 5) is reported
// as stopped for an operator decision, not as failed; and abandoning a
// succeeded run is refused with exit 5, the run still succeeded.
func TestOperatorStopsAreNotFailures(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	g := newGated()
	close(g.proceed)
	g.fail.Store(true)
	if o := g.exec(db, "run", "gated", "-p", "key=k"); o.code != ExitFailed || !strings.Contains(o.stdout, "run gated/k failed (attempt 1)") {
		t.Fatalf("exit %d; want %d, failed\n%s", o.code, ExitFailed, o)
	}
	g.input.Store(2) // the first step's input changes
	o := g.exec(db, "resume", "gated/k")
	if o.code != ExitOperator || !strings.Contains(o.stdout, "run gated/k stopped for an operator decision (attempt 2)") ||
		strings.Contains(o.stdout, "failed") {
		t.Errorf("exit %d; want %d, the run stopped for an operator decision\n%s", o.code, ExitOperator, o)
	}

	g.input.Store(0)
	g.fail.Store(false)
	if o := g.exec(db, "run", "gated", "-p", "key=s"); o.code != ExitOK {
		t.Fatalf("exit %d\n%s", o.code, o)
	}
	o = g.exec(db, "abandon", "gated/s", "--reason", "oops")
	if o.code != ExitOperator || !strings.Contains(o.stderr, "a succeeded run is not abandoned") || strings.Contains(o.stderr, "--force") {
		t.Errorf("abandon of a succeeded run: exit %d; want %d, refused without a --force hint\n%s", o.code, ExitOperator, o)
	}
	if o := g.exec(db, "runs", "--json"); !strings.Contains(o.stdout, `"succeeded"`) || strings.Contains(o.stdout, `"abandoned"`) {
		t.Errorf("after the refused abandon the run is not succeeded:\n%s", o)
	}
}

// A dry run is refused where the real run would be: parameters other than
// the stored ones (exit 2), and bad parameters, without printing a dry run
// of no run first.
func TestDryRunRefusedLikeTheRun(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	c.runCrashy("d")
	o := c.want(ExitUsage, []string{"crashy/d was started with parameters"},
		"run", "crashy", "-p", "key=d", "-p", "side="+c.side+".other", "--dry-run")
	if strings.Contains(o.stdout, "would run") {
		t.Errorf("the refused dry run printed a plan\n%s", o)
	}
	o = c.want(ExitUsage, nil, "run", "crashy", "-p", "key=d", "-p", "side="+c.side, "-p", "nope=1", "--dry-run")
	if o.stdout != "" {
		t.Errorf("a dry run with a bad parameter printed %q before its error", o.stdout)
	}
	c.want(ExitOK, []string{"dry run of crashy/d", "0 steps would run"}, "run", "crashy", "-p", "key=d", "-p", "side="+c.side, "--dry-run")
	// A pruned run cannot run again: its dry run is refused the same way.
	c.want(ExitOK, nil, "prune", "--older-than", "0s", "--reason", "drill")
	o = c.want(ExitOperator, []string{"pruned"}, "run", "crashy", "-p", "key=d", "-p", "side="+c.side, "--dry-run")
	if strings.Contains(o.stdout, "would run") {
		t.Errorf("the dry run of a pruned run printed a plan\n%s", o)
	}
}
