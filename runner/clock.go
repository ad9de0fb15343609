package runner

import (
	"context"
	"time"
)

// Clock tells the time. The runner reads time only through it, so tests can
// control it.
type Clock interface {
	Now() time.Time
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// Sleeper is a Clock that can also wait; retries wait through it, so a
// test's fake clock controls backoff delays too. A Clock that is not a
// Sleeper waits with real timers.
type Sleeper interface {
	Sleep(ctx context.Context, d time.Duration) error
}

// Sleep waits d with a real timer, or until ctx is done.
func (SystemClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
