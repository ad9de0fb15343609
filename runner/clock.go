package runner

import (
	"context"
	"time"

	"github.com/stepwise-run/stepwise/steps"
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
func (SystemClock) Sleep(ctx context.Context, d time.Duration) error { return steps.Sleep(ctx, d) }

// sleepOn waits d through clock if it is a Sleeper, else with a real timer.
func sleepOn(clock Clock, ctx context.Context, d time.Duration) error {
	if s, ok := clock.(Sleeper); ok {
		return s.Sleep(ctx, d)
	}
	return steps.Sleep(ctx, d)
}
