package runner_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

type jobParams struct {
	Date string `param:"date,key" format:"date"`
	Note string `param:"note"`
}

const testRunID = "job/2026-11-28"

var testValues = map[string]string{"date": "2026-11-28"}

// harness is a store, a registry holding one job named "job", and the
// job's body, set by each test.
type harness struct {
	t     *testing.T
	st    checkpoint.Backend
	reg   *jobs.Registry
	job   *jobs.Definition[jobParams]
	body  func(ctx context.Context, run *steps.Run, p jobParams) error
	calls map[string]int
	mu    sync.Mutex
}

func newHarness(t *testing.T) *harness { return newHarnessOn(t, checkpointtest.Open(t)) }

// newHarnessOn is newHarness on a store of the test's choosing.
func newHarnessOn(t *testing.T, st checkpoint.Backend) *harness {
	h := &harness{t: t, st: st, reg: &jobs.Registry{}, calls: map[string]int{}}
	h.job = jobs.Define("job", func(ctx context.Context, run *steps.Run, p jobParams) error {
		return h.body(ctx, run, p)
	})
	h.reg.MustRegister(h.job)
	return h
}

// step runs a checkpointed step that counts its calls and returns the
// step's ID.
func (h *harness) step(ctx context.Context, run *steps.Run, id string) error {
	_, err := steps.Do(ctx, run, id, func(context.Context) (string, error) {
		h.mu.Lock()
		h.calls[id]++
		h.mu.Unlock()
		return id, nil
	})
	return err
}

func (h *harness) called(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[id]
}

func (h *harness) runner(mod func(*runner.Config)) *runner.Runner {
	h.t.Helper()
	cfg := runner.Config{Store: h.st, Jobs: h.reg, Owner: "test:1"}
	if mod != nil {
		mod(&cfg)
	}
	r, err := runner.New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

func (h *harness) info() checkpoint.RunInfo {
	h.t.Helper()
	info, err := h.st.Run(context.Background(), testRunID)
	if err != nil {
		h.t.Fatal(err)
	}
	return info
}

func (h *harness) decoded() jobs.Decoded {
	h.t.Helper()
	d, err := h.job.Decode(testValues, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	return d
}

// claimAs claims the test run for another runner, as a second process would.
func (h *harness) claimAs(owner string, now time.Time, lease time.Duration) (checkpoint.Claim, error) {
	d := h.decoded()
	return h.st.Claim(context.Background(), checkpoint.ClaimRequest{
		RunID: testRunID, Job: "job", RunKey: d.RunKey, Params: d.JSON, ParamsHash: d.Hash,
		Owner: owner, Now: now, LeaseFor: lease,
	})
}

func threeSteps(h *harness) func(ctx context.Context, run *steps.Run, p jobParams) error {
	return func(ctx context.Context, run *steps.Run, p jobParams) error {
		for _, id := range []string{"load", steps.ID("price", "O-1"), "summary"} {
			if err := h.step(ctx, run, id); err != nil {
				return err
			}
		}
		return nil
	}
}

func TestRunThenRerunSkips(t *testing.T) {
	h := newHarness(t)
	h.body = threeSteps(h)
	r := h.runner(nil)
	ctx := context.Background()

	res, err := r.Run(ctx, runner.Request{Job: "job", Values: testValues})
	if err != nil {
		t.Fatal(err)
	}
	want := runner.Result{RunID: testRunID, Status: checkpoint.RunSucceeded, Attempt: 1, Stats: steps.Stats{Executed: 3}}
	if res.RunID != want.RunID || res.Status != want.Status || res.Attempt != want.Attempt || res.Stats != want.Stats {
		t.Errorf("first run = %+v; want %+v", res, want)
	}

	// A plain rerun of a succeeded run does nothing.
	_, err = r.Run(ctx, runner.Request{Job: "job", Values: testValues})
	if !errors.Is(err, checkpoint.ErrAlreadySucceeded) {
		t.Errorf("rerun of a succeeded run: err = %v; want ErrAlreadySucceeded", err)
	}

	// A forced rerun runs the job again and skips every step.
	res, err = r.Run(ctx, runner.Request{Job: "job", Values: testValues, Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != checkpoint.RunSucceeded || res.Attempt != 2 || res.Stats != (steps.Stats{Skipped: 3}) {
		t.Errorf("forced rerun = %+v; want succeeded, attempt 2, 3 skipped", res)
	}
	for _, id := range []string{"load", "price/O-1", "summary"} {
		if n := h.called(id); n != 1 {
			t.Errorf("step %s ran %d times; want 1", id, n)
		}
	}
	if info := h.info(); info.Run.Status != checkpoint.RunSucceeded || len(info.Attempts) != 2 {
		t.Errorf("run = %+v with %d attempts; want succeeded, 2 attempts", info.Run, len(info.Attempts))
	}
}

func TestRunRefusesOtherParamsForSameKey(t *testing.T) {
	h := newHarness(t)
	h.body = threeSteps(h)
	r := h.runner(nil)
	if _, err := r.Run(context.Background(), runner.Request{Job: "job", Values: map[string]string{"date": "2026-11-28", "note": "a"}}); err != nil {
		t.Fatal(err)
	}
	_, err := r.Run(context.Background(), runner.Request{Job: "job", Values: map[string]string{"date": "2026-11-28", "note": "b"}, Force: true})
	var mm *checkpoint.ParamsMismatchError
	if !errors.As(err, &mm) {
		t.Fatalf("other jobParams for the same key: err = %v; want *ParamsMismatchError", err)
	}
	if _, err := r.Run(context.Background(), runner.Request{Job: "nope", Values: testValues}); !errors.Is(err, jobs.ErrUnknownJob) {
		t.Errorf("unknown job: err = %v; want jobs.ErrUnknownJob", err)
	}
	if _, err := r.Run(context.Background(), runner.Request{Job: "job", Values: map[string]string{"date": "x"}}); !errors.Is(err, jobs.ErrBadParams) {
		t.Errorf("bad params: err = %v; want jobs.ErrBadParams", err)
	}
}

func TestJobErrorFailsRunAndRerunResumes(t *testing.T) {
	h := newHarness(t)
	boom := errors.New("price service down")
	fail := true
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
		if err := h.step(ctx, run, "load"); err != nil {
			return err
		}
		_, err := steps.Do(ctx, run, "price", func(context.Context) (int, error) {
			h.mu.Lock()
			h.calls["price"]++
			h.mu.Unlock()
			if fail {
				return 0, boom
			}
			return 1, nil
		})
		return err
	}
	r := h.runner(nil)
	res, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
	if !errors.Is(err, boom) {
		t.Fatalf("failing job: err = %v; want the step's error", err)
	}
	if res.Status != checkpoint.RunFailed || res.Stats != (steps.Stats{Executed: 1, Failed: 1}) {
		t.Errorf("failed run result = %+v; want failed, 1 executed, 1 failed", res)
	}
	info := h.info()
	if info.Run.Status != checkpoint.RunFailed || info.Attempts[0].Status != checkpoint.RunFailed || info.Run.Error == "" {
		t.Errorf("stored run = %+v, attempt %+v; want both failed with the error", info.Run, info.Attempts[0])
	}

	fail = false
	res, err = r.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != checkpoint.RunSucceeded || res.Attempt != 2 || res.Stats != (steps.Stats{Executed: 1, Skipped: 1}) {
		t.Errorf("rerun = %+v; want succeeded, attempt 2, load skipped, price executed", res)
	}
	if h.called("load") != 1 || h.called("price") != 2 {
		t.Errorf("calls = %v; want load once, price twice", h.calls)
	}
}

func TestCancelMidJobInterrupts(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.body = func(stepCtx context.Context, run *steps.Run, p jobParams) error {
		if err := h.step(stepCtx, run, "load"); err != nil {
			return err
		}
		cancel() // SIGINT arrives between two steps
		return h.step(stepCtx, run, "post")
	}
	r := h.runner(nil)
	res, err := r.Run(ctx, runner.Request{Job: "job", Values: testValues})
	if !errors.Is(err, runner.ErrInterrupted) {
		t.Fatalf("cancelled run: err = %v; want runner.ErrInterrupted", err)
	}
	if res.Status != checkpoint.RunInterrupted || res.Stats != (steps.Stats{Executed: 1}) {
		t.Errorf("result = %+v; want interrupted after 1 executed step", res)
	}
	info := h.info()
	if info.Run.Status != checkpoint.RunInterrupted || info.Attempts[0].Status != checkpoint.RunInterrupted || info.Run.LeaseOwner != "" {
		t.Errorf("stored run = %+v, attempt %+v; want interrupted, lease released", info.Run, info.Attempts[0])
	}
	if h.called("post") != 0 {
		t.Errorf("post ran after the cancel")
	}

	// Resumable: the next run skips load and runs post.
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
		if err := h.step(ctx, run, "load"); err != nil {
			return err
		}
		return h.step(ctx, run, "post")
	}
	res, err = r.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
	if err != nil || res.Status != checkpoint.RunSucceeded || res.Stats != (steps.Stats{Executed: 1, Skipped: 1}) {
		t.Errorf("rerun after interrupt = %+v, %v; want succeeded, load skipped, post executed", res, err)
	}
}

func TestCancelInsideStepInterrupts(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.body = func(stepCtx context.Context, run *steps.Run, p jobParams) error {
		_, err := steps.Do(stepCtx, run, "wait", func(ctx context.Context) (int, error) {
			cancel()
			<-ctx.Done() // a step that honours its context
			return 0, ctx.Err()
		})
		return err
	}
	r := h.runner(nil)
	res, err := r.Run(ctx, runner.Request{Job: "job", Values: testValues})
	if !errors.Is(err, runner.ErrInterrupted) || res.Status != checkpoint.RunInterrupted {
		t.Fatalf("run cancelled inside a step = %+v, %v; want interrupted", res, err)
	}
	if h.info().Run.Status != checkpoint.RunInterrupted {
		t.Errorf("stored status = %s; want interrupted", h.info().Run.Status)
	}
}

func TestStepFinishingDuringCancelIsKept(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.body = func(stepCtx context.Context, run *steps.Run, p jobParams) error {
		_, err := steps.Do(stepCtx, run, "upload", func(context.Context) (string, error) {
			h.mu.Lock()
			h.calls["upload"]++
			h.mu.Unlock()
			cancel() // SIGTERM arrives while the step finishes its work
			return "file-0042", nil
		})
		if err != nil {
			return err
		}
		return h.step(stepCtx, run, "notify")
	}
	r := h.runner(nil)
	res, err := r.Run(ctx, runner.Request{Job: "job", Values: testValues})
	if !errors.Is(err, runner.ErrInterrupted) || res.Status != checkpoint.RunInterrupted || res.Stats.Executed != 1 {
		t.Fatalf("run = %+v, %v; want interrupted after upload executed", res, err)
	}
	res, err = r.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
	if err != nil || res.Stats != (steps.Stats{Executed: 1, Skipped: 1}) {
		t.Errorf("rerun = %+v, %v; want upload skipped (its result was kept), notify executed", res, err)
	}
	if h.called("upload") != 1 || h.called("notify") != 1 {
		t.Errorf("calls = %v; want upload and notify once each", h.calls)
	}
}

func TestHeldLeaseRefusedOrWaitedFor(t *testing.T) {
	h := newHarness(t)
	h.body = threeSteps(h)
	const leaseFor = 300 * time.Millisecond
	claimedAt := time.Now()
	if _, err := h.claimAs("elsewhere:1", claimedAt, leaseFor); err != nil {
		t.Fatal(err)
	}

	// Without Wait: refused at once.
	_, err := h.runner(nil).Run(context.Background(), runner.Request{Job: "job", Values: testValues})
	var held *checkpoint.LeaseHeldError
	if !errors.As(err, &held) || held.Owner != "elsewhere:1" {
		t.Fatalf("run of a held run: err = %v; want *LeaseHeldError naming elsewhere:1", err)
	}

	// Wait, interrupted before the lease ends. When the deadline falls
	// between two polls the error is ErrInterrupted; when it falls inside a
	// Store.Claim the bare context error comes back (see the report: claim
	// should wrap it in ErrInterrupted too).
	shortCtx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	waiting := h.runner(func(c *runner.Config) { c.Wait, c.WaitPoll = true, 10*time.Millisecond })
	_, err = waiting.Run(shortCtx, runner.Request{Job: "job", Values: testValues})
	if !errors.Is(err, runner.ErrInterrupted) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("wait cancelled by its context: err = %v; want ErrInterrupted", err)
	}
	if time.Since(claimedAt) >= leaseFor {
		t.Fatalf("the cancelled wait took longer than the other runner's lease; the test cannot go on")
	}
	if info := h.info(); info.Run.LeaseOwner != "elsewhere:1" || len(info.Attempts) != 1 {
		t.Errorf("cancelled wait changed the run: %+v, %d attempts", info.Run, len(info.Attempts))
	}

	// Wait: succeeds once the lease has expired.
	res, err := waiting.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(claimedAt); waited < leaseFor {
		t.Errorf("run finished %s after the other claim; want after its %s lease", waited, leaseFor)
	}
	if res.Status != checkpoint.RunSucceeded || res.TookOverFrom != "elsewhere:1" || res.Attempt != 2 || res.Stats.Executed != 3 {
		t.Errorf("result = %+v; want succeeded, taken over from elsewhere:1, attempt 2", res)
	}
	if a := h.info().Attempts[0]; a.Status != checkpoint.AttemptLost {
		t.Errorf("other runner's attempt = %+v; want lost", a)
	}
}

// fakeClock is a controllable clock (waits are real).
type fakeClock struct {
	runner.SystemClock
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestClockControlsRecordedTimes(t *testing.T) {
	h := newHarness(t)
	start := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	clock := &fakeClock{now: start}
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
		_, err := steps.Do(ctx, run, "load", func(context.Context) (int, error) {
			clock.Advance(5 * time.Second)
			return 1, nil
		})
		return err
	}
	r := h.runner(func(c *runner.Config) { c.Clock = clock })
	if _, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues}); err != nil {
		t.Fatal(err)
	}
	end := start.Add(5 * time.Second)
	info := h.info()
	a := info.Attempts[0]
	if !a.StartedAt.Equal(start) || !a.FinishedAt.Equal(end) {
		t.Errorf("attempt times = %s..%s; want %s..%s from the fake clock", a.StartedAt, a.FinishedAt, start, end)
	}
	if !info.Run.CreatedAt.Equal(start) || !info.Run.FinishedAt.Equal(end) {
		t.Errorf("run times = created %s finished %s; want %s, %s", info.Run.CreatedAt, info.Run.FinishedAt, start, end)
	}
	var step checkpoint.Step
	if err := h.st.Steps(context.Background(), testRunID, func(s checkpoint.Step) error { step = s; return nil }); err != nil {
		t.Fatal(err)
	}
	if !step.StartedAt.Equal(start) || !step.FinishedAt.Equal(end) {
		t.Errorf("step times = %s..%s; want %s..%s", step.StartedAt, step.FinishedAt, start, end)
	}
}

func TestHeartbeatKeepsLeaseAndStops(t *testing.T) {
	h := newHarness(t)
	// A lease long enough that a loaded machine's scheduling delays never
	// outlast it; the step probes until the heartbeats have extended it
	// by half its length (at least two of them), not for a set time.
	const lease = 2 * time.Second
	var firstUntil, lastUntil time.Time
	var probes, refused atomic.Int32
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
		_, err := steps.Do(ctx, run, "work", func(context.Context) (int, error) {
			firstUntil = h.info().Run.LeaseUntil
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) && (refused.Load() < 5 || !lastUntil.After(firstUntil.Add(lease/2))) {
				time.Sleep(25 * time.Millisecond)
				// Another runner tries to take the run over meanwhile.
				probes.Add(1)
				_, err := h.claimAs("other:9", time.Now(), time.Minute)
				var held *checkpoint.LeaseHeldError
				if !errors.As(err, &held) {
					t.Errorf("claim during the run at %s: err = %v; want *LeaseHeldError (lease ends %s)",
						time.Now().Format("15:04:05.000"), err, h.info().Run.LeaseUntil.Format("15:04:05.000"))
					return 0, err
				}
				refused.Add(1)
				lastUntil = held.Until
			}
			return 1, nil
		})
		return err
	}
	r := h.runner(func(c *runner.Config) { c.Lease = lease })
	before := runtime.NumGoroutine()
	res, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
	if err != nil || res.Status != checkpoint.RunSucceeded {
		t.Fatalf("run = %+v, %v; want succeeded", res, err)
	}
	if refused.Load() < 5 || refused.Load() != probes.Load() {
		t.Errorf("%d of %d takeover attempts refused; want all of at least 5", refused.Load(), probes.Load())
	}
	if !lastUntil.After(firstUntil.Add(lease / 2)) {
		t.Errorf("lease_until went from %s to %s; want heartbeats to extend it", firstUntil, lastUntil)
	}
	if info := h.info(); info.Run.LeaseOwner != "" || !info.Run.LeaseUntil.IsZero() || len(info.Attempts) != 1 {
		t.Errorf("after the run: %+v, %d attempts; want lease released, one attempt", info.Run, len(info.Attempts))
	}

	// The heartbeat goroutine (and anything else Run started) is gone.
	after := runtime.NumGoroutine()
	for i := 0; i < 100 && after > before; i++ {
		time.Sleep(10 * time.Millisecond)
		after = runtime.NumGoroutine()
	}
	if after > before {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines after Run, %d before:\n%s", after, before, buf[:runtime.Stack(buf, true)])
	}
}

func TestLeaseLostStopsRun(t *testing.T) {
	h := newHarness(t)
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
		if err := h.step(ctx, run, "load"); err != nil {
			return err
		}
		// The runner pauses; its lease expires and another runner claims.
		if _, err := h.claimAs("other:9", time.Now().Add(time.Hour), time.Minute); err != nil {
			t.Errorf("takeover: %v", err)
		}
		return h.step(ctx, run, "post")
	}
	res, err := h.runner(nil).Run(context.Background(), runner.Request{Job: "job", Values: testValues})
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("run that lost its lease: err = %v; want checkpoint.ErrFenced", err)
	}
	if res.Status != checkpoint.RunRunning {
		t.Errorf("result status = %q; want running (the other runner owns it)", res.Status)
	}
	info := h.info()
	if info.Run.Status != checkpoint.RunRunning || info.Run.LeaseOwner != "other:9" || info.Attempts[0].Status != checkpoint.AttemptLost {
		t.Errorf("run = %+v, attempt 1 %+v; want still running under other:9, attempt 1 lost", info.Run, info.Attempts[0])
	}
	var ids []string
	h.st.Steps(context.Background(), testRunID, func(s checkpoint.Step) error { ids = append(ids, s.ID); return nil })
	if len(ids) != 1 || ids[0] != "load" {
		t.Errorf("recorded steps = %v; want only load (post was fenced)", ids)
	}
}

func TestNewValidatesConfig(t *testing.T) {
	st := checkpointtest.Open(t)
	reg := &jobs.Registry{}
	for name, cfg := range map[string]runner.Config{
		"no store":                              {Jobs: reg},
		"no jobs":                               {Store: st},
		"negative lease":                        {Store: st, Jobs: reg, Lease: -time.Second},
		"tiny lease":                            {Store: st, Jobs: reg, Lease: 10 * time.Millisecond},
		"negative poll":                         {Store: st, Jobs: reg, WaitPoll: -time.Second},
		"negative self-fence margin":            {Store: st, Jobs: reg, SelfFenceMargin: -time.Second},
		"self-fence margin over half the lease": {Store: st, Jobs: reg, Lease: 30 * time.Second, SelfFenceMargin: 16 * time.Second},
		"self-fence margin over half the default lease": {Store: st, Jobs: reg, SelfFenceMargin: 20 * time.Second},
	} {
		if _, err := runner.New(cfg); err == nil {
			t.Errorf("New with %s: want an error", name)
		}
	}
	if _, err := runner.New(runner.Config{Store: st, Jobs: reg}); err != nil {
		t.Errorf("New with defaults: %v", err)
	}
	if _, err := runner.New(runner.Config{Store: st, Jobs: reg, Lease: 30 * time.Second, SelfFenceMargin: 15 * time.Second}); err != nil {
		t.Errorf("New with a self-fence margin of half the lease: %v", err)
	}
}

// TestStepTimeoutIsNotTheJobDeadline checks that a run is reported as past
// its deadline only when the job's own deadline passed, not when a step's
// timeout ended the step (an outside call's, say).
func TestStepTimeoutIsNotTheJobDeadline(t *testing.T) {
	blocked := func(ctx context.Context, run *steps.Run, _ jobParams) error {
		_, err := steps.Do(ctx, run, "slow", func(ctx context.Context) (int, error) {
			<-ctx.Done()
			return 0, ctx.Err()
		}, steps.Timeout(time.Millisecond))
		return err
	}
	h := newHarness(t)
	h.body = blocked
	_, err := h.runner(nil).Run(context.Background(), runner.Request{Job: "job", Values: testValues})
	if err == nil || strings.Contains(err.Error(), "deadline of") || h.info().Run.Status != checkpoint.RunFailed {
		t.Errorf("a step's timeout: %v (run %s); want the run failed with the step's error, not a job deadline", err, h.info().Run.Status)
	}

	reg := &jobs.Registry{}
	reg.MustRegister(jobs.Define("job", func(ctx context.Context, run *steps.Run, p jobParams) error {
		_, err := steps.Do(ctx, run, "slow", func(ctx context.Context) (int, error) {
			<-ctx.Done()
			return 0, ctx.Err()
		})
		return err
	}, jobs.Deadline(20*time.Millisecond)))
	r, err := runner.New(runner.Config{Store: checkpointtest.Open(t), Jobs: reg, Owner: "test:1"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
	if err == nil || !strings.Contains(err.Error(), "deadline of 20ms passed") {
		t.Errorf("the job's deadline: %v; want it named", err)
	}
}
