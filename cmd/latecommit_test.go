package cmd

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

// TestCheckpointSentBeforeSIGKILLCommitsAfterIt is why the crash tests
// call settleKilled before they read what a killed runner left: on
// PostgreSQL a checkpoint the runner sent just before its SIGKILL is
// still committed by the server after the process is gone, so a read
// right after the kill can miss a checkpoint that the rerun then finds
// (and rightly skips the step). A lock the test holds on the run row
// keeps step/2's checkpoint waiting on the server (its fence takes the
// row FOR KEY SHARE) while the runner is killed; the read then shows no
// step/2; once the lock is released and the dead runner's session has
// ended, step/2 is checkpointed by attempt 1 and the rerun skips it.
func TestCheckpointSentBeforeSIGKILLCommitsAfterIt(t *testing.T) {
	db := pgtest.Schema(t) // about the server's sessions: PostgreSQL only
	ctx := context.Background()
	side := filepath.Join(t.TempDir(), "side.log")
	release := filepath.Join(filepath.Dir(side), "release")
	args := crashyArgs(db, "k", side, "block="+release, "block-at=2")
	c := startChild(t, nil, nil, args...)
	c.WaitFor("step/2 started", func() bool { return readSide(t, side).ran["step/2"] == 1 })

	lock, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close(ctx)
	tx, err := lock.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM runs WHERE id = $1 FOR UPDATE`, "crashy/k"); err != nil {
		t.Fatal(err)
	}
	touch(t, release)
	watch, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(ctx)
	waiting := func() int {
		var n int
		err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO steps%'`, c.SessionName()).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	c.WaitFor("step/2's checkpoint waiting on the run row's lock", func() bool { return waiting() > 0 })
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	c.WantExit(c.Wait(), sigkilled)

	// The runner is gone, its checkpoint not yet committed, its session
	// still on the server.
	if got := readRun(t, db, "crashy/k").completed(); !slices.Equal(got, []string{"step/1"}) {
		t.Fatalf("checkpointed right after the kill = %v, want [step/1]", got)
	}
	if n := waiting(); n == 0 {
		t.Fatal("the killed runner's checkpoint no longer waits on the server; want it still there, behind the lock")
	}

	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	settleKilled(t, c)
	after := readRun(t, db, "crashy/k")
	if got := after.completed(); !slices.Equal(got, []string{"step/1", "step/2"}) {
		t.Fatalf("checkpointed once the killed runner's sessions ended = %v, want [step/1 step/2]: the checkpoint it sent before the kill", got)
	}
	if a := after.steps["step/2"].Attempt; a != 1 {
		t.Errorf("step/2 checkpointed by attempt %d, want 1 (the killed runner)", a)
	}

	c, got := runChild(t, nil, args...)
	c.WantExit(got, exited0)
	if want := "1 step executed, 2 skipped"; !strings.Contains(c.Stdout(), want) {
		t.Errorf("rerun stdout = %q, want it to contain %q", c.Stdout(), want)
	}
	checkRan(t, readSide(t, side), 3, map[string]int{"step/1": 1, "step/2": 1, "step/3": 1})
}
