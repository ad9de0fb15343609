package runner_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// A step's retry backoff waits on the runner's one Clock: with an hour of
// backoff, the retry comes when the fake clock reaches the hour (not after
// an hour of real time, and not before), and the run succeeds.
func TestRetryBackoffWaitsOnTheClock(t *testing.T) {
	h := newHarness(t)
	clock := newSleepClock(fenceStart)
	var (
		mu      sync.Mutex
		triedAt []time.Time
	)
	tries := func() []time.Time { mu.Lock(); defer mu.Unlock(); return slices.Clone(triedAt) }
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
		_, err := steps.Do(ctx, run, "call", func(context.Context) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			triedAt = append(triedAt, clock.Now())
			if len(triedAt) == 1 {
				return 0, errors.New("the provider is busy")
			}
			return len(triedAt), nil
		}, steps.Retry(steps.RetryPolicy{MaxTries: 2, Initial: time.Hour, Max: time.Hour, Jitter: steps.NoJitter}))
		return err
	}
	// A day's lease: its heartbeat sleeps 8h, past the retry's hour.
	r := h.runner(func(c *runner.Config) { c.Clock, c.Lease = clock, 24*time.Hour })
	done, outcome := start(r)
	retryAt := fenceStart.Add(time.Hour)
	for deadline := time.Now().Add(10 * time.Second); !clock.sleepsUntil(retryAt); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no wait until %s on the clock within 10s (tries at %v)", retryAt, tries())
		}
	}
	clock.Advance(time.Hour - time.Second)
	time.Sleep(50 * time.Millisecond)
	if n := len(tries()); n != 1 {
		t.Fatalf("%d tries a second before the backoff's end; want 1", n)
	}
	clock.Advance(time.Second)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the run did not end within 10s of the retry's wake-up")
	}
	if outcome.err != nil || outcome.res.Status != checkpoint.RunSucceeded {
		t.Fatalf("run: %+v, %v; want succeeded", outcome.res, outcome.err)
	}
	if got := tries(); len(got) != 2 || !got[1].Equal(retryAt) {
		t.Errorf("tries at %v; want two, the second at +1h on the fake clock", got)
	}
}

// sleepsUntil reports whether a goroutine waits on c until at.
func (c *sleepClock) sleepsUntil(at time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.sleepers {
		if s.at.Equal(at) {
			return true
		}
	}
	return false
}
