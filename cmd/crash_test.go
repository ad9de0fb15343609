package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// These tests kill real runner processes (the test binary re-executed as the
// CLI, see TestMain) at every named crash point, at random moments, while
// holding a lease and with SIGTERM, then rerun and check the promise: a
// checkpointed step never runs again, an unfinished one runs again exactly
// once, recorded outputs replay byte for byte, and the run ends succeeded.

var (
	sigkilled = crashtest.Killed
	exited0   = crashtest.Code(ExitOK)
)

func hostname(t *testing.T) string {
	t.Helper()
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "localhost" // as runner.DefaultOwner
	}
	return h
}

func TestCrashPointThenRerun(t *testing.T) {
	t.Parallel()
	const n = 3
	ids := stepIDs(n)
	cases := []struct {
		name      string
		point     string
		committed int // step/1..step/committed were checkpointed before the crash
		redo      int // the step that crashed before its checkpoint (0: none)
	}{
		{"first step before checkpoint", "step:step/1:before-checkpoint", 0, 1},
		{"middle step before checkpoint", "step:step/2:before-checkpoint", 1, 2},
		{"middle step after checkpoint", "step:step/2:after-checkpoint", 2, 0},
		{"last step before checkpoint", "step:step/3:before-checkpoint", 2, 3},
		{"last step after checkpoint", "step:step/3:after-checkpoint", 3, 0},
		{"after last step before run finish", "run:before-finish", 3, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, side := testFiles(t)
			const runID = "crashy/k1"
			args := crashyArgs(db, "k1", side, "steps="+strconv.Itoa(n))

			c, got := runChild(t, []string{crashtest.CrashAt(tc.point)}, args...)
			c.WantExit(got, sigkilled)
			settleKilled(t, c)

			before := readRun(t, db, runID)
			if !before.found {
				t.Fatalf("run %s not recorded before the crash", runID)
			}
			if got := before.info.Run.Status; got != checkpoint.RunRunning {
				t.Errorf("status after crash = %q, want %q", got, checkpoint.RunRunning)
			}
			if got := before.attemptStatuses(); !slices.Equal(got, []string{"running"}) {
				t.Errorf("attempts after crash = %v, want [running]", got)
			}
			done := ids[:tc.committed]
			if got := before.completed(); !slices.Equal(got, done) {
				t.Fatalf("checkpointed after crash = %v, want %v", got, done)
			}
			if len(before.steps) != tc.committed {
				t.Errorf("%d checkpoints after crash, want %d (a step killed before its checkpoint must leave none): %v",
					len(before.steps), tc.committed, before.steps)
			}
			ranBefore := map[string]int{}
			for _, id := range done {
				ranBefore[id] = 1
			}
			if tc.redo > 0 {
				ranBefore[ids[tc.redo-1]] = 1
			}
			checkRan(t, readSide(t, side), n, ranBefore)

			c, got = runChild(t, nil, args...)
			c.WantExit(got, exited0)
			want := fmt.Sprintf("run %s succeeded (attempt 2): %s executed, %d skipped", runID, plural(n-tc.committed, "step"), tc.committed)
			if !strings.Contains(c.Stdout(), want) {
				t.Errorf("rerun stdout = %q, want it to contain %q", c.Stdout(), want)
			}

			after := readRun(t, db, runID)
			if got := after.info.Run.Status; got != checkpoint.RunSucceeded {
				t.Errorf("status after rerun = %q, want %q", got, checkpoint.RunSucceeded)
			}
			if got := after.attemptStatuses(); !slices.Equal(got, []string{checkpoint.AttemptLost, checkpoint.RunSucceeded}) {
				t.Errorf("attempts after rerun = %v, want [lost succeeded]", got)
			} else if a := after.info.Attempts[0]; !strings.Contains(a.Error, "taken over by") {
				t.Errorf("lost attempt's error = %q, want it to say who took over", a.Error)
			}
			if got := after.completed(); !slices.Equal(got, ids) {
				t.Fatalf("checkpointed after rerun = %v, want %v", got, ids)
			}
			for i, id := range ids {
				s := after.steps[id]
				if i < tc.committed {
					if !bytes.Equal(s.Output, before.steps[id].Output) || s.Attempt != 1 {
						t.Errorf("%s: output %s (attempt %d) after rerun, recorded %s (attempt 1) before: a checkpointed step changed",
							id, s.Output, s.Attempt, before.steps[id].Output)
					}
				} else if s.Attempt != 2 {
					t.Errorf("%s was checkpointed by attempt %d, want 2", id, s.Attempt)
				}
			}
			wantRan := map[string]int{}
			for _, id := range ids {
				wantRan[id] = 1
			}
			if tc.redo > 0 {
				wantRan[ids[tc.redo-1]] = 2
			}
			log := readSide(t, side)
			checkRan(t, log, n, wantRan)
			checkSaw(t, log, after)
		})
	}
}

func TestRandomKillThenRerun(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("STEPWISE_TEST_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("STEPWISE_TEST_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (reproduce with STEPWISE_TEST_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))

	const n, iterations = 12, 5
	ids := stepIDs(n)
	db, dir := testDB(t), t.TempDir()
	for it := range iterations {
		key := "r" + strconv.Itoa(it)
		runID := jobs.RunID("crashy", key)
		side := filepath.Join(dir, key+".log")
		args := crashyArgs(db, key, side, "steps="+strconv.Itoa(n), "pace=2ms")

		// Kill once a random number of steps have started, plus a random
		// fraction of a step: at startup, inside a step, around a commit.
		started := rng.IntN(n + 1)
		jitter := time.Duration(rng.IntN(3000)) * time.Microsecond
		c := startChild(t, nil, nil, args...)
		c.WaitFor(fmt.Sprintf("%d steps started", started), func() bool {
			l := readSide(t, side)
			total := 0
			for _, k := range l.ran {
				total += k
			}
			return total >= started
		})
		time.Sleep(jitter)
		c.Kill() // fails harmlessly if the child just finished
		got := c.Wait()
		if got != sigkilled && got != exited0 {
			c.WantExit(got, sigkilled)
		}
		// A checkpoint sent just before the kill may still commit: read
		// the state once the server has ended the child's sessions.
		settleKilled(t, c)

		before := readRun(t, db, runID)
		ranBefore := readSide(t, side).ran
		done := before.completed()
		t.Logf("iteration %d: killed after %d started steps + %s: %s, %d checkpointed", it, started, jitter, got, len(done))
		for _, id := range done {
			if ranBefore[id] != 1 {
				t.Errorf("iteration %d: %s checkpointed but ran %d times in one attempt", it, id, ranBefore[id])
			}
		}

		c, got = runChild(t, nil, args...)
		c.WantExit(got, exited0)
		if len(done) < n {
			want := fmt.Sprintf("%s executed, %d skipped", plural(n-len(done), "step"), len(done))
			if !strings.Contains(c.Stdout(), want) {
				t.Errorf("iteration %d: rerun stdout = %q, want it to contain %q", it, c.Stdout(), want)
			}
		}

		after := readRun(t, db, runID)
		if got := after.info.Run.Status; got != checkpoint.RunSucceeded {
			t.Errorf("iteration %d: status after rerun = %q, want succeeded", it, got)
		}
		if got := after.completed(); !slices.Equal(got, ids) {
			t.Fatalf("iteration %d: checkpointed after rerun = %v, want all of %v", it, got, ids)
		}
		// The rerun runs exactly the steps without a checkpoint, once each:
		// checkpointed steps ran once, none ran more than twice.
		wantRan := map[string]int{}
		for _, id := range ids {
			wantRan[id] = ranBefore[id]
			if !slices.Contains(done, id) {
				wantRan[id]++
			}
		}
		log := readSide(t, side)
		checkRan(t, log, n, wantRan)
		for _, id := range done {
			if !bytes.Equal(after.steps[id].Output, before.steps[id].Output) {
				t.Errorf("iteration %d: %s output changed across the rerun: %s, then %s", it, id, before.steps[id].Output, after.steps[id].Output)
			}
		}
		checkSaw(t, log, after)
		if t.Failed() {
			t.FailNow()
		}
	}
}

func TestTwoRunnersOnOneRun(t *testing.T) {
	t.Run("second is refused", func(t *testing.T) {
		db, side := testFiles(t)
		// The schema exists, as for every run but a database's first
		// (TestConcurrentFirstOpen covers that one).
		createDB(t, db)
		release := filepath.Join(filepath.Dir(side), "release")
		args := crashyArgs(db, "k", side, "block="+release, "block-at=1")
		cs, start := gatedChildren(t, 2, args, args)
		start()

		// The winner blocks inside step/1 until released, so the loser
		// meets a live lease however slowly it starts.
		var winner, loser *crashtest.Child
		deadline := time.Now().Add(childTimeout)
		for winner == nil {
			switch {
			case cs[0].Exited():
				winner, loser = cs[1], cs[0]
			case cs[1].Exited():
				winner, loser = cs[0], cs[1]
			case time.Now().After(deadline):
				t.Fatal("neither runner ended; the second should have been refused at once")
			default:
				time.Sleep(time.Millisecond)
			}
		}
		loser.WantExit(loser.Wait(), crashtest.Code(ExitHeld))
		held := fmt.Sprintf("held by %s:%d", hostname(t), winner.Pid())
		if !strings.Contains(loser.Stderr(), held) {
			t.Errorf("refused runner's stderr = %q, want it to contain %q", loser.Stderr(), held)
		}
		winner.WaitFor("step/1 started", func() bool { return readSide(t, side).ran["step/1"] == 1 })
		touch(t, release)
		winner.WantExit(winner.Wait(), exited0)

		checkRan(t, readSide(t, side), 3, map[string]int{"step/1": 1, "step/2": 1, "step/3": 1})
		s := readRun(t, db, "crashy/k")
		if got := s.attemptStatuses(); !slices.Equal(got, []string{checkpoint.RunSucceeded}) {
			t.Errorf("attempts = %v, want one, succeeded (a refused runner records no attempt)", got)
		}
	})

	t.Run("second waits", func(t *testing.T) {
		db, side := testFiles(t)
		release := filepath.Join(filepath.Dir(side), "release")
		args := crashyArgs(db, "k", side, "block="+release, "block-at=1")
		first := startChild(t, nil, nil, args...)
		first.WaitFor("step/1 started", func() bool { return readSide(t, side).ran["step/1"] == 1 })
		second := startChild(t, nil, nil, append(args, "--wait")...)
		second.WaitFor("the second runner waiting", func() bool { return strings.Contains(second.Stderr(), "waiting") })
		touch(t, release)

		first.WantExit(first.Wait(), exited0)
		second.WantExit(second.Wait(), exited0)
		if !strings.Contains(first.Stdout(), "run crashy/k succeeded (attempt 1): 3 steps executed") {
			t.Errorf("first runner's stdout = %q, want it to report the run succeeded", first.Stdout())
		}
		if !strings.Contains(second.Stdout(), "already succeeded") {
			t.Errorf("waiting runner's stdout = %q, want it to find the run already succeeded", second.Stdout())
		}
		checkRan(t, readSide(t, side), 3, map[string]int{"step/1": 1, "step/2": 1, "step/3": 1})
		s := readRun(t, db, "crashy/k")
		if got := s.attemptStatuses(); !slices.Equal(got, []string{checkpoint.RunSucceeded}) {
			t.Errorf("attempts = %v, want one, succeeded", got)
		}
	})
}

func TestKilledLeaseHolderIsTakenOver(t *testing.T) {
	t.Run("same host, process gone: at once", func(t *testing.T) {
		db, side := testFiles(t)
		release := filepath.Join(filepath.Dir(side), "release")
		args := crashyArgs(db, "k", side, "block="+release, "block-at=2")
		c := startChild(t, nil, nil, args...)
		c.WaitFor("step/2 started", func() bool { return readSide(t, side).ran["step/2"] == 1 })
		if err := c.Kill(); err != nil {
			t.Fatal(err)
		}
		c.WantExit(c.Wait(), sigkilled)
		settleKilled(t, c)

		before := readRun(t, db, "crashy/k")
		owner := fmt.Sprintf("%s:%d", hostname(t), c.Pid())
		if r := before.info.Run; r.Status != checkpoint.RunRunning || checkpoint.OwnerName(r.LeaseOwner) != owner || !time.Now().Before(r.LeaseUntil) {
			t.Fatalf("after the kill: status %q, lease %q until %s; want running, held by %s, unexpired (30s lease)",
				r.Status, r.LeaseOwner, r.LeaseUntil, owner)
		}

		// No --wait: only an immediate takeover can succeed.
		touch(t, release)
		c, got := runChild(t, nil, args...)
		c.WantExit(got, exited0)
		if !strings.Contains(c.Stderr(), "took over") || !strings.Contains(c.Stdout(), "succeeded (attempt 2)") {
			t.Errorf("rerun: stdout %q, stderr %q; want a takeover and success", c.Stdout(), c.Stderr())
		}
		after := readRun(t, db, "crashy/k")
		if got := after.attemptStatuses(); !slices.Equal(got, []string{checkpoint.AttemptLost, checkpoint.RunSucceeded}) {
			t.Fatalf("attempts = %v, want [lost succeeded]", got)
		}
		if a := after.info.Attempts[0]; checkpoint.OwnerName(a.Owner) != owner || !strings.Contains(a.Error, "taken over by") {
			t.Errorf("lost attempt: owner %q, error %q; want %s and who took over", a.Owner, a.Error, owner)
		}
		checkRan(t, readSide(t, side), 3, map[string]int{"step/1": 1, "step/2": 2, "step/3": 1})
	})

	t.Run("other host: after the lease expires", func(t *testing.T) {
		ctx := context.Background()
		db, side := testFiles(t)
		st := openStore(t, db)
		dec, err := crashyJob.Decode(map[string]string{"key": "k", "side": side, "steps": "2"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		runID := jobs.RunID("crashy", dec.RunKey)
		const foreign = "other-host.invalid:1"
		claim, err := st.Claim(ctx, checkpoint.ClaimRequest{
			RunID: runID, Job: "crashy", RunKey: dec.RunKey, Params: dec.JSON, ParamsHash: dec.Hash,
			Owner: foreign, Now: time.Now(), LeaseFor: time.Minute,
		})
		if err != nil {
			t.Fatal(err)
		}
		args := append(crashyArgs(db, "k", side, "steps=2"), "--lease", "1s")
		execute := func(args ...string) (code int, stdout, stderr string) {
			var out, errb bytes.Buffer
			code = Execute(ctx, testRegistry(), args, &out, &errb)
			return code, out.String(), errb.String()
		}

		code, _, stderr := execute(args...)
		if code != ExitHeld || !strings.Contains(stderr, "held by "+foreign) {
			t.Fatalf("run while another host holds the lease: exit %d, stderr %q; want %d naming %s", code, stderr, ExitHeld, foreign)
		}
		checkRan(t, readSide(t, side), 2, nil)

		// The foreign runner's last heartbeat let its lease run out now, and
		// it was never heard from again. (Setting the expiry through the
		// store stands in for sleeping through a lease.)
		// (A heartbeat must extend past its now on PostgreSQL.)
		expired := time.Now()
		if err := st.Heartbeat(ctx, claim.Lease, expired.Add(-time.Millisecond), expired); err != nil {
			t.Fatal(err)
		}
		code, stdout, _ := execute("--db", db, "runs", "--json")
		var runs []struct {
			ID         string `json:"id"`
			Status     string `json:"status"`
			LeaseOwner string `json:"lease_owner"`
			Stale      bool   `json:"stale"`
		}
		if err := json.Unmarshal([]byte(stdout), &runs); code != ExitOK || err != nil || len(runs) != 1 {
			t.Fatalf("runs --json: exit %d, %v, %q", code, err, stdout)
		}
		if r := runs[0]; r.ID != runID || r.Status != checkpoint.RunRunning || !r.Stale || r.LeaseOwner != foreign {
			t.Errorf("listing of the expired run = %+v; want it running, stale, owned by %s", r, foreign)
		}

		code, stdout, stderr = execute(args...)
		if code != ExitOK || !strings.Contains(stdout, "succeeded (attempt 2): 2 steps executed") || !strings.Contains(stderr, "took over") {
			t.Fatalf("run after the lease expired: exit %d, stdout %q, stderr %q; want a takeover and success", code, stdout, stderr)
		}
		info, err := st.Run(ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Attempts) != 2 || info.Attempts[0].Status != checkpoint.AttemptLost || info.Attempts[0].Owner != foreign ||
			info.Attempts[1].Status != checkpoint.RunSucceeded {
			t.Fatalf("attempts = %+v; want %s's attempt lost, then one succeeded", info.Attempts, foreign)
		}
		checkRan(t, readSide(t, side), 2, map[string]int{"step/1": 1, "step/2": 1})

		// The old runner is fenced: should it wake up, it writes nothing.
		if err := st.Heartbeat(ctx, claim.Lease, time.Now(), time.Now().Add(time.Minute)); !errors.Is(err, checkpoint.ErrFenced) {
			t.Errorf("heartbeat of the taken-over lease: %v, want ErrFenced", err)
		}
		err = st.InTx(ctx, claim.Lease, func(tx checkpoint.Tx) error {
			return tx.PutStep(checkpoint.Step{ID: "step/3", Status: checkpoint.StepCompleted, Output: []byte(`{}`),
				Tries: 1, StartedAt: time.Now(), FinishedAt: time.Now()})
		})
		if !errors.Is(err, checkpoint.ErrFenced) {
			t.Errorf("checkpoint write with the taken-over lease: %v, want ErrFenced", err)
		}
		if s := readRun(t, db, runID); len(s.steps) != 2 {
			t.Errorf("fenced write left %d checkpoints, want 2", len(s.steps))
		}
	})
}

func TestSIGTERMInterruptsResumably(t *testing.T) {
	const n = 5
	ids := stepIDs(n)

	db, side := testFiles(t)
	release := filepath.Join(filepath.Dir(side), "release")
	args := crashyArgs(db, "k", side, "steps="+strconv.Itoa(n), "block="+release, "block-at=3")
	c := startChild(t, nil, nil, args...)
	c.WaitFor("step/3 started", func() bool { return readSide(t, side).ran["step/3"] == 1 })
	if err := c.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.WantExit(c.Wait(), crashtest.Code(ExitInterrupted))
	for _, want := range []string{"run crashy/k interrupted (attempt 1): 2 steps executed", "resume it with: stepwise resume crashy/k"} {
		if !strings.Contains(c.Stdout(), want) {
			t.Errorf("interrupted runner's stdout = %q, want it to contain %q", c.Stdout(), want)
		}
	}

	before := readRun(t, db, "crashy/k")
	if got := before.info.Run.Status; got != checkpoint.RunInterrupted {
		t.Errorf("status = %q, want %q", got, checkpoint.RunInterrupted)
	}
	if got := before.attemptStatuses(); !slices.Equal(got, []string{checkpoint.RunInterrupted}) {
		t.Errorf("attempts = %v, want [interrupted]", got)
	}
	if got := before.completed(); !slices.Equal(got, ids[:2]) {
		t.Errorf("completed = %v, want %v", got, ids[:2])
	}
	if s, ok := before.steps["step/3"]; !ok || s.Status != checkpoint.StepFailed || s.Tries != 1 {
		t.Errorf("the cancelled step's checkpoint = %+v, want a failed try", s)
	}
	if _, ok := before.steps["step/4"]; ok {
		t.Error("step/4 was recorded: no step may start after the signal")
	}

	touch(t, release)
	c, got := runChild(t, nil, "--db", db, "resume", "crashy/k")
	c.WantExit(got, exited0)
	if want := "run crashy/k succeeded (attempt 2): 3 steps executed, 2 skipped"; !strings.Contains(c.Stdout(), want) {
		t.Errorf("resume stdout = %q, want it to contain %q", c.Stdout(), want)
	}
	after := readRun(t, db, "crashy/k")
	if got := after.attemptStatuses(); !slices.Equal(got, []string{checkpoint.RunInterrupted, checkpoint.RunSucceeded}) {
		t.Errorf("attempts = %v, want [interrupted succeeded]", got)
	}
	if got := after.completed(); !slices.Equal(got, ids) {
		t.Fatalf("completed = %v, want %v", got, ids)
	}
	if s := after.steps["step/3"]; s.Tries != 2 {
		t.Errorf("step/3 tries = %d, want 2", s.Tries)
	}
	for _, id := range ids[:2] {
		if !bytes.Equal(after.steps[id].Output, before.steps[id].Output) {
			t.Errorf("%s output changed across the resume: %s, then %s", id, before.steps[id].Output, after.steps[id].Output)
		}
	}
	log := readSide(t, side)
	checkRan(t, log, n, map[string]int{"step/1": 1, "step/2": 1, "step/3": 2, "step/4": 1, "step/5": 1})
	checkSaw(t, log, after)
}

// TestSIGTERMLetsTheCurrentStepFinish checks the design's promise for a
// step that does not watch its context: on SIGTERM the current step
// finishes and is checkpointed, no new step starts, and the rerun does not
// run it again.
func TestSIGTERMLetsTheCurrentStepFinish(t *testing.T) {
	const n = 4
	ids := stepIDs(n)

	db, side := testFiles(t)
	release := filepath.Join(filepath.Dir(side), "release")
	args := crashyArgs(db, "k", side, "steps="+strconv.Itoa(n), "block="+release, "block-at=2", "stubborn=true")
	c := startChild(t, nil, nil, args...)
	c.WaitFor("step/2 started", func() bool { return readSide(t, side).ran["step/2"] == 1 })
	if err := c.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.WaitFor("step/2 seeing the cancel", func() bool { return readSide(t, side).cancelled["step/2"] == 1 })
	touch(t, release)
	c.WantExit(c.Wait(), crashtest.Code(ExitInterrupted))

	before := readRun(t, db, "crashy/k")
	if got := before.completed(); !slices.Equal(got, ids[:2]) {
		t.Fatalf("completed after SIGTERM = %v, want %v: the step running at the signal finished, so its checkpoint must be kept\nstderr:\n%s",
			got, ids[:2], c.Stderr())
	}
	c, got := runChild(t, nil, args...)
	c.WantExit(got, exited0)
	log := readSide(t, side)
	checkRan(t, log, n, map[string]int{"step/1": 1, "step/2": 1, "step/3": 1, "step/4": 1})
	checkSaw(t, log, readRun(t, db, "crashy/k"))
}

// TestConcurrentFirstOpen starts several runners at the same moment on a
// database that does not exist yet: each must see the schema created once,
// and exactly one may run.
func TestConcurrentFirstOpen(t *testing.T) {
	const runners, rounds = 4, 5
	for round := range rounds {
		db, side := testFiles(t)
		release := filepath.Join(filepath.Dir(side), "release")
		args := crashyArgs(db, "k", side, "block="+release, "block-at=1")
		all := make([][]string, runners)
		for i := range all {
			all[i] = args
		}
		cs, start := gatedChildren(t, runners, all...)
		start()
		var running []*crashtest.Child
		for _, c := range cs {
			c.WaitFor("a claim", func() bool {
				return c.Exited() || strings.Contains(c.Stderr(), "run started")
			})
			if !c.Exited() || strings.Contains(c.Stderr(), "run started") {
				running = append(running, c)
				continue
			}
			c.WantExit(c.Wait(), crashtest.Code(ExitHeld))
		}
		if len(running) != 1 {
			t.Fatalf("round %d: %d runners started the run, want exactly 1", round, len(running))
		}
		touch(t, release)
		running[0].WantExit(running[0].Wait(), exited0)
		checkRan(t, readSide(t, side), 3, map[string]int{"step/1": 1, "step/2": 1, "step/3": 1})
	}
}
