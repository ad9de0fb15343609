package cmd

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// TestOperatingRunsEndToEnd is the operator's day from the issue, on one
// database: a runner is SIGKILLed (a real process), its run is listed as
// stale, recovered and resumed to success; another run is abandoned and
// refused; a step is reset and reruns; pruned runs refuse a rerun; and
// every operation is in `show --json`'s audit with operator and reason.
func TestOperatingRunsEndToEnd(t *testing.T) {
	c := newOpsCLI(t)
	t.Setenv("STEPWISE_OPERATOR", "alice") // in-process commands only: children drop STEPWISE_ variables
	dir := filepath.Dir(c.side)
	release := filepath.Join(dir, "release")

	// A runner dies inside step/2. Its short lease lets the run be listed
	// as stale soon after.
	args := append(crashyArgs(c.db, "a", c.side, "block="+release, "block-at=2"), "--lease", "300ms")
	killed := startChild(t, nil, nil, args...)
	killed.WaitFor("step/2 started", func() bool { return readSide(t, c.side).ran["step/2"] == 1 })
	if err := killed.Kill(); err != nil {
		t.Fatal(err)
	}
	killed.WantExit(killed.Wait(), sigkilled)
	settleKilled(t, killed)
	owner := fmt.Sprintf("%s:%d", hostname(t), killed.Pid())

	// Wait out the rest of the dead runner's lease (at most 300ms).
	info, err := c.store().Run(context.Background(), "crashy/a")
	if err != nil {
		t.Fatal(err)
	}
	if r := info.Run; r.Status != checkpoint.RunRunning || checkpoint.OwnerName(r.LeaseOwner) != owner {
		t.Fatalf("after the kill: %s held by %q; want running, held by the dead %s", r.Status, r.LeaseOwner, owner)
	}
	time.Sleep(time.Until(info.Run.LeaseUntil))
	if r := c.runsJSON()["crashy/a"]; r.Status != checkpoint.RunRunning || !r.Stale || checkpoint.OwnerName(r.LeaseOwner) != owner {
		t.Errorf("runs --json: %+v; want running, stale, held by the dead %s", r, owner)
	}
	c.want(ExitOK, []string{"crashy/a", "stale (runner " + owner + " silent since"}, "runs")

	c.want(ExitOK, []string{"run crashy/a marked failed (resumable)"}, "recover", "crashy/a", "--reason", "runner was OOM-killed")
	if s := c.run("crashy/a"); s.info.Run.Status != checkpoint.RunFailed || !slices.Equal(s.attemptStatuses(), []string{checkpoint.AttemptLost}) {
		t.Fatalf("after recover: status %s, attempts %v; want failed, [lost]", s.info.Run.Status, s.attemptStatuses())
	}
	touch(t, release)
	c.want(ExitOK, []string{"run crashy/a succeeded (attempt 2): 2 steps executed, 1 skipped"}, "resume", "crashy/a")
	c.wantRan(map[string]int{"step/1": 1, "step/2": 2, "step/3": 1})

	// Another run is interrupted, then abandoned: run and resume refuse it.
	sideB := filepath.Join(dir, "b.log")
	argsB := crashyArgs(c.db, "b", sideB, "block="+filepath.Join(dir, "never"), "block-at=1")
	interruptRun(t, sideB, argsB)
	c.want(ExitOK, []string{"run crashy/b abandoned"}, "abandon", "crashy/b", "--operator", "bob", "--reason", "wrong input file")
	c.want(ExitOperator, []string{"abandoned"}, argsB[2:]...)
	c.want(ExitOperator, []string{"abandoned"}, "resume", "crashy/b")
	if s := c.run("crashy/b"); s.info.Run.Status != checkpoint.RunAbandoned || len(s.info.Attempts) != 1 {
		t.Errorf("crashy/b: status %s, %d attempts; want abandoned, 1", s.info.Run.Status, len(s.info.Attempts))
	}
	if got := readSide(t, sideB).ran; got["step/1"] != 1 || len(got) != 1 {
		t.Errorf("crashy/b's steps ran %v; want step/1 once, before the interrupt", got)
	}

	// A step is reset and runs again; the others are replayed.
	c.want(ExitOK, []string{"step step/3 of crashy/a cleared"}, "reset", "crashy/a", "--step", "step/3", "--reason", "totals were wrong")
	c.want(ExitOK, []string{"run crashy/a succeeded (attempt 3): 1 step executed, 2 skipped"}, "resume", "crashy/a")
	c.wantRan(map[string]int{"step/1": 1, "step/2": 2, "step/3": 2})

	// Prune: both finished runs become tombstones that refuse a rerun.
	c.want(ExitOK, []string{"pruned 2 runs", "crashy/a", "crashy/b"}, "prune", "--older-than", "0s", "--reason", "end of retention test")
	c.want(ExitOperator, []string{"crashy/a was pruned"}, "rerun", "crashy/a", "--force", "--reason", "try again")
	c.want(ExitOperator, []string{"pruned"}, args[2:]...)
	c.wantRan(map[string]int{"step/1": 1, "step/2": 2, "step/3": 2})

	// Every operation is audited with its operator and reason.
	type row struct{ operator, command, reason string }
	for runID, want := range map[string][]row{
		"crashy/a": {
			{"alice", "recover", "runner was OOM-killed"},
			{"alice", "reset --step step/3", "totals were wrong"},
			{"alice", "prune --older-than 0s", "end of retention test"},
		},
		"crashy/b": {
			{"bob", "abandon", "wrong input file"},
			{"alice", "prune --older-than 0s", "end of retention test"},
		},
	} {
		var got []row
		for _, a := range c.showJSON(runID).Audit {
			if a.Command == "rerun" {
				continue // the refused rerun may or may not be recorded
			}
			got = append(got, row{a.Operator, a.Command, a.Reason})
		}
		if !slices.Equal(got, want) {
			t.Errorf("show --json audit of %s = %+v; want %+v", runID, got, want)
		}
	}
}

// interruptRun runs the crashy command line args in process until step/1
// starts (side says so), then cancels it: the run ends interrupted.
func interruptRun(t *testing.T, side string, args []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	code := make(chan int, 1)
	go func() { code <- Execute(ctx, opsRegistry(), args, &stdout, &stderr) }()
	deadline := time.Now().Add(childTimeout)
	for readSide(t, side).ran["step/1"] == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the run did not start step/1")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if got := <-code; got != ExitInterrupted {
		t.Fatalf("interrupted run: exit %d; want %d\nstdout:\n%s\nstderr:\n%s", got, ExitInterrupted, stdout.String(), stderr.String())
	}
}
