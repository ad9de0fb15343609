package runner

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// StoreFaultError is the error of an attempt that failed on transient
// store faults (checkpoint.ErrTransient: a dropped connection, a server
// restart, a deadlock; or a partition's chunk out of re-plans, a
// *steps.ContendedError) and gave up once the retry policy was exhausted.
// It wraps the last fault, which names the server and database.
type StoreFaultError struct {
	RunID string
	Tries int
	// RetryIn, when positive, is how long after its end the pool claims
	// the run again (a queued run goes back to its queue with a
	// not-before, on the store's clock); zero means the run was recorded
	// failed: resume it.
	RetryIn time.Duration
	Err     error
}

func (e *StoreFaultError) Error() string {
	fault, cure := "a store fault", "once the database answers"
	var contended *steps.ContendedError
	if errors.As(e.Err, &contended) {
		fault, cure = "contention on its target", "once fewer writers move the target's keys"
	}
	if e.RetryIn > 0 {
		return fmt.Sprintf("run %s hit %s %s in a row (%v); it is back in its queue and a worker tries it again "+
			"from its checkpoints in %s (no operator needed)", e.RunID, fault, times(e.Tries), e.Err, e.RetryIn.Round(time.Millisecond))
	}
	return fmt.Sprintf("run %s gave up after %s %s in a row (%v); %s, "+
		"resume it with `stepwise resume %s` (it goes on from its checkpoints)", e.RunID, fault, times(e.Tries), e.Err, cure, e.RunID)
}

// Unwrap returns the last fault.
func (e *StoreFaultError) Unwrap() error { return e.Err }

func times(n int) string {
	if n == 1 {
		return "once"
	}
	return fmt.Sprintf("%d times", n)
}

// transientFault reports whether an attempt's error err is a transient
// store fault the attempt may go on from: the run's context is live, the
// attempt was not fenced, and no operator decision is awaited.
func transientFault(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() == nil && errors.Is(err, checkpoint.ErrTransient) &&
		!errors.Is(err, checkpoint.ErrFenced) && !NeedsOperator(err)
}

// driveRetrying drives the attempt as drive does and, after a transient
// store fault, drives it again from its checkpoints under the same lease
// (the heartbeat goes on meanwhile), with the backoff and jitter of the
// job's store retry policy (steps.StoreRetryPolicy): every completed step
// and committed chunk is found recorded, and a commit whose answer was lost
// is found committed. Once the policy is exhausted the last fault is
// returned wrapped in a *StoreFaultError.
func (r *Runner) driveRetrying(ctx context.Context, job jobs.Job, claim checkpoint.Claim, dec jobs.Decoded,
	req Request, res *Result, jobLog, log zerolog.Logger) (bool, error) {
	policy := steps.StoreRetryPolicy(job.Settings().Retry)
	for try := 1; ; try++ {
		pastDeadline, err := r.drive(ctx, job, claim, dec, req, res, jobLog)
		if !transientFault(ctx, err) {
			return pastDeadline, err
		}
		if try >= policy.MaxTries {
			return pastDeadline, &StoreFaultError{RunID: claim.Lease.RunID, Tries: try, Err: err}
		}
		delay := policy.Backoff(try, rand.Float64())
		r.cfg.Metrics.storeFault(job.Name())
		log.Warn().Err(err).Int("try", try).Int("max_tries", policy.MaxTries).Float64(steps.FieldRetryInSeconds, delay.Seconds()).
			Msg("store fault; the attempt goes on from its checkpoints after a pause")
		if sleep(ctx, r.cfg.Clock, delay) != nil {
			return pastDeadline, err
		}
	}
}

// requeueAfterFault is how a pooled run (one of a queue) that gave up
// on store faults goes back to its queue instead of failing: recorded
// interrupted with a not-before after the backoff of its attempt number,
// so a worker claims it again then, with no operator, while its attempts
// stay within the policy's MaxTries. ok is false when the run is not
// pooled or its attempts are used up: it is recorded failed as usual.
func (r *Runner) requeueAfterFault(job jobs.Job, claim checkpoint.Claim, fault *StoreFaultError) (checkpoint.Ending, bool) {
	policy := steps.StoreRetryPolicy(job.Settings().Retry)
	if claim.Run.Queue == "" || claim.Lease.Attempt >= policy.MaxTries {
		return checkpoint.Ending{}, false
	}
	fault.RetryIn = max(policy.Backoff(claim.Lease.Attempt, rand.Float64()), time.Millisecond)
	return checkpoint.Ending{Status: checkpoint.RunInterrupted, Error: fault.Error(), At: r.cfg.Clock.Now(), RetryAfter: fault.RetryIn}, true
}
