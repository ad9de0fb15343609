package steps_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/steps"
)

func TestBackoffBoundsAndJitter(t *testing.T) {
	p := steps.RetryPolicy{MaxTries: 10, Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2, Jitter: steps.NoJitter}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := p.Backoff(i+1, 0.5); got != w*time.Millisecond {
			t.Errorf("no jitter, retry %d: %s, want %s", i+1, got, w*time.Millisecond)
		}
	}
	p.Jitter = steps.FullJitter
	for _, rnd := range []float64{0, 0.25, 0.999} {
		if got, max := p.Backoff(3, rnd), 400*time.Millisecond; got < 0 || got >= max {
			t.Errorf("full jitter rnd %g: %s outside [0, %s)", rnd, got, max)
		}
	}
	if p.Backoff(3, 0.25) != 100*time.Millisecond {
		t.Errorf("full jitter is not rnd*backoff: %s", p.Backoff(3, 0.25))
	}
	p.Jitter = steps.EqualJitter
	if got := p.Backoff(3, 0); got != 200*time.Millisecond {
		t.Errorf("equal jitter floor: %s, want 200ms", got)
	}
	p.Jitter = steps.FullJitter
	lo, hi := time.Hour, time.Duration(0)
	for i := range 100 {
		d := p.Backoff(2, float64(i)/100)
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo > 10*time.Millisecond || hi < 190*time.Millisecond {
		t.Errorf("full jitter spread [%s, %s], want about [0, 200ms)", lo, hi)
	}
}

// fakeSleep records the delays a step waits, without waiting.
type fakeSleep struct{ delays []time.Duration }

func (f *fakeSleep) sleep(ctx context.Context, d time.Duration) error {
	f.delays = append(f.delays, d)
	return ctx.Err()
}

func beginRetry(t *testing.T, st checkpoint.Backend, p steps.RetryPolicy, fs *fakeSleep) *steps.Run {
	t.Helper()
	c, err := st.Claim(context.Background(), checkpoint.ClaimRequest{RunID: "j/r", Job: "j", RunKey: "r", Params: []byte("{}"),
		ParamsHash: "h", Owner: "t:1", Now: time.Now(), LeaseFor: time.Minute, OwnerGone: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	run, err := steps.Begin(context.Background(), steps.Config{Store: st, Lease: c.Lease, Retry: p, Sleep: fs.sleep})
	if err != nil {
		t.Fatal(err)
	}
	return run
}

func stepTries(t *testing.T, st checkpoint.Backend, id string) (status string, tries int) {
	t.Helper()
	c, _ := stepOf(t, st, "j/r", id)
	status, tries = c.Status, c.Tries
	return status, tries
}

func TestRetryTransientUntilLimit(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	fs := &fakeSleep{}
	policy := steps.RetryPolicy{MaxTries: 4, Initial: time.Second, Multiplier: 3, Max: time.Minute, Jitter: steps.NoJitter}
	run := beginRetry(t, st, policy, fs)
	calls := 0
	_, err := steps.Do(ctx, run, "flaky", func(ctx context.Context) (int, error) {
		calls++
		return 0, errors.New("connection reset")
	})
	if calls != 4 {
		t.Fatalf("calls = %d, want 4 (MaxTries)", calls)
	}
	if err == nil || !strings.Contains(err.Error(), "gave up after 4 tries") || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("err = %v, want the last error and the count", err)
	}
	want := []time.Duration{time.Second, 3 * time.Second, 9 * time.Second}
	if len(fs.delays) != 3 || fs.delays[0] != want[0] || fs.delays[1] != want[1] || fs.delays[2] != want[2] {
		t.Fatalf("delays = %v, want %v", fs.delays, want)
	}
	if status, tries := stepTries(t, st, "flaky"); status != checkpoint.StepFailed || tries != 4 {
		t.Fatalf("checkpoint = %s with %d tries, want failed with 4", status, tries)
	}
	// A rerun (new attempt) keeps counting tries and succeeds on its second.
	run2 := beginRetry(t, st, policy, &fakeSleep{})
	calls = 0
	out, err := steps.Do(ctx, run2, "flaky", func(ctx context.Context) (int, error) {
		calls++
		if calls == 1 {
			return 0, steps.Transient(errors.New("timeout"))
		}
		return 7, nil
	})
	if err != nil || out != 7 {
		t.Fatalf("rerun: %d, %v", out, err)
	}
	if status, tries := stepTries(t, st, "flaky"); status != checkpoint.StepCompleted || tries != 6 {
		t.Fatalf("checkpoint = %s with %d tries, want completed with 6 (persisted across attempts)", status, tries)
	}
}

func TestRetryClassification(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	fs := &fakeSleep{}
	run := beginRetry(t, st, steps.RetryPolicy{MaxTries: 5, Jitter: steps.NoJitter}, fs)
	calls := 0
	_, err := steps.Do(ctx, run, "perm", func(ctx context.Context) (int, error) {
		calls++
		return 0, steps.Permanent(errors.New("bad account number"))
	})
	if calls != 1 || err == nil || len(fs.delays) != 0 {
		t.Fatalf("permanent error: %d calls, %d sleeps, err %v; want tried once", calls, len(fs.delays), err)
	}
	calls = 0
	_, err = steps.Do(ctx, run, "rej", func(ctx context.Context) (int, error) {
		calls++
		return 0, steps.Reject(errors.New("account closed"))
	})
	var rej *steps.RejectedError
	if calls != 1 || !errors.As(err, &rej) {
		t.Fatalf("rejection: %d calls, err %v; want pinned after one call", calls, err)
	}
	calls = 0
	_, err = steps.Do(ctx, run, "default-perm", func(ctx context.Context) (int, error) {
		calls++
		return 0, errors.New("unmarked")
	}, steps.Retry(steps.RetryPolicy{MaxTries: 5, Default: steps.ClassPermanent}))
	if calls != 1 || err == nil {
		t.Fatalf("default permanent: %d calls", calls)
	}
	// A step timeout is transient and retried; the context carries it.
	calls = 0
	_, err = steps.Do(ctx, run, "slow", func(ctx context.Context) (int, error) {
		calls++
		<-ctx.Done()
		return 0, ctx.Err()
	}, steps.Timeout(time.Millisecond), steps.Retry(steps.RetryPolicy{MaxTries: 2}))
	if calls != 2 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("timeout: %d calls, err %v; want 2 calls ending in DeadlineExceeded", calls, err)
	}
	if err := (steps.RetryPolicy{Multiplier: 0.5}).Validate(); err == nil || !strings.Contains(err.Error(), "Multiplier") {
		t.Fatalf("Validate accepted a shrinking multiplier: %v", err)
	}
}
