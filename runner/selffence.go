package runner

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// ErrLeaseLost is matched (errors.Is) by a *LeaseLostError: a runner could
// not renew its run's lease in time and stopped its own attempt.
var ErrLeaseLost = errors.New("the run's lease could not be renewed in time")

// LeaseLostError says a runner fenced itself: no renewal of its run's lease
// succeeded by the lease's known expiry less Config.SelfFenceMargin (the
// database unreachable, the process paused), so it cancelled the attempt's
// context, and with it the job's steps and their outside calls, before
// another runner may take the run over. Unlike checkpoint.ErrFenced,
// nobody need have taken the run over: the lease may still be this
// attempt's. It wraps the last renewal's error, if one was tried.
type LeaseLostError struct {
	RunID   string
	Attempt int
	// Expiry is when the lease expires as last renewed (or claimed), on
	// the runner's clock: the time the renewal was sent plus the lease, so
	// never later than the store's own expiry.
	Expiry time.Time
	// Margin is Config.SelfFenceMargin: the attempt stopped at Expiry less
	// Margin.
	Margin time.Duration
	// Failures counts the renewals that failed since the last that
	// succeeded (zero when none was tried in time: the process was
	// paused, say).
	Failures int
	// LastErr is the last failed renewal's error, or nil.
	LastErr error
}

func (e *LeaseLostError) Error() string {
	why := "no renewal was tried in time"
	if e.LastErr != nil {
		why = fmt.Sprintf("%d renewal(s) failed, the last with: %v", e.Failures, e.LastErr)
	}
	return fmt.Sprintf("run %s, attempt %d, stopped itself (self-fenced): %s; its lease expires at %s, and the attempt "+
		"stopped %s before that, calling no outside system after it",
		e.RunID, e.Attempt, why, e.Expiry.UTC().Format(time.RFC3339Nano), e.Margin)
}

// Is reports whether target is ErrLeaseLost.
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// Unwrap returns the last failed renewal's error.
func (e *LeaseLostError) Unwrap() error { return e.LastErr }

// heartbeat renews the lease every third of Config.Lease, waiting through
// the runner's clock, until stopped or ctx ends. A renewal refused with
// checkpoint.ErrFenced cancels the run with that error at once. Any other
// failure is retried with a jittered, doubling backoff; if no renewal
// succeeds by the lease's known expiry less Config.SelfFenceMargin, the
// run is cancelled with a *LeaseLostError (logged once, at error). The
// known expiry is claimedAt (read before the claim was sent) plus the
// lease, then each successful renewal's own until. Each renewal's call is
// bounded by the self-fence time too, so a hung connection cannot hold the
// check up. The returned stop waits for the goroutine to end.
func (r *Runner) heartbeat(ctx context.Context, l checkpoint.Lease, claimedAt time.Time, cancel context.CancelCauseFunc, log zerolog.Logger) (stop func()) {
	beatCtx, end := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		lease, margin, clock := r.cfg.Lease, r.cfg.SelfFenceMargin, r.cfg.Clock
		interval := lease / 3
		expiry, next := claimedAt.Add(lease), claimedAt.Add(interval)
		var (
			failures int
			lastErr  error
		)
		for {
			fenceAt := expiry.Add(-margin)
			now := clock.Now()
			if wake := minTime(next, fenceAt); now.Before(wake) {
				if sleep(beatCtx, clock, wake.Sub(now)) != nil {
					return
				}
				now = clock.Now()
			}
			if !now.Before(fenceAt) {
				lost := &LeaseLostError{RunID: l.RunID, Attempt: l.Attempt, Expiry: expiry, Margin: margin,
					Failures: failures, LastErr: lastErr}
				log.Error().AnErr("heartbeat_error", lastErr).Int("failures", failures).Time("lease_expires", expiry).
					Msg("lease could not be renewed in time: this attempt stops itself (self-fenced) and calls no outside system; " +
						"another runner may take the run over once the lease expires")
				cancel(lost)
				return
			}
			if now.Before(next) {
				continue
			}
			callCtx, done := context.WithTimeout(beatCtx, min(interval, fenceAt.Sub(now)))
			err := r.cfg.Store.Heartbeat(callCtx, l, now, now.Add(lease))
			done()
			if beatCtx.Err() != nil {
				return
			}
			switch {
			case err == nil:
				if failures > 0 {
					log.Info().Int("failures", failures).Msg("heartbeat renewed the lease again")
				}
				expiry, next, failures, lastErr = now.Add(lease), now.Add(interval), 0, nil
			case errors.Is(err, checkpoint.ErrFenced):
				cancel(err)
				return
			default:
				failures, lastErr = failures+1, err
				next = now.Add(retryDelay(failures, interval))
				log.Warn().Err(err).Int("failures", failures).Time("self_fence_at", fenceAt).
					Msg("heartbeat failed; retrying until the lease is nearly out")
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(end)
		wg.Wait()
	}
}

// retryDelay is the wait before retrying a failed renewal: an eighth of the
// renewal interval, doubling with each failure up to the interval, and
// jittered down by up to half so runners cut off together do not retry in
// step.
func retryDelay(failures int, interval time.Duration) time.Duration {
	d := interval / 8
	for i := 1; i < failures && d < interval; i++ {
		d *= 2
	}
	d = min(d, interval)
	return d/2 + rand.N(d/2+1)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
