package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/mattn/go-isatty"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// These tests drive the operating commands (recover, rerun, reset, abandon,
// prune, runs, show) through Execute, in process, and check both what the
// command printed and exited with and what the store holds afterwards.

// opsForeign owns the leases of runners on another host: never taken over
// before their lease expires.
const opsForeign = "otherhost:1"

// opsLedgerParams are the parameters of the opsledger test job.
type opsLedgerParams struct {
	Key  string `param:"key,key" help:"run key; the account credited is acct:KEY"`
	Side string `param:"side,required" help:"side-effect log file"`
}

// opsLedgerCredit is what the credit step adds to acct:KEY.
const opsLedgerCredit = 10

// opsLedgerJob has an effect: load, then credit (adds 10 to acct:KEY in
// the built-in state table, applied once), then report. Each step logs
// "ran STEP" to the side file.
var opsLedgerJob = jobs.Define("opsledger", func(ctx context.Context, run *steps.Run, p opsLedgerParams) error {
	if _, err := steps.Do(ctx, run, "load", func(ctx context.Context) (int, error) {
		return opsLedgerCredit, appendLine(p.Side, sideRan+" load")
	}); err != nil {
		return err
	}
	if _, err := steps.Apply(ctx, run, "credit", steps.State, func(ctx context.Context, e *steps.Effects) (string, error) {
		e.Add("acct:"+p.Key, opsLedgerCredit)
		return "credited", appendLine(p.Side, sideRan+" credit")
	}); err != nil {
		return err
	}
	_, err := steps.Do(ctx, run, "report", func(ctx context.Context) (string, error) {
		return "done", appendLine(p.Side, sideRan+" report")
	})
	return err
}, jobs.Help("test job: a step with an effect between two without"))

// opsBatchParams are the parameters of the opsbatch test job.
type opsBatchParams struct {
	Key  string `param:"key,key" help:"run key; the account paid is acct:KEY"`
	Side string `param:"side,required" help:"side-effect log file"`
	// Fail names a file: while it exists, item 3 fails (and so the step).
	Fail string `param:"fail" help:"file whose existence fails item 3"`
}

// opsBatchJob is a batch step with effects: items 1 to 4 each add 1 to
// acct:KEY in the built-in state table, a chunk of one item at a time, and
// log "ran pay/ITEM".
var opsBatchJob = jobs.Define("opsbatch", func(ctx context.Context, run *steps.Run, p opsBatchParams) error {
	items := []string{"1", "2", "3", "4"}
	_, err := steps.ForEach(ctx, run, "pay", steps.Slice(items, func(it string) string { return it }),
		func(ctx context.Context, it string, e *steps.Effects) (string, error) {
			if _, err := os.Stat(p.Fail); it == "3" && err == nil {
				return "", errors.New("item 3: payee unknown")
			}
			e.Add("acct:"+p.Key, 1)
			return it, appendLine(p.Side, sideRan+" pay/"+it)
		}, steps.ChunkSize(1), steps.WithTarget(steps.State))
	return err
}, jobs.Help("test job: a batch step whose items have effects"))

// opsRegistry has the crash tests' crashy job, opsledger, opsbatch and the
// backfill tests' opsdaily.
func opsRegistry() *jobs.Registry {
	var reg jobs.Registry
	reg.MustRegister(crashyJob, opsLedgerJob, opsBatchJob, opsDailyJob, opsStopJob, opsRejectJob)
	return &reg
}

// opsCLI runs the stepwise command line in process on one database.
type opsCLI struct {
	t        *testing.T
	db, side string
	st       checkpoint.Backend
}

// newOpsCLI returns an opsCLI on a fresh store of the selected kind (see
// testDB), its tables created.
func newOpsCLI(t *testing.T) *opsCLI {
	t.Helper()
	db, side := testFiles(t)
	createDB(t, db)
	return &opsCLI{t: t, db: db, side: side}
}

// newSQLiteOpsCLI is newOpsCLI on a SQLite file whatever the selected
// store, for tests about SQLite's locks and files.
func newSQLiteOpsCLI(t *testing.T) *opsCLI {
	t.Helper()
	db, side := sqliteFiles(t)
	createDB(t, db)
	return &opsCLI{t: t, db: db, side: side}
}

// opsOut is what one command did.
type opsOut struct {
	args           []string
	code           int
	stdout, stderr string
}

func (o opsOut) String() string {
	return "stepwise " + strings.Join(o.args, " ") + "\nstdout:\n" + o.stdout + "stderr:\n" + o.stderr
}

// exec runs the command line args after --db. (The writers are safe for
// concurrent use: see TestBackfillParallelOnPlainWriters for why.)
func (c *opsCLI) exec(args ...string) opsOut {
	c.t.Helper()
	args = append([]string{"--db", c.db}, args...)
	var out, errb syncBuffer
	code := Execute(context.Background(), opsRegistry(), args, &out, &errb)
	return opsOut{args: args, code: code, stdout: out.String(), stderr: errb.String()}
}

// want runs args and fails the test unless it exits with code and prints
// every one of the texts (on stdout or stderr).
func (c *opsCLI) want(code int, texts []string, args ...string) opsOut {
	c.t.Helper()
	o := c.exec(args...)
	if o.code != code {
		c.t.Fatalf("exit %d; want %d\n%s", o.code, code, o)
	}
	for _, s := range texts {
		if !strings.Contains(o.stdout+o.stderr, s) {
			c.t.Errorf("output does not say %q\n%s", s, o)
		}
	}
	return o
}

// runCrashy runs the crashy job with key to success (steps: 3).
func (c *opsCLI) runCrashy(key string) {
	c.t.Helper()
	c.want(ExitOK, []string{"run crashy/" + key + " succeeded"}, crashyArgs(c.db, key, c.side)[2:]...)
}

// store is a store on the database, open for the rest of the test.
func (c *opsCLI) store() checkpoint.Backend {
	if c.st == nil {
		c.st = openStore(c.t, c.db)
	}
	return c.st
}

func (c *opsCLI) run(runID string) runState { c.t.Helper(); return readRun(c.t, c.db, runID) }

func (c *opsCLI) audits(runID string) []checkpoint.Audit {
	c.t.Helper()
	as, err := c.store().Audits(context.Background(), runID)
	if err != nil {
		c.t.Fatal(err)
	}
	return as
}

// wantAudits fails unless the run's audit log holds these commands, in
// order, each with an operator.
func (c *opsCLI) wantAudits(runID string, commands ...string) []checkpoint.Audit {
	c.t.Helper()
	as := c.audits(runID)
	var got []string
	for _, a := range as {
		got = append(got, a.Command)
		if a.Operator == "" || a.At.IsZero() {
			c.t.Errorf("audit row without operator or time: %+v", a)
		}
	}
	if !slices.Equal(got, commands) {
		c.t.Errorf("audit of %s = %q; want %q", runID, got, commands)
	}
	return as
}

// claimCrashy claims the crashy run with key as opsForeign at now for
// lease, as a runner on another host would: with now an hour ago it is
// stale at once, with now now it is live.
func (c *opsCLI) claimCrashy(key string, now time.Time, lease time.Duration) checkpoint.Lease {
	c.t.Helper()
	return c.claimJob(crashyJob, map[string]string{"key": key, "side": c.side}, now, lease)
}

// claimJob claims the run of job with values as opsForeign at now.
func (c *opsCLI) claimJob(job jobs.Job, values map[string]string, now time.Time, lease time.Duration) checkpoint.Lease {
	c.t.Helper()
	dec, err := job.Decode(values, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	claim, err := c.store().Claim(context.Background(), checkpoint.ClaimRequest{
		RunID: jobs.RunID(job.Name(), dec.RunKey), Job: job.Name(), RunKey: dec.RunKey, Params: dec.JSON, ParamsHash: dec.Hash,
		Owner: opsForeign, Now: now, LeaseFor: lease,
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return claim.Lease
}

func (c *opsCLI) staleCrashy(key string) checkpoint.Lease {
	return c.claimCrashy(key, time.Now().Add(-time.Hour), time.Minute)
}

func (c *opsCLI) liveCrashy(key string) checkpoint.Lease {
	return c.claimCrashy(key, time.Now(), time.Hour)
}

// ran counts each step's executions in the side file.
func (c *opsCLI) ran() map[string]int { c.t.Helper(); return readSide(c.t, c.side).ran }

func (c *opsCLI) wantRan(want map[string]int) {
	c.t.Helper()
	got := c.ran()
	for id, n := range want {
		if got[id] != n {
			c.t.Errorf("%s ran %d times; want %d (all: %v)", id, got[id], n, got)
		}
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			c.t.Errorf("%s ran; want it not run (all: %v)", id, got)
		}
	}
}

// stateValue is key's value in the built-in state table.
func (c *opsCLI) stateValue(key string) int64 {
	c.t.Helper()
	s := stateIn(c.t, c.store(), key)
	if !s.Exists {
		c.t.Fatalf("state key %s does not exist", key)
	}
	return s.Value
}

// opsShowJSON is the part of `show --json` these tests read: the
// documented field names.
type opsShowJSON struct {
	Run struct {
		ID         string `json:"id"`
		Status     string `json:"status"`
		Stale      bool   `json:"stale"`
		LeaseOwner string `json:"lease_owner"`
		Fence      int64  `json:"fence"`
	} `json:"run"`
	Steps []struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	} `json:"steps"`
	Audit []struct {
		RunID    string    `json:"run_id"`
		At       time.Time `json:"at"`
		Operator string    `json:"operator"`
		Command  string    `json:"command"`
		Reason   string    `json:"reason"`
		Details  string    `json:"details"`
	} `json:"audit"`
}

func (c *opsCLI) showJSON(runID string) opsShowJSON {
	c.t.Helper()
	o := c.want(ExitOK, nil, "show", runID, "--json")
	var v opsShowJSON
	if err := json.Unmarshal([]byte(o.stdout), &v); err != nil {
		c.t.Fatalf("show --json: %v\n%s", err, o)
	}
	if !strings.Contains(o.stdout, `"audit": [`) {
		c.t.Errorf("show --json has no audit array\n%s", o)
	}
	return v
}

// opsRunsJSON is one entry of `runs --json`.
type opsRunsJSON struct {
	ID         string `json:"id"`
	Status     string `json:"status"`
	Stale      bool   `json:"stale"`
	LeaseOwner string `json:"lease_owner"`
}

func (c *opsCLI) runsJSON() map[string]opsRunsJSON {
	c.t.Helper()
	o := c.want(ExitOK, nil, "runs", "--json")
	var rs []opsRunsJSON
	if err := json.Unmarshal([]byte(o.stdout), &rs); err != nil {
		c.t.Fatalf("runs --json: %v\n%s", err, o)
	}
	m := map[string]opsRunsJSON{}
	for _, r := range rs {
		m[r.ID] = r
	}
	return m
}

func TestRecoverCommand(t *testing.T) {
	t.Parallel()
	t.Run("stale run", func(t *testing.T) {
		c := newOpsCLI(t)
		old := c.staleCrashy("s")
		c.want(ExitOK, []string{"run crashy/s marked failed (resumable)", "stepwise resume crashy/s"},
			"recover", "crashy/s", "--operator", "alice", "--reason", "otherhost died")

		s := c.run("crashy/s")
		if r := s.info.Run; r.Status != checkpoint.RunFailed || r.Fence != old.Fence+1 || r.LeaseOwner != "" ||
			!strings.Contains(r.Error, "recovered by alice: otherhost died") {
			t.Errorf("recovered run = %+v; want failed, fence %d, no lease, error with operator and reason", r, old.Fence+1)
		}
		if got := s.attemptStatuses(); !slices.Equal(got, []string{checkpoint.AttemptLost}) {
			t.Errorf("attempts = %v; want the dead runner's marked lost", got)
		}
		if as := c.wantAudits("crashy/s", "recover"); len(as) == 1 && (as[0].Operator != "alice" || as[0].Reason != "otherhost died") {
			t.Errorf("audit = %+v; want alice, \"otherhost died\"", as[0])
		}
		// The dead runner is fenced out.
		err := c.store().InTx(context.Background(), old, func(tx checkpoint.Tx) error {
			return tx.PutStep(checkpoint.Step{ID: "step/1", Status: checkpoint.StepCompleted, Output: []byte(`{}`), Tries: 1,
				StartedAt: time.Now(), FinishedAt: time.Now()})
		})
		if !errors.Is(err, checkpoint.ErrFenced) {
			t.Errorf("checkpoint write with the recovered lease: %v; want ErrFenced", err)
		}

		c.want(ExitOK, []string{"run crashy/s succeeded (attempt 2): 3 steps executed"}, "resume", "crashy/s")
		c.wantRan(map[string]int{"step/1": 1, "step/2": 1, "step/3": 1})
	})

	t.Run("live run is held, --force recovers it", func(t *testing.T) {
		c := newOpsCLI(t)
		l := c.liveCrashy("l")
		// A live runner holds it: exit 4, as abandon and reset give.
		c.want(ExitHeld, []string{"held by " + opsForeign, "recover --force"}, "recover", "crashy/l", "--operator", "alice")
		if r := c.run("crashy/l").info.Run; r.Status != checkpoint.RunRunning || r.Fence != l.Fence || r.LeaseOwner != opsForeign {
			t.Errorf("refused recover changed the run: %+v", r)
		}
		c.wantAudits("crashy/l")

		c.want(ExitOK, []string{"marked failed"}, "recover", "crashy/l", "--operator", "alice", "--force")
		if r := c.run("crashy/l").info.Run; r.Status != checkpoint.RunFailed || r.Fence != l.Fence+1 {
			t.Errorf("forced recover: run %+v; want failed at fence %d", r, l.Fence+1)
		}
		if as := c.wantAudits("crashy/l", "recover"); len(as) == 1 && as[0].Reason != "runner gone" {
			t.Errorf("audit reason = %q; want the default, \"runner gone\"", as[0].Reason)
		}
	})

	t.Run("not running", func(t *testing.T) {
		c := newOpsCLI(t)
		c.runCrashy("done")
		for _, force := range []bool{false, true} {
			args := []string{"recover", "crashy/done", "--operator", "alice"}
			if force {
				args = append(args, "--force")
			}
			c.want(ExitOperator, []string{"succeeded, not running; nothing to recover"}, args...)
		}
		if r := c.run("crashy/done").info.Run; r.Status != checkpoint.RunSucceeded || r.Fence != 1 {
			t.Errorf("refused recover changed the run: %+v", r)
		}
		c.wantAudits("crashy/done")
	})

	t.Run("unknown run", func(t *testing.T) {
		c := newOpsCLI(t)
		c.want(ExitUsage, []string{`no run "crashy/nope"`}, "recover", "crashy/nope")
	})
}

func TestRerunCommand(t *testing.T) {
	t.Parallel()
	t.Run("succeeded run, from the top", func(t *testing.T) {
		c := newOpsCLI(t)
		c.runCrashy("k")
		o := c.want(ExitOperator, []string{"succeeded", "rerun --force", "skipping every checkpointed step", "--from-step STEP"},
			"rerun", "crashy/k", "--operator", "alice")
		if o.stdout != "" {
			t.Errorf("refused rerun printed on stdout: %q", o.stdout)
		}
		if s := c.run("crashy/k"); len(s.info.Attempts) != 1 || s.info.Run.Status != checkpoint.RunSucceeded {
			t.Errorf("refused rerun changed the run: %+v", s.info)
		}
		c.wantAudits("crashy/k")

		c.want(ExitOK, []string{"run crashy/k succeeded (attempt 2): 0 steps executed, 3 skipped"},
			"rerun", "crashy/k", "--force", "--operator", "alice", "--reason", "check the replay")
		c.wantRan(map[string]int{"step/1": 1, "step/2": 1, "step/3": 1})
		if as := c.wantAudits("crashy/k", "rerun"); len(as) == 1 && (as[0].Operator != "alice" || as[0].Reason != "check the replay") {
			t.Errorf("audit = %+v; want alice and the reason", as[0])
		}
	})

	t.Run("from a step", func(t *testing.T) {
		c := newOpsCLI(t)
		c.runCrashy("k")
		before := c.run("crashy/k")

		o := c.want(ExitUsage, []string{"clears 2 checkpoints: step/2, step/3", "needs --reason"},
			"rerun", "crashy/k", "--from-step", "step/2", "--operator", "alice")
		if strings.Contains(o.stdout, "effects already applied") {
			t.Errorf("rerun of a job without effects lists applied effects\n%s", o)
		}
		after := c.run("crashy/k")
		if got := after.completed(); !slices.Equal(got, stepIDs(3)) || after.info.Run.Fence != before.info.Run.Fence ||
			after.info.Run.Status != checkpoint.RunSucceeded {
			t.Errorf("rerun without --reason changed the run: completed %v, %+v", got, after.info.Run)
		}
		c.wantAudits("crashy/k")

		c.want(ExitOK, []string{"clears 2 checkpoints: step/2, step/3", "run crashy/k succeeded (attempt 2): 2 steps executed, 1 skipped"},
			"rerun", "crashy/k", "--from-step", "step/2", "--operator", "alice", "--reason", "step 2 had a bug")
		c.wantRan(map[string]int{"step/1": 1, "step/2": 2, "step/3": 2})
		after = c.run("crashy/k")
		if !bytes.Equal(after.steps["step/1"].Output, before.steps["step/1"].Output) {
			t.Errorf("step/1 changed: %s, then %s", before.steps["step/1"].Output, after.steps["step/1"].Output)
		}
		for _, id := range []string{"step/2", "step/3"} {
			if after.steps[id].Attempt != 2 {
				t.Errorf("%s checkpointed by attempt %d; want 2 (rerun)", id, after.steps[id].Attempt)
			}
		}
		as := c.wantAudits("crashy/k", "rerun --from-step step/2")
		if len(as) == 1 && (as[0].Operator != "alice" || as[0].Reason != "step 2 had a bug" || as[0].Details != "cleared step/2, step/3") {
			t.Errorf("audit = %+v; want alice, the reason, and what was cleared", as[0])
		}
	})

	t.Run("from a step, by start order, listing applied effects", func(t *testing.T) {
		// opsledger's steps in ID order are credit, load, report; in start
		// order load, credit, report. From credit clears credit and report.
		c := newOpsCLI(t)
		c.want(ExitOK, nil, "run", "opsledger", "-p", "key=b", "-p", "side="+c.side)
		effect := "credit: stepwise_state acct:b 0 -> 10 (+10)"
		// Refused without --force, with or without a reason, naming how
		// many effects apply again and their amounts; nothing changes.
		for _, args := range [][]string{
			{"rerun", "opsledger/b", "--from-step", "credit"},
			{"rerun", "opsledger/b", "--from-step", "credit", "--reason", "credit again", "--operator", "alice"},
		} {
			o := c.want(ExitOperator, []string{"clears 2 checkpoints: credit, report", "already applied and NOT undone by clearing: 1 effect;",
				effect, "--force"}, args...)
			if o.stdout != "" {
				t.Errorf("refused rerun printed on stdout: %q", o.stdout)
			}
		}
		c.wantRan(map[string]int{"load": 1, "credit": 1, "report": 1})
		c.wantAudits("opsledger/b")
		if v := c.stateValue("acct:b"); v != opsLedgerCredit {
			t.Errorf("acct:b = %d after refused reruns; want %d", v, opsLedgerCredit)
		}

		c.want(ExitOK, []string{"clears 2 checkpoints: credit, report", effect, "2 steps executed, 1 skipped"},
			"rerun", "opsledger/b", "--from-step", "credit", "--reason", "credit again", "--operator", "alice", "--force")
		c.wantRan(map[string]int{"load": 1, "credit": 2, "report": 2})
		if v := c.stateValue("acct:b"); v != 2*opsLedgerCredit {
			t.Errorf("acct:b = %d; want %d: the kept effect stays and the rerun step applies again", v, 2*opsLedgerCredit)
		}
		as := c.wantAudits("opsledger/b", "rerun --from-step credit")
		if len(as) == 1 && (as[0].Operator != "alice" || as[0].Reason != "credit again" ||
			!strings.Contains(as[0].Details, "effects kept: "+effect)) {
			t.Errorf("audit = %+v; want alice, the reason and the effects kept", as[0])
		}
	})

	t.Run("unknown step or run", func(t *testing.T) {
		c := newOpsCLI(t)
		c.runCrashy("k")
		c.want(ExitUsage, []string{`no step "step/9"`, "steps: step/1, step/2, step/3"},
			"rerun", "crashy/k", "--from-step", "step/9", "--reason", "typo")
		c.want(ExitUsage, []string{`no run "crashy/nope"`}, "rerun", "crashy/nope", "--force")
		c.wantAudits("crashy/k")
		c.wantRan(map[string]int{"step/1": 1, "step/2": 1, "step/3": 1})
	})
}

// TestRerunAbandonedNeedsForce checks rerun keeps abandon's promise: run
// and resume refuse an abandoned run unless --force, and so does rerun.
func TestRerunAbandonedNeedsForce(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	c.staleCrashy("a")
	c.want(ExitOK, nil, "abandon", "crashy/a", "--reason", "bad input", "--operator", "alice")
	o := c.exec("rerun", "crashy/a", "--operator", "alice")
	if o.code != ExitOperator || !strings.Contains(o.stderr, "abandoned") {
		t.Errorf("exit %d; want %d saying the run is abandoned\n%s", o.code, ExitOperator, o)
	}
	c.wantRan(nil)
	if r := c.run("crashy/a").info.Run; r.Status != checkpoint.RunAbandoned {
		t.Errorf("rerun without --force ran the abandoned run: status %q", r.Status)
	}
	c.wantAudits("crashy/a", "abandon")
}

func TestResetCommand(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	c.want(ExitOK, nil, "run", "opsledger", "-p", "key=a", "-p", "side="+c.side)
	c.wantRan(map[string]int{"load": 1, "credit": 1, "report": 1})
	const runID = "opsledger/a"
	effect := "credit: stepwise_state acct:a 0 -> 10 (+10)"

	// A step whose effect applied is refused, saying why.
	c.want(ExitOperator, []string{"step credit of opsledger/a has applied effects", "does not undo them", effect, "--force"},
		"reset", runID, "--step", "credit", "--reason", "re-credit", "--operator", "alice")
	if s := c.run(runID); len(s.steps) != 3 || s.info.Run.Status != checkpoint.RunSucceeded {
		t.Errorf("refused reset changed the run: %d steps, %+v", len(s.steps), s.info.Run)
	}
	c.wantAudits(runID)

	// A step without effects is cleared and runs again on resume.
	c.want(ExitOK, []string{"step load of opsledger/a cleared", "stepwise resume opsledger/a"},
		"reset", runID, "--step", "load", "--reason", "orders reloaded", "--operator", "alice")
	s := c.run(runID)
	if _, ok := s.steps["load"]; ok || len(s.steps) != 2 || s.info.Run.Status != checkpoint.RunFailed {
		t.Errorf("after reset: steps %v, status %q; want load cleared, the run reopened (failed)", s.steps, s.info.Run.Status)
	}
	if as := c.wantAudits(runID, "reset --step load"); len(as) == 1 && (as[0].Operator != "alice" || as[0].Reason != "orders reloaded") {
		t.Errorf("audit = %+v", as[0])
	}
	c.want(ExitOK, []string{"succeeded (attempt 2): 1 step executed, 2 skipped"}, "resume", runID)
	c.wantRan(map[string]int{"load": 2, "credit": 1, "report": 1})
	if v := c.stateValue("acct:a"); v != opsLedgerCredit {
		t.Errorf("acct:a = %d; want %d", v, opsLedgerCredit)
	}

	// Forced, the effect's step is cleared: the effect stays and applies
	// again, as the refusal said.
	c.want(ExitOK, []string{"step credit of opsledger/a cleared"},
		"reset", runID, "--step", "credit", "--reason", "ledger restored by hand", "--operator", "alice", "--force")
	as := c.wantAudits(runID, "reset --step load", "reset --step credit")
	if len(as) == 2 && as[1].Details != "effects kept: "+effect {
		t.Errorf("forced reset's audit details = %q; want the effects kept", as[1].Details)
	}
	c.want(ExitOK, []string{"succeeded (attempt 3): 1 step executed, 2 skipped"}, "resume", runID)
	c.wantRan(map[string]int{"load": 2, "credit": 2, "report": 1})
	if v := c.stateValue("acct:a"); v != 2*opsLedgerCredit {
		t.Errorf("acct:a = %d; want %d", v, 2*opsLedgerCredit)
	}

	// Mistakes in what was typed.
	o := c.want(ExitUsage, []string{`no step "nope"`, "steps: "}, "reset", runID, "--step", "nope", "--reason", "x")
	for _, id := range []string{"load", "credit", "report"} {
		if !strings.Contains(o.stderr, id) {
			t.Errorf("refusal does not list step %s\n%s", id, o)
		}
	}
	c.want(ExitUsage, []string{"--reason"}, "reset", runID, "--step", "load")
	c.want(ExitUsage, []string{"--step"}, "reset", runID, "--reason", "x")
	c.want(ExitUsage, []string{`no run "opsledger/zz"`}, "reset", "opsledger/zz", "--step", "load", "--reason", "x")

	// A run held by a live runner is left alone.
	l := c.liveCrashy("l")
	err := c.store().InTx(context.Background(), l, func(tx checkpoint.Tx) error {
		return tx.PutStep(checkpoint.Step{ID: "step/1", Status: checkpoint.StepCompleted, Output: []byte(`{}`), Tries: 1,
			StartedAt: time.Now(), FinishedAt: time.Now()})
	})
	if err != nil {
		t.Fatal(err)
	}
	c.want(ExitHeld, []string{"held by " + opsForeign}, "reset", "crashy/l", "--step", "step/1", "--reason", "x")
	if s := c.run("crashy/l"); len(s.steps) != 1 || s.info.Run.Fence != l.Fence {
		t.Errorf("refused reset changed the live run: %d steps, %+v", len(s.steps), s.info.Run)
	}
	c.wantAudits("crashy/l")
	c.wantAudits(runID, "reset --step load", "reset --step credit")
}

// TestResetBatchStepWithAppliedItems resets a batch step that failed after
// some items applied their effects: like a step whose effect applied, it is
// refused unless --force, saying the items' effects stay.
func TestResetBatchStepWithAppliedItems(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	fail := filepath.Join(filepath.Dir(c.side), "fail")
	touch(t, fail)
	c.want(ExitFailed, []string{"payee unknown"}, "run", "opsbatch", "-p", "key=x", "-p", "side="+c.side, "-p", "fail="+fail)
	if v := c.stateValue("acct:x"); v != 2 {
		t.Fatalf("acct:x = %d after items 1 and 2; want 2", v)
	}
	if err := os.Remove(fail); err != nil {
		t.Fatal(err)
	}

	// Refused like reset, naming the items, their writes and the net
	// amount per key from the chunks' recorded plans.
	c.want(ExitOperator, []string{"already applied and NOT undone by clearing: the effects of 2 items (2 writes);",
		"pay: 2 items applied their effects to stepwise_state: 2 writes in 2 chunks, net acct:x +2", "--force"},
		"rerun", "opsbatch/x", "--from-step", "pay", "--reason", "payee added")
	o := c.exec("reset", "opsbatch/x", "--step", "pay", "--reason", "payee added")
	if o.code != ExitOperator || !strings.Contains(o.stderr, "applied") || !strings.Contains(o.stderr, "net acct:x +2") {
		t.Errorf("reset of a batch step whose items applied effects: exit %d; want %d, saying they applied\n%s", o.code, ExitOperator, o)
	}
	if s := c.run("opsbatch/x"); len(s.steps) != 1 {
		t.Errorf("refused reset cleared the step: %d steps left; want pay", len(s.steps))
	}
	c.wantAudits("opsbatch/x")

	// Resumed instead, the items done are skipped: each applies once.
	c.want(ExitOK, []string{"run opsbatch/x succeeded"}, "resume", "opsbatch/x")
	if v := c.stateValue("acct:x"); v != 4 {
		t.Errorf("acct:x = %d; want 4", v)
	}
	c.wantRan(map[string]int{"pay/1": 1, "pay/2": 1, "pay/3": 1, "pay/4": 1})
}

// TestResetPlannedEffectStep resets a step whose separate-store effect
// plan is recorded but not known to be applied (its runner died between
// the target's commit and marking the step done): the effect may have
// applied, and a reset step plans anew under a new effect ID, so it is
// refused unless --force like an applied one. (Resume finishes the plan
// exactly once instead.)
func TestResetPlannedEffectStep(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	l := c.claimJob(opsLedgerJob, map[string]string{"key": "p", "side": c.side}, time.Now().Add(-time.Hour), time.Minute)
	plan, err := json.Marshal(steps.PlanRecord{Target: "ledger.db:accounts", EffectID: "opsledger/p/credit@1.0",
		Ops:    []steps.Op{{Key: "acct:p", Kind: steps.OpAdd, Amount: opsLedgerCredit}},
		Writes: []checkpoint.Write{{Key: "acct:p", OldValue: 0, NewValue: opsLedgerCredit}}})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(-time.Hour)
	err = c.store().InTx(context.Background(), l, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(checkpoint.Step{ID: "load", Status: checkpoint.StepCompleted, Output: []byte(`10`), Tries: 1,
			StartedAt: at, FinishedAt: at}); err != nil {
			return err
		}
		return tx.PutStep(checkpoint.Step{ID: "credit", Status: checkpoint.StepPlanned, Output: []byte(`"credited"`), Tries: 1,
			StartedAt: at.Add(time.Second), FinishedAt: at.Add(time.Second), Plan: plan})
	})
	if err != nil {
		t.Fatal(err)
	}

	o := c.exec("reset", "opsledger/p", "--step", "credit", "--reason", "redo")
	if o.code != ExitOperator || !strings.Contains(o.stderr, "acct:p") {
		t.Errorf("reset of a step whose recorded plan may have applied: exit %d; want %d, naming its writes\n%s", o.code, ExitOperator, o)
	}
	if s := c.run("opsledger/p"); s.steps["credit"].Status != checkpoint.StepPlanned {
		t.Errorf("refused reset left credit %q; want it still planned", s.steps["credit"].Status)
	}
	c.wantAudits("opsledger/p")
}

func TestAbandonCommand(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	c.staleCrashy("x")
	c.want(ExitUsage, []string{"--reason"}, "abandon", "crashy/x")
	c.wantAudits("crashy/x")

	c.want(ExitOK, []string{"run crashy/x abandoned: run and resume refuse it unless --force"},
		"abandon", "crashy/x", "--reason", "bad input file", "--operator", "alice")
	s := c.run("crashy/x")
	if r := s.info.Run; r.Status != checkpoint.RunAbandoned || !strings.Contains(r.Error, "abandoned by alice: bad input file") {
		t.Errorf("abandoned run = %+v", r)
	}
	if as := c.wantAudits("crashy/x", "abandon"); len(as) == 1 && (as[0].Operator != "alice" || as[0].Reason != "bad input file") {
		t.Errorf("audit = %+v", as[0])
	}

	c.want(ExitOperator, []string{"abandoned", "bad input file"}, crashyArgs(c.db, "x", c.side)[2:]...)
	c.want(ExitOperator, []string{"abandoned"}, "resume", "crashy/x")
	c.want(ExitOperator, []string{"already abandoned"}, "abandon", "crashy/x", "--reason", "again")
	c.wantRan(nil)
	if s := c.run("crashy/x"); len(s.info.Attempts) != 1 || s.info.Run.Status != checkpoint.RunAbandoned {
		t.Errorf("refused starts changed the run: %+v", s.info)
	}

	c.want(ExitOK, []string{"run crashy/x succeeded (attempt 2): 3 steps executed"}, "resume", "crashy/x", "--force")
	c.wantRan(map[string]int{"step/1": 1, "step/2": 1, "step/3": 1})

	// A run its runner still holds cannot be abandoned.
	c.liveCrashy("l")
	c.want(ExitHeld, []string{"held by " + opsForeign}, "abandon", "crashy/l", "--reason", "too slow")
	if r := c.run("crashy/l").info.Run; r.Status != checkpoint.RunRunning || r.LeaseOwner != opsForeign {
		t.Errorf("refused abandon changed the live run: %+v", r)
	}
	c.wantAudits("crashy/l")
}

// opsPastRun records a finished crashy run with key that started at at,
// as if it ran then: two completed steps with outputs, and a batch step's
// items. status is succeeded or failed.
// idempotencyKey records an API Idempotency-Key, done, that started
// runID, and returns it.
func (c *opsCLI) idempotencyKey(key, runID string) checkpoint.IdempotencyKey {
	c.t.Helper()
	ctx := context.Background()
	k := checkpoint.IdempotencyKey{Scope: "token:ops", Key: key, RequestHash: "h", Job: "crashy", Params: []byte(`{}`), RunID: runID, CreatedAt: time.Now()}
	rec, begun, err := c.store().BeginIdempotency(ctx, k, time.Time{})
	if err != nil || !begun {
		c.t.Fatalf("record the idempotency key %s: begun %v, %v", key, begun, err)
	}
	if err := c.store().FinishIdempotency(ctx, rec, time.Now()); err != nil {
		c.t.Fatal(err)
	}
	return k
}

// keyRecorded says whether the Idempotency-Key k is recorded (then, for
// the test's sake, left so); a key found gone is recorded again.
func (c *opsCLI) keyRecorded(k checkpoint.IdempotencyKey) bool {
	c.t.Helper()
	_, begun, err := c.store().BeginIdempotency(context.Background(), k, time.Time{})
	if err != nil {
		c.t.Fatal(err)
	}
	return !begun
}

func (c *opsCLI) opsPastRun(key, status string, at time.Time) {
	c.t.Helper()
	ctx := context.Background()
	dec, err := crashyJob.Decode(map[string]string{"key": key, "side": c.side}, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	st := c.store()
	claim, err := st.Claim(ctx, checkpoint.ClaimRequest{
		RunID: jobs.RunID("crashy", dec.RunKey), Job: "crashy", RunKey: dec.RunKey, Params: dec.JSON, ParamsHash: dec.Hash,
		Owner: opsForeign, Now: at, LeaseFor: time.Minute,
	})
	if err != nil {
		c.t.Fatal(err)
	}
	err = st.InTx(ctx, claim.Lease, func(tx checkpoint.Tx) error {
		for _, id := range stepIDs(2) {
			if err := tx.PutStep(checkpoint.Step{ID: id, Status: checkpoint.StepCompleted, Output: []byte(`{"step":"` + id + `"}`),
				Tries: 1, StartedAt: at, FinishedAt: at}); err != nil {
				return err
			}
		}
		return tx.PutItems([]checkpoint.Item{
			{Step: "batch", Key: "a", Status: checkpoint.StepCompleted, Output: []byte(`1`), Attempt: 1},
			{Step: "batch", Key: "b", Status: checkpoint.StepCompleted, Output: []byte(`2`), Attempt: 1},
		})
	})
	if err != nil {
		c.t.Fatal(err)
	}
	if err := st.Finish(ctx, claim.Lease, checkpoint.Ending{Status: status, At: at.Add(time.Second)}); err != nil {
		c.t.Fatal(err)
	}
}

func TestPruneCommand(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	longAgo := time.Now().AddDate(0, 0, -100)
	c.opsPastRun("old", checkpoint.RunSucceeded, longAgo)
	c.opsPastRun("oldfailed", checkpoint.RunFailed, longAgo)
	c.runCrashy("recent")
	oldKey := c.idempotencyKey("k-old", "crashy/old")
	recentKey := c.idempotencyKey("k-recent", "crashy/recent")
	// 2 step outputs of 17 bytes, 2 items of 1-byte key and 1-byte output:
	// 38 bytes; and the run's Idempotency-Key.
	const freed = "2 step payloads, 2 item checkpoints, 38 bytes freed, 1 idempotency key"

	o := c.want(ExitOK, []string{"would prune 1 run: " + freed, "runs: crashy/old"}, "prune", "--older-than", "90d", "--dry-run")
	if strings.Contains(o.stdout, "recent") || strings.Contains(o.stdout, "oldfailed") {
		t.Errorf("dry run lists runs it must not prune\n%s", o)
	}
	if s := c.run("crashy/old"); !s.info.Run.PrunedAt.IsZero() || s.steps["step/1"].Output == nil {
		t.Errorf("dry run pruned: %+v", s.info.Run)
	}
	c.wantAudits("crashy/old")
	if !c.keyRecorded(oldKey) {
		t.Errorf("dry run deleted the pruned run's idempotency key")
	}
	c.want(ExitOK, []string{"would prune 1 run"}, "prune", "--older-than", "720h", "--dry-run")

	c.want(ExitOK, []string{"pruned 1 run: " + freed, "runs: crashy/old", "tombstones"},
		"prune", "--older-than", "90d", "--operator", "alice", "--reason", "retention policy")
	s := c.run("crashy/old")
	if s.info.Run.PrunedAt.IsZero() || s.info.Run.Status != checkpoint.RunSucceeded {
		t.Errorf("pruned run = %+v; want succeeded with pruned_at set", s.info.Run)
	}
	for id, st := range s.steps {
		if st.Output != nil {
			t.Errorf("pruned run's %s keeps its output %s", id, st.Output)
		}
	}
	counts, err := c.store().ItemCounts(context.Background(), "crashy/old")
	var items int64
	for _, n := range counts {
		items += n.Count
	}
	if err != nil || items != 0 {
		t.Errorf("pruned run keeps %d items (%v)", items, err)
	}
	if o, r := c.keyRecorded(oldKey), c.keyRecorded(recentKey); o || !r {
		t.Errorf("after the prune, the pruned run's idempotency key is recorded %v (want false), the recent run's %v (want true)", o, r)
	}
	as := c.wantAudits("crashy/old", "prune --older-than 90d")
	if len(as) == 1 && (as[0].Operator != "alice" || as[0].Reason != "retention policy" || as[0].Details != "2 steps, 2 items, 38 bytes, 1 idempotency keys") {
		t.Errorf("audit = %+v; want alice, the reason and what was freed", as[0])
	}
	for _, id := range []string{"crashy/recent", "crashy/oldfailed"} {
		s := c.run(id)
		if !s.info.Run.PrunedAt.IsZero() || len(s.steps) == 0 || s.steps["step/1"].Output == nil {
			t.Errorf("%s was pruned: %+v", id, s.info.Run)
		}
		c.wantAudits(id)
	}

	// The tombstone refuses the key: run, forced or not, resume, rerun.
	ran := c.ran()
	c.want(ExitOperator, []string{"crashy/old was pruned"}, crashyArgs(c.db, "old", c.side)[2:]...)
	c.want(ExitOperator, []string{"pruned"}, append(crashyArgs(c.db, "old", c.side)[2:], "--force")...)
	c.want(ExitOperator, []string{"pruned"}, "resume", "crashy/old", "--force")
	c.want(ExitOperator, []string{"pruned"}, "rerun", "crashy/old", "--force")
	if got := c.ran(); len(got) != len(ran) || got["step/1"] != ran["step/1"] {
		t.Errorf("a refused start of the pruned run ran steps: %v, then %v", ran, got)
	}
	c.want(ExitOK, []string{"pruned 0 runs"}, "prune", "--older-than", "90d")

	for _, bad := range []string{"ninety", "-5d", "5x", "d", "-1h", ""} {
		c.want(ExitUsage, []string{"want a duration such as 90d or 720h"}, "prune", "--older-than="+bad)
	}
	c.want(ExitUsage, []string{"--older-than"}, "prune")
}

// TestPrunedRunRefusesReset checks that the step-clearing operations
// refuse a pruned run before changing it: its checkpoints are gone, so its
// rerun is refused anyway, and the tombstone (status, remaining step rows,
// fence) must stay as it was.
func TestPrunedRunRefusesReset(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	longAgo := time.Now().AddDate(0, 0, -100)
	c.opsPastRun("old1", checkpoint.RunSucceeded, longAgo)
	c.opsPastRun("old2", checkpoint.RunSucceeded, longAgo)
	c.want(ExitOK, []string{"pruned 2 runs"}, "prune", "--older-than", "90d")
	for _, args := range [][]string{
		{"rerun", "crashy/old1", "--from-step", "step/1", "--reason", "x"},
		{"reset", "crashy/old2", "--step", "step/1", "--reason", "x"},
	} {
		runID := args[1]
		before := c.run(runID)
		o := c.exec(args...)
		if o.code != ExitOperator || !strings.Contains(o.stderr, "pruned") {
			t.Errorf("exit %d; want %d saying the run was pruned\n%s", o.code, ExitOperator, o)
		}
		if got, want := opsTombstone(c.run(runID)), opsTombstone(before); got != want {
			t.Errorf("%s changed the pruned run: %s; want it left as %s", args[0], got, want)
		}
		c.wantAudits(runID, "prune --older-than 90d")
	}
}

// opsTombstone describes what a pruned run keeps.
func opsTombstone(s runState) string {
	r := s.info.Run
	return fmt.Sprintf("%s, %d step rows, fence %d, pruned %v", r.Status, len(s.steps), r.Fence, !r.PrunedAt.IsZero())
}

func TestRunsMarksStaleRuns(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	c.runCrashy("done")
	c.staleCrashy("dead")
	c.liveCrashy("live")

	rs := c.runsJSON()
	for id, want := range map[string]opsRunsJSON{
		"crashy/done": {ID: "crashy/done", Status: checkpoint.RunSucceeded},
		"crashy/dead": {ID: "crashy/dead", Status: checkpoint.RunRunning, Stale: true, LeaseOwner: opsForeign},
		"crashy/live": {ID: "crashy/live", Status: checkpoint.RunRunning, LeaseOwner: opsForeign},
	} {
		if rs[id] != want {
			t.Errorf("runs --json: %+v; want %+v", rs[id], want)
		}
	}

	o := c.want(ExitOK, []string{"RUN", "STATUS", "stale (runner " + opsForeign + " silent since "}, "runs")
	for line := range strings.Lines(o.stdout) {
		if strings.Contains(line, "stale") != strings.HasPrefix(line, "crashy/dead ") {
			t.Errorf("runs line %q: only crashy/dead is stale", line)
		}
	}
	if strings.Contains(o.stdout, "\x1b") {
		t.Errorf("runs to a non-terminal printed escape codes: %q", o.stdout)
	}
	if v := c.showJSON("crashy/dead"); !v.Run.Stale || v.Run.LeaseOwner != opsForeign {
		t.Errorf("show --json of the stale run: %+v", v.Run)
	}
	c.want(ExitOK, []string{"status stale (runner " + opsForeign}, "show", "crashy/dead")

	// Written to a file (not a terminal), still no colour.
	f, err := os.Create(filepath.Join(t.TempDir(), "runs.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if code := Execute(context.Background(), opsRegistry(), []string{"--db", c.db, "runs"}, f, f); code != ExitOK {
		t.Fatalf("runs to a file: exit %d", code)
	}
	if b, err := os.ReadFile(f.Name()); err != nil || !strings.Contains(string(b), "stale") || bytes.Contains(b, []byte("\x1b")) {
		t.Errorf("runs to a file: %q (%v); want it listed stale, without escape codes", b, err)
	}
}

// TestRunsColoursOnATerminal writes `runs` to a pseudo-terminal: coloured,
// unless NO_COLOR is set.
func TestRunsColoursOnATerminal(t *testing.T) {
	c := newOpsCLI(t)
	c.runCrashy("done")
	c.staleCrashy("dead")
	runsOnTTY := func() string {
		t.Helper()
		tty, read := opsPTY(t)
		code := Execute(context.Background(), opsRegistry(), []string{"--db", c.db, "runs"}, tty, tty)
		if code != ExitOK {
			t.Fatalf("runs on a terminal: exit %d", code)
		}
		return read()
	}

	out := runsOnTTY()
	for _, want := range []string{"\x1b[32msucceeded\x1b[0m", "\x1b[33mstale (runner " + opsForeign} {
		if !strings.Contains(out, want) {
			t.Errorf("runs on a terminal: %q; want it to contain %q", out, want)
		}
	}
	t.Setenv("NO_COLOR", "1")
	if out := runsOnTTY(); strings.Contains(out, "\x1b") || !strings.Contains(out, "stale") {
		t.Errorf("runs on a terminal with NO_COLOR: %q; want no escape codes", out)
	}
}

// opsPTY opens a pseudo-terminal (Linux) and returns its terminal end and
// a function that closes it and returns all that was written to it.
func opsPTY(t *testing.T) (*os.File, func() string) {
	t.Helper()
	// Linux's generic ioctl numbers; elsewhere, or if they do not apply,
	// the test is skipped.
	const tiocsptlck, tiocgptn = 0x40045431, 0x80045430
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	var unlock, n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, ptmx.Fd(), tiocsptlck, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		ptmx.Close()
		t.Skipf("unlock pseudo-terminal: %v", e)
	}
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, ptmx.Fd(), tiocgptn, uintptr(unsafe.Pointer(&n))); e != 0 {
		ptmx.Close()
		t.Skipf("name pseudo-terminal: %v", e)
	}
	tty, err := os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		ptmx.Close()
		t.Skipf("open pseudo-terminal: %v", err)
	}
	if !isatty.IsTerminal(tty.Fd()) {
		tty.Close()
		ptmx.Close()
		t.Skip("the pseudo-terminal is not a terminal")
	}
	var buf bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		b := make([]byte, 4096)
		for {
			n, err := ptmx.Read(b)
			buf.Write(b[:n])
			if err != nil {
				return // EIO once the terminal end is closed and drained
			}
		}
	}()
	t.Cleanup(func() { tty.Close(); ptmx.Close() })
	return tty, func() string {
		tty.Close()
		<-done
		return buf.String()
	}
}

func TestShowAudit(t *testing.T) {
	c := newOpsCLI(t)
	c.runCrashy("k")
	if v := c.showJSON("crashy/k"); len(v.Audit) != 0 {
		t.Errorf("audit of an untouched run = %+v; want []", v.Audit)
	}

	t.Setenv("STEPWISE_OPERATOR", "bob")
	c.want(ExitOK, nil, "rerun", "crashy/k", "--force", "--reason", "from the environment")
	c.want(ExitOK, nil, "rerun", "crashy/k", "--force", "--reason", "flag beats environment", "--operator", "alice")
	t.Setenv("STEPWISE_OPERATOR", "")
	t.Setenv("USER", "carol")
	c.want(ExitOK, nil, "rerun", "crashy/k", "--from-step", "step/3", "--reason", "from $USER")

	v := c.showJSON("crashy/k")
	type row struct{ operator, command, reason string }
	var got []row
	for _, a := range v.Audit {
		got = append(got, row{a.Operator, a.Command, a.Reason})
		if a.RunID != "crashy/k" || a.At.IsZero() || time.Since(a.At) > time.Minute {
			t.Errorf("audit row %+v; want run crashy/k, a recent time", a)
		}
	}
	want := []row{
		{"bob", "rerun", "from the environment"},
		{"alice", "rerun", "flag beats environment"},
		{"carol", "rerun --from-step step/3", "from $USER"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("show --json audit = %+v; want %+v", got, want)
	}
	if d := v.Audit[len(v.Audit)-1].Details; d != "cleared step/3" {
		t.Errorf("details = %q; want \"cleared step/3\"", d)
	}
	o := c.want(ExitOK, []string{"AUDIT", "OPERATOR", "COMMAND", "REASON"}, "show", "crashy/k")
	for _, r := range want {
		if !strings.Contains(o.stdout, r.operator) || !strings.Contains(o.stdout, r.reason) {
			t.Errorf("show does not list %+v\n%s", r, o)
		}
	}
}
