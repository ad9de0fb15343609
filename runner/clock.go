package runner

import "time"

// Clock tells the time. The runner reads time only through it, so tests can
// control it.
type Clock interface {
	Now() time.Time
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }
