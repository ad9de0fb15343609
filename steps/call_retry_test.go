package steps_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/steps"
)

// callClock is a fixed clock whose sleeps advance it, recording each delay
// and, through onSleep, letting a test look at the checkpoint mid-wait.
type callClock struct {
	mu      sync.Mutex
	now     time.Time
	delays  []time.Duration
	onSleep func(d time.Duration)
}

func (c *callClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *callClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.delays = append(c.delays, d)
	c.now = c.now.Add(d)
	f := c.onSleep
	c.mu.Unlock()
	if f != nil {
		f(d)
	}
	return ctx.Err()
}

var callStart = time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)

// beginCall claims "pay/d" (taking over any earlier attempt at once) and
// begins an attempt on it with cfg's policy, lease and clock.
func beginCall(t *testing.T, st checkpoint.Backend, clock *callClock, cfg steps.Config) *steps.Run {
	t.Helper()
	c, err := st.Claim(context.Background(), checkpoint.ClaimRequest{RunID: "pay/d", Job: "pay", RunKey: "d", Params: []byte("{}"),
		ParamsHash: "h", Owner: "t:1", Now: clock.Now(), LeaseFor: time.Minute, OwnerGone: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store, cfg.Lease, cfg.Now, cfg.Sleep = st, c.Lease, clock.Now, clock.Sleep
	if cfg.PreviousLeaseUntil.IsZero() {
		cfg.PreviousLeaseUntil = c.PreviousLeaseUntil
	}
	run, err := steps.Begin(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Close() })
	return run
}

func callStep(t *testing.T, st checkpoint.Backend, id string) checkpoint.Step {
	t.Helper()
	var out checkpoint.Step
	err := st.Steps(context.Background(), "pay/d", func(s checkpoint.Step) error {
		if s.ID == id {
			out = s
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestCallRetriesTransientErrorsWithTheSameKey(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	clock := &callClock{now: callStart}
	policy := steps.RetryPolicy{MaxTries: 3, Initial: time.Second, Multiplier: 2, Jitter: steps.NoJitter}
	run := beginCall(t, st, clock, steps.Config{Retry: policy})
	// Between tries the failed try is on record, so its count survives a
	// crash during the backoff (a rerun then calls again: it did not happen).
	var midWait []checkpoint.Step
	clock.onSleep = func(time.Duration) { midWait = append(midWait, callStep(t, st, "charge")) }
	var keys []string
	out, err := steps.Call(ctx, run, "charge", func(ctx context.Context, key string) (string, error) {
		keys = append(keys, key)
		if len(keys) < 3 {
			return "", steps.Transient(errors.New("503 Service Unavailable"))
		}
		return "receipt-7", nil
	})
	if err != nil || out != "receipt-7" {
		t.Fatalf("Call = %q, %v; want the third try's receipt", out, err)
	}
	if len(keys) != 3 || keys[0] != "pay/d/charge" || keys[1] != keys[0] || keys[2] != keys[0] {
		t.Fatalf("keys sent = %q; want pay/d/charge on each of 3 tries", keys)
	}
	if want := []time.Duration{time.Second, 2 * time.Second}; len(clock.delays) != 2 || clock.delays[0] != want[0] || clock.delays[1] != want[1] {
		t.Errorf("backoff = %v, want %v through the run's clock", clock.delays, want)
	}
	if len(midWait) != 2 || midWait[0].Status != checkpoint.StepFailed || midWait[0].Tries != 1 || midWait[1].Tries != 2 ||
		!strings.Contains(midWait[0].Error, "503") {
		t.Errorf("checkpoints during the backoffs = %+v; want failed tries 1 and 2 with the error", midWait)
	}
	if s := callStep(t, st, "charge"); s.Status != checkpoint.StepCompleted || s.Tries != 3 {
		t.Errorf("checkpoint = %s after %d tries; want completed after 3", s.Status, s.Tries)
	}

	// Retries run out: the step fails with the count; a rerun calls again,
	// still counting.
	calls := 0
	_, err = steps.Call(ctx, run, "refund", func(ctx context.Context, key string) (string, error) {
		calls++
		return "", steps.Transient(errors.New("503"))
	})
	var se *steps.StepError
	if calls != 3 || !errors.As(err, &se) || !strings.Contains(err.Error(), "gave up after 3 tries") {
		t.Fatalf("retries run out: %d calls, %v; want 3 and a StepError saying so", calls, err)
	}
	run2 := beginCall(t, st, clock, steps.Config{Retry: policy})
	if _, err := steps.Call(ctx, run2, "refund", func(ctx context.Context, key string) (string, error) { return "ok", nil }); err != nil {
		t.Fatal(err)
	}
	if s := callStep(t, st, "refund"); s.Status != checkpoint.StepCompleted || s.Tries != 4 {
		t.Errorf("refund after the rerun: %s, %d tries; want completed, 4", s.Status, s.Tries)
	}
}

func TestCallRetriesOnlyWhatIsMarkedTransient(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	clock := &callClock{now: callStart}
	// Default: transient would retry unmarked errors of a Do step; a call's
	// unmarked error is not retried in the attempt.
	run := beginCall(t, st, clock, steps.Config{Retry: steps.RetryPolicy{MaxTries: 5, Default: steps.ClassTransient}})
	cases := []struct {
		id     string
		err    error
		status string
	}{
		{"unmarked", errors.New("400 bad request"), checkpoint.StepFailed},
		{"permanent", steps.Permanent(errors.New("401")), checkpoint.StepFailed},
		{"rejected", steps.Reject(errors.New("card declined")), checkpoint.StepRejected},
		{"unknown", steps.OutcomeUnknown(errors.New("connection reset after sending")), checkpoint.StepCalling},
		{"unknown-marked-transient", steps.Transient(steps.OutcomeUnknown(errors.New("reset"))), checkpoint.StepCalling},
	}
	for _, tc := range cases {
		calls := 0
		_, err := steps.Call(ctx, run, tc.id, func(ctx context.Context, key string) (int, error) {
			calls++
			return 0, tc.err
		})
		if calls != 1 || err == nil {
			t.Errorf("%s: %d calls, err %v; want one call and an error", tc.id, calls, err)
		}
		if s := callStep(t, st, tc.id); s.Status != tc.status || s.Tries != 1 {
			t.Errorf("%s: checkpoint %s with %d tries; want %s with 1", tc.id, s.Status, s.Tries, tc.status)
		}
	}
	if len(clock.delays) != 0 {
		t.Errorf("slept %v; nothing should have been retried", clock.delays)
	}
}

func TestCallReconcilesInTheSameAttempt(t *testing.T) {
	ctx := context.Background()
	hang := func(calls *int) func(ctx context.Context, key string) (string, error) {
		return func(ctx context.Context, key string) (string, error) {
			*calls++
			if *calls == 1 {
				<-ctx.Done() // the provider does not answer in time
				return "", ctx.Err()
			}
			return "paid-" + key, nil
		}
	}
	const margin = 3 * time.Second

	t.Run("found: completes without calling again", func(t *testing.T) {
		st := checkpointtest.Open(t)
		clock := &callClock{now: callStart}
		run := beginCall(t, st, clock, steps.Config{CallMargin: margin})
		calls, looked := 0, 0
		out, err := steps.Call(ctx, run, "pay", hang(&calls), steps.Timeout(time.Millisecond),
			steps.Reconcile(func(ctx context.Context, key string) (any, bool, error) {
				looked++
				if len(clock.delays) != 1 || clock.delays[0] != margin {
					t.Errorf("reconciled after waiting %v; want the %s margin first", clock.delays, margin)
				}
				return "found-" + key, true, nil
			}))
		if err != nil || out != "found-pay/d/pay" || calls != 1 || looked != 1 {
			t.Fatalf("Call = %q, %v after %d calls, %d reconciles; want the reconciled output, one call, one look", out, err, calls, looked)
		}
		if s := callStep(t, st, "pay"); s.Status != checkpoint.StepCompleted || string(s.Output) != `"found-pay/d/pay"` {
			t.Errorf("checkpoint %s %s; want completed with the reconciled output", s.Status, s.Output)
		}
	})

	t.Run("not found: retried under the policy", func(t *testing.T) {
		st := checkpointtest.Open(t)
		clock := &callClock{now: callStart}
		run := beginCall(t, st, clock, steps.Config{CallMargin: margin,
			Retry: steps.RetryPolicy{MaxTries: 2, Initial: time.Second, Jitter: steps.NoJitter}})
		calls := 0
		out, err := steps.Call(ctx, run, "pay", hang(&calls), steps.Timeout(time.Millisecond),
			steps.Reconcile(func(ctx context.Context, key string) (any, bool, error) { return nil, false, nil }))
		if err != nil || out != "paid-pay/d/pay" || calls != 2 {
			t.Fatalf("Call = %q, %v after %d calls; want the second call's result", out, err, calls)
		}
		if s := callStep(t, st, "pay"); s.Status != checkpoint.StepCompleted || s.Tries != 2 {
			t.Errorf("checkpoint %s after %d tries; want completed after 2", s.Status, s.Tries)
		}
	})

	t.Run("not found, no retries left: failed, a rerun calls", func(t *testing.T) {
		st := checkpointtest.Open(t)
		clock := &callClock{now: callStart}
		run := beginCall(t, st, clock, steps.Config{CallMargin: margin})
		calls := 0
		_, err := steps.Call(ctx, run, "pay", hang(&calls), steps.Timeout(time.Millisecond),
			steps.Reconcile(func(ctx context.Context, key string) (any, bool, error) { return nil, false, nil }))
		var se *steps.StepError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), "reconciled: the call did not happen") || calls != 1 {
			t.Fatalf("Call: %v after %d calls; want a StepError saying the call did not happen", err, calls)
		}
		if s := callStep(t, st, "pay"); s.Status != checkpoint.StepFailed {
			t.Errorf("checkpoint %s; want failed (a rerun calls again)", s.Status)
		}
	})

	t.Run("reconcile fails: stops, and says a rerun checks again", func(t *testing.T) {
		st := checkpointtest.Open(t)
		clock := &callClock{now: callStart}
		run := beginCall(t, st, clock, steps.Config{CallMargin: margin})
		calls := 0
		_, err := steps.Call(ctx, run, "pay", hang(&calls), steps.Timeout(time.Millisecond),
			steps.Reconcile(func(ctx context.Context, key string) (any, bool, error) {
				return nil, false, errors.New("lookup API down")
			}))
		var unk *steps.OutcomeUnknownError
		if !errors.As(err, &unk) || !unk.Reconcilable || unk.ReconcileErr != "lookup API down" || calls != 1 {
			t.Fatalf("Call: %#v after %d calls; want a reconcilable OutcomeUnknownError with the reconcile error", err, calls)
		}
		if msg := err.Error(); !strings.Contains(msg, "a rerun runs the check again") || strings.Contains(msg, "stepwise") {
			t.Errorf("message %q: want it to say a rerun checks again, naming no command", msg)
		}
		if s := callStep(t, st, "pay"); s.Status != checkpoint.StepCalling || !strings.Contains(s.Error, "deadline exceeded") {
			t.Errorf("checkpoint %s (%q); want still calling, with the cause", s.Status, s.Error)
		}
		// The rerun reconciles it.
		run2 := beginCall(t, st, clock, steps.Config{CallMargin: margin})
		out, err := steps.Call(ctx, run2, "pay", hang(&calls),
			steps.Reconcile(func(ctx context.Context, key string) (any, bool, error) { return "found", true, nil }))
		if err != nil || out != "found" || calls != 1 {
			t.Fatalf("rerun: %q, %v, %d calls; want reconciled without a call", out, err, calls)
		}
	})
}

func TestCallWaitsOutThePreviousLeaseBeforeReconciling(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	clock := &callClock{now: callStart}
	run := beginCall(t, st, clock, steps.Config{})
	// The runner is killed after recording its intent (as a crash would).
	if _, err := steps.Call(ctx, run, "pay", func(ctx context.Context, key string) (int, error) {
		return 0, steps.OutcomeUnknown(errors.New("killed"))
	}); err == nil {
		t.Fatal("want an unknown outcome")
	}
	// The next runner took over at once (the owner was gone) with 40s of
	// the old lease left: it reconciles only once that has run out.
	prev := callStart.Add(40 * time.Second)
	run2 := beginCall(t, st, clock, steps.Config{PreviousLeaseUntil: prev})
	out, err := steps.Call(ctx, run2, "pay", func(ctx context.Context, key string) (int, error) {
		t.Error("called again")
		return 0, nil
	}, steps.Reconcile(func(ctx context.Context, key string) (any, bool, error) {
		if now := clock.Now(); now.Before(prev) {
			t.Errorf("reconciled at %s, before the previous lease ended at %s", now, prev)
		}
		return 9, true, nil
	}))
	if err != nil || out != 9 {
		t.Fatalf("Call = %d, %v; want reconciled", out, err)
	}
	if len(clock.delays) != 1 || clock.delays[0] != 40*time.Second {
		t.Errorf("waited %v; want the 40s left of the old lease", clock.delays)
	}
	// A lease long gone costs no wait.
	clock.delays = nil
	run3 := beginCall(t, st, clock, steps.Config{PreviousLeaseUntil: callStart})
	if _, err := steps.Call(ctx, run3, "other", func(ctx context.Context, key string) (int, error) {
		return 0, steps.OutcomeUnknown(errors.New("x"))
	}); err == nil {
		t.Fatal("want an unknown outcome")
	}
	run4 := beginCall(t, st, clock, steps.Config{PreviousLeaseUntil: callStart})
	if _, err := steps.Call(ctx, run4, "other", func(ctx context.Context, key string) (int, error) { return 0, nil },
		steps.Reconcile(func(ctx context.Context, key string) (any, bool, error) { return 1, true, nil })); err != nil {
		t.Fatal(err)
	}
	if len(clock.delays) != 0 {
		t.Errorf("waited %v for an expired lease", clock.delays)
	}
}

// takeoverStore takes the run over from another runner right after the
// first outside-call intent is recorded: the moment a runner paused before
// its call (SIGSTOP, a long GC, a suspended VM) loses its lease.
type takeoverStore struct {
	checkpoint.Backend
	t    *testing.T
	now  time.Time
	done bool
}

func (s *takeoverStore) InTx(ctx context.Context, l checkpoint.Lease, fn func(checkpoint.Tx) error) error {
	var calling bool
	err := s.Backend.InTx(ctx, l, func(tx checkpoint.Tx) error {
		return fn(spyTx{Tx: tx, calling: &calling})
	})
	if err == nil && calling && !s.done {
		s.done = true
		_, cerr := s.Backend.Claim(ctx, checkpoint.ClaimRequest{RunID: l.RunID, Job: "pay", RunKey: "d", Params: []byte("{}"),
			ParamsHash: "h", Owner: "other:2", Now: s.now, LeaseFor: time.Minute, OwnerGone: func(string) bool { return true }})
		if cerr != nil {
			s.t.Fatal(cerr)
		}
	}
	return err
}

type spyTx struct {
	checkpoint.Tx
	calling *bool
}

func (t spyTx) PutStep(s checkpoint.Step) error {
	if s.Status == checkpoint.StepCalling {
		*t.calling = true
	}
	return t.Tx.PutStep(s)
}

func TestCallChecksTheFenceRightBeforeCalling(t *testing.T) {
	for _, leaseFor := range []time.Duration{0, time.Minute} {
		t.Run("lease "+leaseFor.String(), func(t *testing.T) {
			ctx := context.Background()
			st := checkpointtest.Open(t)
			clock := &callClock{now: callStart}
			run := beginCall(t, &takeoverStore{Backend: st, t: t, now: callStart}, clock, steps.Config{LeaseFor: leaseFor})
			_, err := steps.Call(ctx, run, "pay", func(ctx context.Context, key string) (int, error) {
				t.Error("called after losing the lease")
				return 0, nil
			})
			if !errors.Is(err, checkpoint.ErrFenced) || !strings.Contains(err.Error(), "not made") {
				t.Fatalf("Call after a takeover = %v; want ErrFenced saying the call was not made", err)
			}
			// The intent stays for the new owner to settle.
			if s := callStep(t, st, "pay"); s.Status != checkpoint.StepCalling {
				t.Errorf("checkpoint %s; want the intent left calling", s.Status)
			}
		})
	}
}

func TestCallContextEndsBeforeTheLease(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	clock := &callClock{now: callStart}
	const lease, margin = 2 * time.Second, 500 * time.Millisecond
	run := beginCall(t, st, clock, steps.Config{LeaseFor: lease, CallMargin: margin})
	began := time.Now()
	_, err := steps.Call(ctx, run, "slow", func(ctx context.Context, key string) (int, error) {
		dl, ok := ctx.Deadline()
		// (The renewal is timed on the fake clock, the deadline on the real
		// one: allow for the few milliseconds between them.)
		if !ok || dl.Sub(began) > lease-margin+200*time.Millisecond || dl.Sub(began) < lease-margin-time.Second {
			t.Errorf("call deadline %v after start (set: %v); want about %s: the lease less its margin", dl.Sub(began), ok, lease-margin)
		}
		// The lease was renewed right before the call.
		info, err := st.Run(ctx, "pay/d")
		if err != nil || !info.Run.LeaseUntil.Equal(callStart.Add(lease)) {
			t.Errorf("lease until %s (%v); want renewed to %s", info.Run.LeaseUntil, err, callStart.Add(lease))
		}
		<-ctx.Done()
		return 0, ctx.Err()
	}, steps.Timeout(time.Hour)) // a longer timeout does not outlast the lease
	var unk *steps.OutcomeUnknownError
	if !errors.As(err, &unk) || !strings.Contains(unk.Cause, "its lease less a 500ms margin") {
		t.Fatalf("Call = %v; want an unknown outcome saying the lease bounded it", err)
	}
	if took := time.Since(began); took > lease {
		t.Errorf("the call took %s, past the %s lease", took, lease)
	}
	if _, err := steps.Begin(ctx, steps.Config{Store: st, Lease: run2Lease(t, st), LeaseFor: time.Second, CallMargin: time.Second}); err == nil ||
		!strings.Contains(err.Error(), "CallMargin") {
		t.Errorf("Begin with a margin as long as the lease: %v; want an error naming CallMargin", err)
	}
}

func run2Lease(t *testing.T, st checkpoint.Backend) checkpoint.Lease {
	t.Helper()
	info, err := st.Run(context.Background(), "pay/d")
	if err != nil {
		t.Fatal(err)
	}
	return checkpoint.Lease{RunID: info.Run.ID, Fence: info.Run.Fence, Attempt: len(info.Attempts)}
}

// Without Config.LeaseFor a Call renews nothing, so it refuses to start on
// a lease that has expired (a runner taking over could make the same call
// at the same time), and is bounded by the lease's end while it is live.
func TestCallWithoutLeaseLengthRefusesAnExpiredLease(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	clock := &callClock{now: callStart}
	run := beginCall(t, st, clock, steps.Config{}) // claimed for a minute at callStart
	var deadline time.Time
	if _, err := steps.Call(ctx, run, "live", func(ctx context.Context, key string) (int, error) {
		deadline, _ = ctx.Deadline()
		return 1, nil
	}); err != nil {
		t.Fatalf("Call on a live lease: %v", err)
	}
	if deadline.IsZero() {
		t.Error("a call on a live lease without LeaseFor was not bounded by the lease")
	}
	clock.mu.Lock()
	clock.now = callStart.Add(2 * time.Minute) // the lease ran out; nobody heartbeat it
	clock.mu.Unlock()
	called := false
	_, err := steps.Call(ctx, run, "late", func(ctx context.Context, key string) (int, error) {
		called = true
		return 2, nil
	})
	if called || !errors.Is(err, steps.ErrLeaseExpired) {
		t.Errorf("Call on an expired lease: called %v, err %v; want not called and ErrLeaseExpired", called, err)
	}
}
