package runner

import (
	"context"
	"time"
)

// Clock is the one source of time of the runner, its scheduler, workers,
// dispatchers and heartbeats: every reading of the time and every wait
// (retry backoff, lock polling, heartbeats, the scheduler's and workers'
// wake-ups) goes through it, so a test's fake clock, or testing/synctest,
// controls all of them.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// After returns a channel that receives once d has passed, as
	// time.After does.
	After(d time.Duration) <-chan time.Time
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// After returns time.After(d).
func (SystemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// sleep waits d on clock, or until ctx ends (then it returns ctx's cause).
func sleep(ctx context.Context, clock Clock, d time.Duration) error {
	if d <= 0 {
		return context.Cause(ctx)
	}
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-clock.After(d):
		return nil
	}
}
