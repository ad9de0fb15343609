package runner_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// droppedConnection is a store fault as a backend reports one: it matches
// checkpoint.ErrTransient and names the server.
type droppedConnection struct{}

func (droppedConnection) Error() string {
	return "server test:5432, database d: the server closed the connection"
}
func (droppedConnection) Unwrap() error { return checkpoint.ErrTransient }

// faultyStore is a real store whose next fail writes (InTx) fail with a
// dropped connection, after the write went through on every even fault
// (a commit whose answer was lost) and before it on every odd one.
type faultyStore struct {
	checkpoint.Backend
	fail, faults atomic.Int64
}

func (s *faultyStore) InTx(ctx context.Context, l checkpoint.Lease, fn func(checkpoint.Tx) error) error {
	if s.fail.Add(-1) < 0 {
		return s.Backend.InTx(ctx, l, fn)
	}
	if s.faults.Add(1)%2 == 0 {
		if err := s.Backend.InTx(ctx, l, fn); err != nil {
			return err
		}
	}
	return droppedConnection{}
}

// faultJob has three steps and a store retry policy of tries tries with
// millisecond backoffs.
func faultJob(tries int, calls map[string]*atomic.Int64) *jobs.Definition[jobParams] {
	return jobs.Define("job", func(ctx context.Context, run *steps.Run, p jobParams) error {
		for _, id := range []string{"load", "price", "summary"} {
			if _, err := steps.Do(ctx, run, id, func(context.Context) (string, error) {
				calls[id].Add(1)
				return id, nil
			}); err != nil {
				return err
			}
		}
		return nil
	}, jobs.Retry(steps.RetryPolicy{MaxTries: tries, Initial: time.Millisecond, Max: 5 * time.Millisecond}))
}

func faultRunner(t *testing.T, st checkpoint.Backend, tries int, metrics ...*runner.Metrics) (*runner.Runner, map[string]*atomic.Int64) {
	t.Helper()
	calls := map[string]*atomic.Int64{"load": {}, "price": {}, "summary": {}}
	reg := &jobs.Registry{}
	reg.MustRegister(faultJob(tries, calls))
	cfg := runner.Config{Store: st, Jobs: reg, Owner: "test:1"}
	if len(metrics) > 0 {
		cfg.Metrics = metrics[0]
	}
	r, err := runner.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r, calls
}

// A dropped connection mid-run is a transient fault: the attempt goes on
// from its checkpoints under the job's retry policy and the run succeeds
// in its first attempt, every completed step kept (a commit whose answer
// was lost is found committed).
func TestTransientStoreFaultIsTriedAgain(t *testing.T) {
	st := &faultyStore{Backend: checkpointtest.Open(t)}
	reg := prometheus.NewRegistry()
	m, err := runner.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	r, calls := faultRunner(t, st, 5, m)
	st.fail.Store(3) // the run's first three writes fail
	res, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
	if err != nil || res.Status != checkpoint.RunSucceeded || res.Attempt != 1 {
		t.Fatalf("run: %+v, %v; want succeeded in attempt 1 after the faults", res, err)
	}
	if got := st.faults.Load(); got != 3 {
		t.Fatalf("%d faults injected, want 3", got)
	}
	if s := series(t, reg, "stepwise_store_faults_total", map[string]string{"job": "job"}); s == nil || s.GetCounter().GetValue() != 3 {
		t.Errorf("stepwise_store_faults_total = %v; want 3", s)
	}
	for id, n := range calls {
		if n.Load() < 1 || n.Load() > 3 {
			t.Errorf("step %s called %d times; want at least once, and again only after a fault", id, n.Load())
		}
	}
	info, err := st.Run(context.Background(), testRunID)
	if err != nil {
		t.Fatal(err)
	}
	completed := 0
	if err := st.Steps(context.Background(), testRunID, func(s checkpoint.Step) error {
		if s.Status == checkpoint.StepCompleted {
			completed++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(info.Attempts) != 1 || completed != 3 {
		t.Errorf("attempts %+v, %d steps completed; want one attempt and three steps", info.Attempts, completed)
	}
}

// Once the policy is exhausted a lone run fails, with an error that is
// still a transient fault, names the store and says to resume it; the
// resume then succeeds.
func TestTransientStoreFaultExhaustedFailsTheLoneRun(t *testing.T) {
	st := &faultyStore{Backend: checkpointtest.Open(t)}
	r, _ := faultRunner(t, st, 3)
	st.fail.Store(1 << 30)
	res, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
	var fault *runner.StoreFaultError
	if !errors.As(err, &fault) || !errors.Is(err, checkpoint.ErrTransient) || res.Status != checkpoint.RunFailed {
		t.Fatalf("run: %+v, %v; want failed with a *runner.StoreFaultError", res, err)
	}
	if fault.Tries != 3 || !strings.Contains(err.Error(), "server test:5432") || !strings.Contains(err.Error(), "stepwise resume "+testRunID) {
		t.Errorf("error %q (tries %d): want 3 tries, the server named and the resume command", err, fault.Tries)
	}
	st.fail.Store(0)
	if res, err := r.Resume(context.Background(), testRunID, runner.Request{}); err != nil || res.Status != checkpoint.RunSucceeded {
		t.Fatalf("resume: %+v, %v", res, err)
	}
}

// A pooled run whose attempt gave up on store faults goes back to its
// queue, interrupted, due again only after a backoff on the store's
// clock: a claim before then finds nothing, one after it takes the run
// and finishes it, with no operator. Its attempts stay within the policy:
// the last one fails the run.
func TestTransientStoreFaultRequeuesAPooledRun(t *testing.T) {
	ctx := context.Background()
	st := &faultyStore{Backend: checkpointtest.Open(t)}
	r, _ := faultRunner(t, st, 3)
	if _, err := r.Enqueue(ctx, runner.EnqueueRequest{Job: "job", Values: testValues}); err != nil {
		t.Fatal(err)
	}
	claim := func(now time.Time) (checkpoint.Claim, bool) {
		t.Helper()
		c, ok, err := st.ClaimNext(ctx, checkpoint.ClaimNextRequest{Owner: "test:1", Now: now, LeaseFor: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return c, ok
	}
	st.fail.Store(3) // the first attempt's three tries
	now := time.Now()
	c, ok := claim(now)
	if !ok {
		t.Fatal("the queued run is not claimable")
	}
	res, err := r.Drive(ctx, c, now)
	var fault *runner.StoreFaultError
	if !errors.As(err, &fault) || fault.RetryIn <= 0 || res.Status != checkpoint.RunInterrupted {
		t.Fatalf("drive: %+v, %v; want interrupted, back in the queue with a retry time", res, err)
	}
	if !strings.Contains(err.Error(), "no operator needed") {
		t.Errorf("error %q: want it to say a worker tries again by itself", err)
	}
	info, err := st.Run(ctx, testRunID)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.Run.AvailableAt.Sub(info.Run.UpdatedAt); got < fault.RetryIn-time.Millisecond || got > fault.RetryIn+time.Millisecond {
		t.Errorf("available %s after its end; want the backoff %s", got, fault.RetryIn)
	}
	if _, ok := claim(info.Run.UpdatedAt.Add(fault.RetryIn / 2)); ok {
		t.Fatal("claimed before its not-before")
	}
	c, ok = claim(info.Run.AvailableAt.Add(time.Millisecond))
	if !ok {
		t.Fatal("not claimable after its not-before")
	}
	if res, err := r.Drive(ctx, c, time.Now()); err != nil || res.Status != checkpoint.RunSucceeded || res.Attempt != 2 {
		t.Fatalf("second attempt: %+v, %v; want succeeded in attempt 2", res, err)
	}
}

// A pooled run out of attempts is recorded failed, with the resume
// command in its error.
func TestTransientStoreFaultPooledRunOutOfAttemptsFails(t *testing.T) {
	ctx := context.Background()
	st := &faultyStore{Backend: checkpointtest.Open(t)}
	r, _ := faultRunner(t, st, 2)
	if _, err := r.Enqueue(ctx, runner.EnqueueRequest{Job: "job", Values: testValues}); err != nil {
		t.Fatal(err)
	}
	st.fail.Store(1 << 30)
	now := time.Now()
	for attempt := 1; attempt <= 2; attempt++ {
		c, ok, err := st.ClaimNext(ctx, checkpoint.ClaimNextRequest{Owner: "test:1", Now: now, LeaseFor: time.Minute})
		if err != nil || !ok {
			t.Fatalf("attempt %d: claim %v, %v", attempt, ok, err)
		}
		res, err := r.Drive(ctx, c, now)
		want := checkpoint.RunInterrupted
		if attempt == 2 {
			want = checkpoint.RunFailed
		}
		if res.Status != want || !errors.Is(err, checkpoint.ErrTransient) {
			t.Fatalf("attempt %d: %+v, %v; want %s", attempt, res, err, want)
		}
		now = now.Add(time.Minute)
	}
	info, err := st.Run(ctx, testRunID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Run.Status != checkpoint.RunFailed || !strings.Contains(info.Run.Error, "resume it with `stepwise resume") {
		t.Errorf("run %s: %q; want failed, saying how to resume", info.Run.Status, info.Run.Error)
	}
}
