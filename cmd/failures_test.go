package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// These tests drive failure handling inside a run through real stepwise
// processes (see TestMain): SIGTERM and a second SIGTERM, the grace period,
// outside calls whose outcome a SIGKILL left unknown, the outbox delivered
// by a later process, and retries end to end.

// failureJobs are this file's test jobs; testRegistry registers them.
var failureJobs = []jobs.Job{counterJob, payJob, outboxJob, flakyJob}

// counterParams are the parameters of the counter job: Steps same-store
// effects that each add 1 to "total" in the built-in steps.State target.
type counterParams struct {
	Key   string `param:"key,key" help:"run key"`
	Side  string `param:"side,required" help:"file each step's function logs its executions to"`
	Steps int    `param:"steps" default:"5" help:"number of steps"`
	// Block, BlockAt and Stubborn work as in the crashy job.
	Block    string `param:"block" help:"file whose existence releases the blocking step"`
	BlockAt  int    `param:"block-at" default:"0" help:"index of the blocking step (0: none)"`
	Stubborn bool   `param:"stubborn" default:"false" help:"the blocking step ignores cancellation"`
}

var counterJob = jobs.Define("counter", func(ctx context.Context, run *steps.Run, p counterParams) error {
	for i := 1; i <= p.Steps; i++ {
		id := steps.ID("add", strconv.Itoa(i))
		_, err := steps.Apply(ctx, run, id, steps.State, func(ctx context.Context, e *steps.Effects) (int, error) {
			if err := appendLine(p.Side, sideRan+" "+id); err != nil {
				return 0, err
			}
			if i == p.BlockAt {
				if err := block(ctx, crashyParams{Side: p.Side, Block: p.Block, Stubborn: p.Stubborn}, id); err != nil {
					return 0, err
				}
			}
			e.Add("total", 1)
			return i, nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}, jobs.Help("test job: numbered steps, each adding 1 to total in the state table"))

// payParams are the parameters of the pay job: one outside call ("pay")
// whose outside system is a file of the idempotency keys it was called
// with, then a step ("record") that uses the call's result.
type payParams struct {
	Key       string `param:"key,key" help:"run key"`
	Outside   string `param:"outside,required" help:"the outside system: one line per call, the call's idempotency key"`
	Reconcile bool   `param:"reconcile" default:"false" help:"settle an unknown outcome by looking the key up in the outside file"`
	// Block makes the call wait, after the outside system got it, for
	// its answer: until the file Block exists or the call's context
	// ends, as an HTTP client does.
	Block string `param:"block" help:"file whose existence lets the outside system answer"`
}

var payJob = jobs.Define("pay", func(ctx context.Context, run *steps.Run, p payParams) error {
	var opts []steps.Option
	if p.Reconcile {
		opts = append(opts, steps.Reconcile(func(ctx context.Context, key string) (any, bool, error) {
			b, err := os.ReadFile(p.Outside)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, false, err
			}
			if !slices.Contains(strings.Split(string(b), "\n"), key) {
				return nil, false, nil
			}
			return "found:" + key, true, nil
		}))
	}
	receipt, err := steps.Call(ctx, run, "pay", func(ctx context.Context, key string) (string, error) {
		if key != steps.IdempotencyKey(ctx) {
			return "", steps.Permanent(fmt.Errorf("key %q differs from the context's %q", key, steps.IdempotencyKey(ctx)))
		}
		if err := appendLine(p.Outside, key); err != nil {
			return "", err
		}
		if p.Block != "" {
			if err := block(ctx, crashyParams{Block: p.Block}, "pay"); err != nil {
				return "", err
			}
		}
		return "paid:" + key, nil
	}, opts...)
	if err != nil {
		return err
	}
	_, err = steps.Do(ctx, run, "record", func(ctx context.Context) (string, error) { return "recorded " + receipt, nil })
	return err
}, jobs.Help("test job: an outside call that is not an effect, then a step using its result"))

// outboxParams are the parameters of the outbox job: a step, then a
// notification queued with the checkpoint of step "notify".
type outboxParams struct {
	Key string `param:"key,key" help:"run key"`
}

var outboxJob = jobs.Define("outbox", func(ctx context.Context, run *steps.Run, p outboxParams) error {
	total, err := steps.Do(ctx, run, "settle", func(ctx context.Context) (int, error) { return 42, nil })
	if err != nil {
		return err
	}
	return steps.Notify(ctx, run, "notify", "settled", map[string]any{"date": p.Key, "total": total})
}, jobs.Help("test job: a step, then a notification"))

// flakyParams are the parameters of the flaky job: one step, "fetch",
// logging each try to Side, failing transiently Fails times before it
// succeeds, or permanently at once.
type flakyParams struct {
	Key       string `param:"key,key" help:"run key"`
	Side      string `param:"side,required" help:"file each try is logged to"`
	Fails     int    `param:"fails" default:"2" help:"transient failures before success"`
	Permanent bool   `param:"permanent" default:"false" help:"fail permanently instead"`
}

var flakyJob = jobs.Define("flaky", func(ctx context.Context, run *steps.Run, p flakyParams) error {
	_, err := steps.Do(ctx, run, "fetch", func(ctx context.Context) (string, error) {
		if err := appendLine(p.Side, "try"); err != nil {
			return "", err
		}
		if p.Permanent {
			return "", steps.Permanent(errors.New("bad input: account closed"))
		}
		tries, err := fileLines(p.Side)
		if err != nil {
			return "", err
		}
		if len(tries) <= p.Fails {
			return "", steps.Transient(fmt.Errorf("provider busy (try %d)", len(tries)))
		}
		return "fetched", nil
	})
	return err
}, jobs.Help("test job: a step that fails transiently, then succeeds"),
	jobs.Retry(steps.RetryPolicy{MaxTries: 3, Initial: time.Millisecond, Jitter: steps.NoJitter}))

// fileLines returns the complete lines of the file at path; none if it
// does not exist.
func fileLines(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, '\n')
	if i < 0 {
		return nil, nil
	}
	return strings.Split(string(b[:i]), "\n"), nil
}

// linesOf is fileLines for a test.
func linesOf(t *testing.T, path string) []string {
	t.Helper()
	ls, err := fileLines(path)
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

// countLine returns how many lines of the file at path equal line.
func countLine(t *testing.T, path, line string) int {
	t.Helper()
	n := 0
	for _, l := range linesOf(t, path) {
		if l == line {
			n++
		}
	}
	return n
}

// shown is the part of `show --json` these tests read.
type shown struct {
	Run struct {
		Status string `json:"status"`
	} `json:"run"`
	Attempts []struct {
		Status string `json:"status"`
	} `json:"attempts"`
	Steps []shownStep `json:"steps"`
	Audit []struct {
		Command  string `json:"command"`
		Operator string `json:"operator"`
		Reason   string `json:"reason"`
		Details  string `json:"details"`
	} `json:"audit"`
	Outbox []struct {
		Key    string    `json:"key"`
		Status string    `json:"status"`
		Tries  int       `json:"tries"`
		NextAt time.Time `json:"next_at"`
	} `json:"outbox"`
}

// shownStep is a step in `show --json`.
type shownStep struct {
	ID      string          `json:"id"`
	Status  string          `json:"status"`
	Tries   int             `json:"tries"`
	Attempt int             `json:"attempt"`
	Output  json.RawMessage `json:"output"`
	Error   string          `json:"error"`
}

// show runs `stepwise show RUN --json` in this process (no child is running
// then) and decodes it.
func show(t *testing.T, db, runID string) shown {
	t.Helper()
	var out, errb bytes.Buffer
	if code := Execute(context.Background(), testRegistry(), []string{"--db", db, "show", runID, "--json"}, &out, &errb); code != ExitOK {
		t.Fatalf("show %s: exit %d\n%s", runID, code, errb.String())
	}
	var s shown
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		t.Fatalf("show %s --json: %v\n%s", runID, err, out.String())
	}
	return s
}

// step returns the shown step id; ok is false if it has no checkpoint.
func (s shown) step(id string) (shownStep, bool) {
	for _, x := range s.Steps {
		if x.ID == id {
			return x, true
		}
	}
	return shownStep{}, false
}

// stateOf returns key's value and version in the built-in state table of
// the checkpoint database db (no child is running then).
func stateOf(t *testing.T, db, key string) checkpoint.State {
	t.Helper()
	st := dialStore(t, db)
	defer st.Close()
	return stateIn(t, st, key)
}

// stateIn returns key's value and version in the built-in state table of
// st, read through the effect target contract.
func stateIn(t *testing.T, st checkpoint.Store, key string) checkpoint.State {
	t.Helper()
	ctx := context.Background()
	tgt, err := st.OpenTarget(ctx, checkpoint.TargetSpec{Table: checkpoint.StateTable, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Close()
	var got map[string]checkpoint.State
	if err := tgt.View(ctx, func(v checkpoint.Target) error { got, err = v.Read(ctx, []string{key}); return err }); err != nil {
		t.Fatal(err)
	}
	return got[key]
}

// checkCounted fails unless the counter run's total is 5 after 5 writes,
// every add/i completed, and add/i's recorded plan moved total from i-1
// to i: each step's effect applied exactly once, in order.
func checkCounted(t *testing.T, db, runID string) {
	t.Helper()
	const n = 5
	if got := stateOf(t, db, "total"); got.Value != n || got.Version != n {
		t.Errorf("total = %d (version %d), want %d (version %d): every step's effect exactly once", got.Value, got.Version, n, n)
	}
	s := readRun(t, db, runID)
	if got := s.info.Run.Status; got != checkpoint.RunSucceeded {
		t.Errorf("run status = %q, want %q", got, checkpoint.RunSucceeded)
	}
	for i := 1; i <= n; i++ {
		id := steps.ID("add", strconv.Itoa(i))
		c := s.steps[id]
		var pr steps.PlanRecord
		if err := json.Unmarshal(c.Plan, &pr); c.Status != checkpoint.StepCompleted || err != nil {
			t.Errorf("%s: status %q, plan %s (%v); want completed with a plan", id, c.Status, c.Plan, err)
			continue
		}
		want := []checkpoint.Write{{Key: "total", OldVersion: int64(i - 1), OldValue: int64(i - 1), NewValue: int64(i), Insert: i == 1}}
		if !slices.Equal(pr.Writes, want) {
			t.Errorf("%s applied %+v, want %+v", id, pr.Writes, want)
		}
	}
}

// counterArgs returns CLI arguments running the counter job on db.
func counterArgs(db, side string, params ...string) []string {
	args := []string{"--db", db, "run", "counter", "-p", "key=k", "-p", "side=" + side}
	for _, p := range params {
		args = append(args, "-p", p)
	}
	return args
}

func TestSIGTERMMidStepThenExactRerun(t *testing.T) {
	t.Parallel()
	db, side := testFiles(t)
	release := filepath.Join(filepath.Dir(side), "release")
	c := startChild(t, nil, nil, counterArgs(db, side, "block="+release, "block-at=3")...)
	c.WaitFor("add/3 started", func() bool { return countLine(t, side, "ran add/3") == 1 })
	if err := c.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.WantExit(c.Wait(), crashtest.Code(ExitInterrupted))
	for _, want := range []string{"run counter/k interrupted (attempt 1): 2 steps executed", "resume it with: stepwise resume counter/k"} {
		if !strings.Contains(c.Stdout(), want) {
			t.Errorf("stdout = %q, want it to contain %q", c.Stdout(), want)
		}
	}
	before := readRun(t, db, "counter/k")
	if got := before.attemptStatuses(); before.info.Run.Status != checkpoint.RunInterrupted || !slices.Equal(got, []string{checkpoint.RunInterrupted}) {
		t.Errorf("run %q with attempts %v, want interrupted once", before.info.Run.Status, got)
	}
	if r := before.info.Run; r.LeaseOwner != "" {
		t.Errorf("the interrupted run still has a lease held by %q until %s; want it released", r.LeaseOwner, r.LeaseUntil)
	}
	if got := before.completed(); !slices.Equal(got, []string{"add/1", "add/2"}) {
		t.Errorf("completed = %v, want [add/1 add/2]", got)
	}
	if s, ok := before.steps["add/3"]; !ok || s.Status != checkpoint.StepFailed || len(s.Plan) != 0 {
		t.Errorf("the cancelled step's checkpoint = %+v, want a failed try with no plan", s)
	}
	if _, ok := before.steps["add/4"]; ok {
		t.Error("add/4 was recorded: no step may start after the signal")
	}
	if got := stateOf(t, db, "total"); got.Value != 2 {
		t.Errorf("total after the interrupt = %d, want 2 (the cancelled step applied nothing)", got.Value)
	}

	touch(t, release)
	c, got := runChild(t, nil, "--db", db, "resume", "counter/k")
	c.WantExit(got, exited0)
	if want := "run counter/k succeeded (attempt 2): 3 steps executed, 2 skipped"; !strings.Contains(c.Stdout(), want) {
		t.Errorf("resume stdout = %q, want it to contain %q", c.Stdout(), want)
	}
	checkCounted(t, db, "counter/k")
	after := readRun(t, db, "counter/k")
	for _, id := range []string{"add/1", "add/2"} {
		if s := after.steps[id]; s.Attempt != 1 || !bytes.Equal(s.Plan, before.steps[id].Plan) {
			t.Errorf("%s was rewritten by the resume (attempt %d)", id, s.Attempt)
		}
	}
	for i, want := range []int{1, 1, 2, 1, 1} {
		id := "add/" + strconv.Itoa(i+1)
		if got := countLine(t, side, "ran "+id); got != want {
			t.Errorf("%s's function ran %d times, want %d", id, got, want)
		}
	}
}

func TestSecondSIGTERMExitsAtOnce(t *testing.T) {
	t.Parallel()
	db, side := testFiles(t)
	release := filepath.Join(filepath.Dir(side), "release")
	args := counterArgs(db, side, "block="+release, "block-at=3", "stubborn=true")
	// A long grace period: only the second signal can end the child soon.
	c := startChild(t, []string{GraceEnv + "=1m"}, nil, args...)
	c.WaitFor("add/3 started", func() bool { return countLine(t, side, "ran add/3") == 1 })
	if err := c.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The step ignores its context: it notes the cancel and keeps waiting.
	c.WaitFor("add/3 seeing the cancel", func() bool { return countLine(t, side, "cancelled add/3") == 1 })
	sent := time.Now()
	if err := c.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	got, ok := c.WaitWithin(2 * time.Second)
	if !ok {
		t.Fatalf("the child still runs %s after a second SIGTERM; want it to end at once\nstderr:\n%s", time.Since(sent), c.Stderr())
	}
	c.WantExit(got, crashtest.Exit{Code: -1, Signal: syscall.SIGTERM})
	t.Logf("the last SIGTERM ended the child in %s", time.Since(sent))
	if s := c.Stderr(); strings.Contains(s, "grace period") {
		t.Errorf("stderr mentions the grace period; the second signal should have ended the child:\n%s", s)
	}
	before := readRun(t, db, "counter/k")
	if got := before.completed(); !slices.Equal(got, []string{"add/1", "add/2"}) {
		t.Errorf("completed = %v, want [add/1 add/2]", got)
	}
	if s, ok := before.steps["add/3"]; ok {
		t.Errorf("add/3 has a checkpoint %+v; the process died inside its function", s)
	}
	if got := stateOf(t, db, "total"); got.Value != 2 || got.Version != 2 {
		t.Errorf("total = %+v, want 2 at version 2: nothing half-written", got)
	}

	touch(t, release)
	c, got = runChild(t, nil, args...)
	c.WantExit(got, exited0)
	if want := "run counter/k succeeded (attempt 2): 3 steps executed, 2 skipped"; !strings.Contains(c.Stdout(), want) {
		t.Errorf("rerun stdout = %q, want it to contain %q", c.Stdout(), want)
	}
	checkCounted(t, db, "counter/k")
}

func TestGracePeriodEndsAStubbornStep(t *testing.T) {
	t.Parallel()
	const grace = 300 * time.Millisecond
	db, side := testFiles(t)
	release := filepath.Join(filepath.Dir(side), "release")
	args := counterArgs(db, side, "block="+release, "block-at=3", "stubborn=true")
	c := startChild(t, []string{GraceEnv + "=" + grace.String()}, nil, args...)
	c.WaitFor("add/3 started", func() bool { return countLine(t, side, "ran add/3") == 1 })
	sent := time.Now()
	if err := c.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	got := c.Wait()
	took := time.Since(sent)
	c.WantExit(got, crashtest.Code(ExitInterrupted))
	// The grace period ends the process: not before it, and soon after.
	if took < grace || took > grace+10*time.Second {
		t.Errorf("the child exited %s after SIGTERM, want about the %s grace period", took, grace)
	}
	t.Logf("exited %s after SIGTERM (grace %s)", took, grace)
	if want := "did not finish within the 300ms grace period; exiting (resumable)"; !strings.Contains(c.Stderr(), want) {
		t.Errorf("stderr = %q, want it to contain %q", c.Stderr(), want)
	}
	if countLine(t, side, "cancelled add/3") != 1 {
		t.Error("the step did not see its context cancelled during the grace period")
	}
	before := readRun(t, db, "counter/k")
	t.Logf("after the grace period: run %s, attempts %v", before.info.Run.Status, before.attemptStatuses())
	if _, ok := before.steps["add/3"]; ok {
		t.Errorf("add/3 has a checkpoint; the process ended inside its function")
	}
	if got := stateOf(t, db, "total"); got.Value != 2 {
		t.Errorf("total = %d, want 2", got.Value)
	}

	touch(t, release)
	c, got = runChild(t, nil, args...)
	c.WantExit(got, exited0)
	checkCounted(t, db, "counter/k")
}

func TestOutcomeUnknownAfterKill(t *testing.T) {
	t.Parallel()
	const runID, key = "pay/k", "pay/k/pay" // key: the step's idempotency key
	cases := []struct {
		name   string
		point  string
		called int // outside calls before the kill
		// How the operator settles it, what the step's output is then,
		// and how many calls the outside system has seen in the end.
		as, output string
		wantOut    string
		calls      int
	}{
		{"killed after the call: resolved done", "step:pay:before-result", 1, "done", `"receipt-1"`, "receipt-1", 1},
		{"killed before the call: resolved retry", "step:pay:after-intent", 0, "retry", "", "paid:" + key, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, outside := testFiles(t)
			args := []string{"--db", db, "run", "pay", "-p", "key=k", "-p", "outside=" + outside}
			c, got := runChild(t, []string{crashtest.CrashAt(tc.point)}, args...)
			c.WantExit(got, sigkilled)
			settleKilled(t, c)
			if got := linesOf(t, outside); len(got) != tc.called {
				t.Fatalf("outside calls before the kill = %q, want %d", got, tc.called)
			}

			// The rerun stops for an operator, without calling blindly.
			c, got = runChild(t, nil, args...)
			c.WantExit(got, crashtest.Code(ExitOperator))
			if want := "`stepwise resolve " + runID + " --step pay --as done|retry --reason"; !strings.Contains(c.Stderr(), want) {
				t.Errorf("stderr = %q, want it to name %s", c.Stderr(), want)
			}
			if got := linesOf(t, outside); len(got) != tc.called {
				t.Fatalf("outside calls after the stopped rerun = %q, want still %d: the rerun called again", got, tc.called)
			}
			s := show(t, db, runID)
			if st, _ := s.step("pay"); st.Status != checkpoint.StepCalling {
				t.Errorf("pay is %q after the stop, want %q", st.Status, checkpoint.StepCalling)
			}
			if _, ok := s.step("record"); ok {
				t.Error("the step after the unknown call ran")
			}

			reason := "seen at provider"
			resolve := []string{"--db", db, "resolve", runID, "--step", "pay", "--as", tc.as, "--reason", reason}
			if tc.output != "" {
				resolve = append(resolve, "--output", tc.output)
			}
			c, got = runChild(t, []string{"STEPWISE_OPERATOR=ops@example"}, resolve...)
			c.WantExit(got, exited0)
			if want := "step pay of " + runID + " resolved as " + tc.as; !strings.Contains(c.Stdout(), want) {
				t.Errorf("resolve stdout = %q, want %q", c.Stdout(), want)
			}

			c, got = runChild(t, nil, args...)
			c.WantExit(got, exited0)
			calls := linesOf(t, outside)
			if len(calls) != tc.calls || calls[0] != key {
				t.Errorf("outside calls in the end = %q, want %d with key %s", calls, tc.calls, key)
			}
			s = show(t, db, runID)
			wantOut, _ := json.Marshal(tc.wantOut)
			if st, _ := s.step("pay"); st.Status != checkpoint.StepCompleted || string(st.Output) != string(wantOut) {
				t.Errorf("pay: %q, output %s; want completed with %s", st.Status, st.Output, wantOut)
			}
			wantRec, _ := json.Marshal("recorded " + tc.wantOut)
			if st, _ := s.step("record"); string(st.Output) != string(wantRec) {
				t.Errorf("record output = %s, want %s: the next step sees the settled result", st.Output, wantRec)
			}
			if s.Run.Status != checkpoint.RunSucceeded {
				t.Errorf("run status = %q, want succeeded", s.Run.Status)
			}
			if len(s.Audit) != 1 || s.Audit[0].Command != "resolve --step pay --as "+tc.as || s.Audit[0].Reason != reason {
				t.Errorf("audit = %+v, want the resolve with its reason", s.Audit)
			}
		})
	}

	reconciled := []struct {
		name    string
		point   string
		called  int
		wantOut string
	}{
		{"reconcile finds the call", "step:pay:before-result", 1, "found:" + key},
		{"reconcile does not find it: called once", "step:pay:after-intent", 0, "paid:" + key},
	}
	for _, tc := range reconciled {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, outside := testFiles(t)
			// A short lease: the rerun takes over at once (the runner is
			// gone) but reconciles only once the dead runner's lease is out.
			args := []string{"--db", db, "run", "pay", "-p", "key=k", "-p", "outside=" + outside, "-p", "reconcile=true", "--lease", "1s"}
			c, got := runChild(t, []string{crashtest.CrashAt(tc.point)}, args...)
			c.WantExit(got, sigkilled)
			settleKilled(t, c)
			if got := linesOf(t, outside); len(got) != tc.called {
				t.Fatalf("outside calls before the kill = %q, want %d", got, tc.called)
			}
			until := readRun(t, db, runID).info.Run.LeaseUntil
			c, got = runChild(t, nil, args...)
			c.WantExit(got, exited0)
			after := readRun(t, db, runID)
			// The rerun waits only when it took over within the lease (on a
			// loaded machine its start can take longer than the 1s lease).
			if atts := after.info.Attempts; len(atts) > 1 && atts[len(atts)-1].StartedAt.Before(until) &&
				!strings.Contains(c.Stderr(), "waiting out the previous runner's lease before reconciling") {
				t.Errorf("stderr does not log waiting out the dead runner's lease (taken over at %s, lease until %s):\n%s",
					atts[len(atts)-1].StartedAt, until, c.Stderr())
			}
			if at := after.steps["pay"].FinishedAt; at.Before(until) {
				t.Errorf("the call was settled at %s, before the dead runner's lease ended at %s", at, until)
			}
			if !strings.Contains(c.Stderr(), "reconciled an outside call of unknown outcome") {
				t.Errorf("stderr does not log the reconcile:\n%s", c.Stderr())
			}
			if got := linesOf(t, outside); len(got) != 1 || got[0] != key {
				t.Errorf("outside calls = %q, want exactly one, with key %s", got, key)
			}
			wantOut, _ := json.Marshal(tc.wantOut)
			if st, _ := show(t, db, runID).step("pay"); st.Status != checkpoint.StepCompleted || string(st.Output) != string(wantOut) {
				t.Errorf("pay: %q, output %s; want completed with %s", st.Status, st.Output, wantOut)
			}
		})
	}
}

// delivered is an outbox message as a delivery target received it.
type delivered struct {
	Key     string          `json:"key"`
	RunID   string          `json:"run_id"`
	Topic   string          `json:"topic"`
	Payload json.RawMessage `json:"payload"`
}

// readDelivered reads a file:PATH delivery target.
func readDelivered(t *testing.T, path string) []delivered {
	t.Helper()
	var out []delivered
	for _, l := range linesOf(t, path) {
		var d delivered
		if err := json.Unmarshal([]byte(l), &d); err != nil {
			t.Fatalf("%s: line %q: %v", path, l, err)
		}
		out = append(out, d)
	}
	return out
}

// checkDeliveredOnce fails unless path received exactly run key's
// notification, once.
func checkDeliveredOnce(t *testing.T, path, runKey string) {
	t.Helper()
	got := readDelivered(t, path)
	want := delivered{Key: "outbox/" + runKey + "/notify", RunID: "outbox/" + runKey, Topic: "settled",
		Payload: json.RawMessage(`{"date":"` + runKey + `","total":42}`)}
	if len(got) != 1 || got[0].Key != want.Key || got[0].RunID != want.RunID || got[0].Topic != want.Topic ||
		!bytes.Equal(got[0].Payload, want.Payload) {
		t.Fatalf("%s received %+v, want exactly %+v", path, got, want)
	}
}

// checkSent fails unless the run's one message is shown sent after tries
// delivery attempts.
func checkSent(t *testing.T, db, runID string, tries int) {
	t.Helper()
	ob := show(t, db, runID).Outbox
	if len(ob) != 1 || ob[0].Key != runID+"/notify" || ob[0].Status != checkpoint.MessageSent || ob[0].Tries != tries {
		t.Errorf("outbox of %s = %+v, want its message sent after %d tries", runID, ob, tries)
	}
}

func TestOutboxAcrossProcesses(t *testing.T) {
	t.Parallel()
	crashAfterCommit := []string{crashtest.CrashAt("step:notify:after-checkpoint")}
	runArgs := func(db, key string, more ...string) []string {
		return append([]string{"--db", db, "run", "outbox", "-p", "key=" + key}, more...)
	}

	t.Run("killed after the commit: the dispatcher delivers once", func(t *testing.T) {
		t.Parallel()
		db, to := testFiles(t)
		c, got := runChild(t, crashAfterCommit, runArgs(db, "k1")...)
		c.WantExit(got, sigkilled)
		settleKilled(t, c)
		if ob := show(t, db, "outbox/k1").Outbox; len(ob) != 1 || ob[0].Status != checkpoint.MessageQueued {
			t.Fatalf("outbox after the kill = %+v, want the message queued with its checkpoint", ob)
		}
		for pass, want := range []string{"dispatched: 1 sent, 0 failed", "dispatched: 0 sent, 0 failed"} {
			c, got = runChild(t, nil, "--db", db, "dispatch", "--to", "file:"+to)
			c.WantExit(got, exited0)
			if !strings.Contains(c.Stderr(), want) {
				t.Errorf("dispatch pass %d: stderr %q, want %q", pass+1, c.Stderr(), want)
			}
		}
		checkDeliveredOnce(t, to, "k1")
		// Finishing the run queues nothing twice and delivers nothing again.
		c, got = runChild(t, nil, runArgs(db, "k1", "--deliver", "file:"+to)...)
		c.WantExit(got, exited0)
		checkDeliveredOnce(t, to, "k1")
		checkSent(t, db, "outbox/k1", 1)
	})

	t.Run("killed after the commit: the next run delivers", func(t *testing.T) {
		t.Parallel()
		db, to := testFiles(t)
		c, got := runChild(t, crashAfterCommit, runArgs(db, "k2")...)
		c.WantExit(got, sigkilled)
		settleKilled(t, c)
		c, got = runChild(t, nil, runArgs(db, "k2", "--deliver", "file:"+to)...)
		c.WantExit(got, exited0)
		if want := "run outbox/k2 succeeded (attempt 2): 0 steps executed, 2 skipped"; !strings.Contains(c.Stdout(), want) {
			t.Errorf("rerun stdout = %q, want %q: both steps were checkpointed before the kill", c.Stdout(), want)
		}
		checkDeliveredOnce(t, to, "k2")
		checkSent(t, db, "outbox/k2", 1)
	})

	t.Run("fresh run with --deliver", func(t *testing.T) {
		t.Parallel()
		db, to := testFiles(t)
		c, got := runChild(t, nil, runArgs(db, "k3", "--deliver", "file:"+to)...)
		c.WantExit(got, exited0)
		checkDeliveredOnce(t, to, "k3")
		checkSent(t, db, "outbox/k3", 1)
	})

	t.Run("webhook on 127.0.0.1: killed before recording the delivery, delivered again with the same key", func(t *testing.T) {
		t.Parallel()
		db, _ := testFiles(t)
		c, got := runChild(t, nil, runArgs(db, "k4")...)
		c.WantExit(got, exited0)

		type request struct {
			path, key, topic string
			body             delivered
		}
		var (
			mu       sync.Mutex
			requests []request
		)
		victim := make(chan *crashtest.Child, 1) // the dispatcher to kill mid-delivery
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			req := request{path: r.URL.Path, key: r.Header.Get("Idempotency-Key"), topic: r.Header.Get("X-Stepwise-Topic")}
			if err := json.Unmarshal(b, &req.body); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			mu.Lock()
			requests = append(requests, req)
			first := len(requests) == 1
			mu.Unlock()
			if first {
				// The message arrived, but its sender dies before it
				// hears so and records the delivery.
				v := <-victim
				v.Kill()
				<-v.Done()
				return
			}
			w.WriteHeader(http.StatusNoContent)
		}))
		defer srv.Close()
		if !strings.HasPrefix(srv.URL, "http://127.0.0.1:") {
			t.Fatalf("test server at %s, want 127.0.0.1", srv.URL)
		}
		hook := srv.URL + "/hook"

		c = startChild(t, nil, nil, "--db", db, "dispatch", "--to", hook, "--visibility", "5s")
		victim <- c
		c.WantExit(c.Wait(), sigkilled)
		settleKilled(t, c)
		ob := show(t, db, "outbox/k4").Outbox
		if len(ob) != 1 || ob[0].Status != checkpoint.MessageQueued || ob[0].Tries != 0 {
			t.Fatalf("outbox after the dispatcher died = %+v, want the message still queued, no try recorded", ob)
		}
		// The dead dispatcher's claim hides the message until its window
		// ends (its next_at); then the next dispatcher takes it.
		if c, got = runChild(t, nil, "--db", db, "dispatch", "--to", hook); !strings.Contains(c.Stderr(), "dispatched: 0 sent, 0 failed") {
			t.Errorf("dispatch within the dead dispatcher's window: stderr %q, want nothing sent", c.Stderr())
		}
		c.WantExit(got, exited0)
		time.Sleep(time.Until(ob[0].NextAt)) // a real window on the real clock of two processes
		for pass, want := range []string{"dispatched: 1 sent, 0 failed", "dispatched: 0 sent, 0 failed"} {
			c, got = runChild(t, nil, "--db", db, "dispatch", "--to", hook)
			c.WantExit(got, exited0)
			if !strings.Contains(c.Stderr(), want) {
				t.Errorf("dispatch pass %d: stderr %q, want %q", pass+1, c.Stderr(), want)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(requests) != 2 {
			t.Fatalf("the webhook received %d requests, want 2 (at least once: again after the lost acknowledgement, then never)", len(requests))
		}
		for i, r := range requests {
			if r.path != "/hook" || r.key != "outbox/k4/notify" || r.body.Key != r.key || r.topic != "settled" ||
				r.body.RunID != "outbox/k4" || string(r.body.Payload) != `{"date":"k4","total":42}` {
				t.Errorf("request %d = %+v; want POST /hook with Idempotency-Key outbox/k4/notify and the envelope", i+1, r)
			}
		}
		checkSent(t, db, "outbox/k4", 1)
	})
}

func TestRetriesEndToEnd(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		params    []string
		code      int
		tries     int    // the step's checkpointed try count, and its function's calls
		status    string // the step's
		retrying  int    // "retrying" log lines
		errorText string // in stderr
	}{
		{"transient twice, then success", nil, ExitOK, 3, checkpoint.StepCompleted, 2, ""},
		{"permanent: tried once", []string{"permanent=true"}, ExitFailed, 1, checkpoint.StepFailed, 0, "bad input: account closed"},
		{"retries run out", []string{"fails=5"}, ExitFailed, 3, checkpoint.StepFailed, 2, "provider busy (try 3) (gave up after 3 tries)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, side := testFiles(t)
			args := []string{"--db", db, "run", "flaky", "-p", "key=k", "-p", "side=" + side}
			for _, p := range tc.params {
				args = append(args, "-p", p)
			}
			c, got := runChild(t, nil, args...)
			c.WantExit(got, crashtest.Code(tc.code))
			if n := len(linesOf(t, side)); n != tc.tries {
				t.Errorf("the step's function ran %d times, want %d", n, tc.tries)
			}
			if n := strings.Count(c.Stderr(), "step failed; retrying"); n != tc.retrying {
				t.Errorf("%d retry log lines, want %d\nstderr:\n%s", n, tc.retrying, c.Stderr())
			}
			if !strings.Contains(c.Stderr(), tc.errorText) {
				t.Errorf("stderr = %q, want it to contain %q", c.Stderr(), tc.errorText)
			}
			st, ok := show(t, db, "flaky/k").step("fetch")
			if !ok || st.Tries != tc.tries || st.Status != tc.status {
				t.Errorf("show --json: fetch %+v, want %s after %d tries", st, tc.status, tc.tries)
			}
		})
	}
}

// TestSIGTERMDuringOutsideCall interrupts an outside call after the outside
// system received it, while the call waits for the answer and gives up
// when its context ends (as an HTTP client does). Whether the call took
// effect is unknown, as after a timeout, so the rerun must not call again.
func TestSIGTERMDuringOutsideCall(t *testing.T) {
	t.Parallel()
	db, outside := testFiles(t)
	release := filepath.Join(filepath.Dir(outside), "release")
	args := []string{"--db", db, "run", "pay", "-p", "key=k", "-p", "outside=" + outside, "-p", "block=" + release}
	c := startChild(t, nil, nil, args...)
	c.WaitFor("the outside system called", func() bool { return len(linesOf(t, outside)) == 1 })
	if err := c.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.WantExit(c.Wait(), crashtest.Code(ExitInterrupted))
	if st, _ := show(t, db, "pay/k").step("pay"); st.Status != checkpoint.StepCalling {
		t.Errorf("pay is %q after the interrupt, want %q", st.Status, checkpoint.StepCalling)
	}

	touch(t, release)
	c, got := runChild(t, nil, args...)
	if calls := linesOf(t, outside); len(calls) != 1 {
		t.Errorf("the outside system was called %d times, want once: a call cut off by SIGTERM has an unknown outcome", len(calls))
	}
	c.WantExit(got, crashtest.Code(ExitOperator))
	if want := "stepwise resolve pay/k --step pay --as done|retry"; !strings.Contains(c.Stderr(), want) {
		t.Errorf("stderr = %q, want it to name %s", c.Stderr(), want)
	}
}
