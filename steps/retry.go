package steps

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// ErrorClass says what a step's error means for retrying it.
type ErrorClass int

// Error classes.
const (
	// ClassTransient errors (timeouts, network errors, a busy database)
	// are retried within the attempt under the step's RetryPolicy.
	ClassTransient ErrorClass = iota + 1
	// ClassPermanent errors (bad input, authentication) fail the step at
	// once; a rerun of the run tries it again.
	ClassPermanent
	// ClassRejected errors are pinned business outcomes (see Reject):
	// recorded, and returned by every rerun.
	ClassRejected
)

func (c ErrorClass) String() string {
	switch c {
	case ClassTransient:
		return "transient"
	case ClassPermanent:
		return "permanent"
	case ClassRejected:
		return "rejected"
	}
	return "unclassified"
}

type classified struct {
	err   error
	class ErrorClass
}

func (c *classified) Error() string { return c.err.Error() }
func (c *classified) Unwrap() error { return c.err }

// Permanent marks err as permanent: the step fails now, without retries.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &classified{err: err, class: ClassPermanent}
}

// Transient marks err as transient: the step's retry policy retries it.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &classified{err: err, class: ClassTransient}
}

// Classify returns err's class: ClassRejected for Reject, the class given
// by Permanent or Transient, ClassTransient for context deadlines (a step
// timeout), and def for anything else.
func Classify(err error, def ErrorClass) ErrorClass {
	var rej *rejection
	var c *classified
	switch {
	case errors.As(err, &rej):
		return ClassRejected
	case errors.As(err, &c):
		return c.class
	case errors.Is(err, context.DeadlineExceeded):
		return ClassTransient
	}
	return def
}

// Jitter spreads retry delays so many runners do not retry in step.
type Jitter int

// Jitter kinds.
const (
	// FullJitter waits a uniformly random time in [0, backoff). The default.
	FullJitter Jitter = iota
	// EqualJitter waits backoff/2 plus a random time in [0, backoff/2).
	EqualJitter
	// NoJitter waits exactly the backoff.
	NoJitter
)

// RetryPolicy says how a step's transient errors are retried inside one
// attempt. The zero value retries nothing.
type RetryPolicy struct {
	// MaxTries is how many times the step's function is called in one
	// attempt at most, the first call included. 0 or 1 means no retry.
	MaxTries int
	// Initial is the backoff before the first retry. Defaults to 100ms.
	Initial time.Duration
	// Max caps the backoff. Defaults to 30s.
	Max time.Duration
	// Multiplier grows the backoff after each retry. Defaults to 2.
	Multiplier float64
	// Jitter spreads the delays. Defaults to FullJitter.
	Jitter Jitter
	// Default is the class of errors not marked by Transient, Permanent
	// or Reject. Defaults to ClassTransient.
	Default ErrorClass
}

// Validate names the first bad field.
func (p RetryPolicy) Validate() error {
	switch {
	case p.MaxTries < 0:
		return fmt.Errorf("steps: RetryPolicy.MaxTries is %d; it cannot be negative", p.MaxTries)
	case p.Initial < 0 || p.Max < 0:
		return fmt.Errorf("steps: RetryPolicy.Initial (%s) and Max (%s) cannot be negative", p.Initial, p.Max)
	case p.Multiplier != 0 && p.Multiplier < 1:
		return fmt.Errorf("steps: RetryPolicy.Multiplier is %g; use 1 or more", p.Multiplier)
	case p.Jitter < FullJitter || p.Jitter > NoJitter:
		return fmt.Errorf("steps: RetryPolicy.Jitter is %d; use FullJitter, EqualJitter or NoJitter", p.Jitter)
	}
	return nil
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxTries < 1 {
		p.MaxTries = 1
	}
	if p.Initial == 0 {
		p.Initial = 100 * time.Millisecond
	}
	if p.Max == 0 {
		p.Max = 30 * time.Second
	}
	if p.Multiplier == 0 {
		p.Multiplier = 2
	}
	if p.Default == 0 {
		p.Default = ClassTransient
	}
	return p
}

// Backoff returns the delay before retry number n (1 for the first retry),
// with rnd a uniform random number in [0, 1).
func (p RetryPolicy) Backoff(n int, rnd float64) time.Duration {
	p = p.withDefaults()
	d := float64(p.Initial) * math.Pow(p.Multiplier, float64(n-1))
	if d > float64(p.Max) || math.IsInf(d, 0) || math.IsNaN(d) {
		d = float64(p.Max)
	}
	switch p.Jitter {
	case FullJitter:
		d *= rnd
	case EqualJitter:
		d = d/2 + d/2*rnd
	}
	return time.Duration(d)
}

// Retry sets the step's retry policy, overriding the job's.
func Retry(p RetryPolicy) Option { return func(o *doOptions) { o.retry = &p } }

// Timeout bounds each call of the step's function through its context. A
// function that ignores its context and overruns is reported in the log.
// A timed-out call is a transient error.
func Timeout(d time.Duration) Option { return func(o *doOptions) { o.timeout = d } }

// callWithPolicy calls fn until it succeeds, fails for good, or its retries
// run out. Each failed try is recorded in the step's checkpoint (its try
// count survives a crash) and logged with the delay before the next.
func callWithPolicy[T any](ctx context.Context, r *Run, cp *checkpoint.Step, o doOptions, fn func(ctx context.Context) (T, error)) (T, error) {
	policy := r.policy(o)
	for try := 1; ; try++ {
		out, err := callOnce(ctx, r, cp.ID, o.timeout, fn)
		if err == nil {
			return out, nil
		}
		class := Classify(err, policy.Default)
		if class != ClassTransient || try >= policy.MaxTries || ctx.Err() != nil {
			if class == ClassTransient && policy.MaxTries > 1 {
				err = fmt.Errorf("%w (gave up after %s)", err, plural(try, "try", "tries"))
			}
			return out, err
		}
		delay := policy.Backoff(try, rand.Float64())
		r.recordTry(ctx, cp, err)
		r.log.Warn().Str(FieldStepID, cp.ID).Int("try", try).Int("tries_total", cp.Tries).Float64(FieldRetryInSeconds, delay.Seconds()).Err(err).
			Msg("step failed; retrying")
		cp.Tries++
		if err := r.sleep(ctx, delay); err != nil {
			return out, fmt.Errorf("%w while waiting to retry step %s: %w", ErrInterrupted, cp.ID, err)
		}
		cp.StartedAt = r.now()
	}
}

// policy is the retry policy of a step with options o: its own, else the
// job's, with defaults filled in.
func (r *Run) policy(o doOptions) RetryPolicy {
	p := r.retry
	if o.retry != nil {
		p = *o.retry
	}
	return p.withDefaults()
}

// callOnce calls fn once, with the step's timeout on its context. A
// function still running when its timeout passes is reported: it is not
// honouring its context.
func callOnce[T any](ctx context.Context, r *Run, id string, timeout time.Duration, fn func(ctx context.Context) (T, error)) (T, error) {
	ctx = withStep(ctx, r, id)
	if timeout <= 0 {
		return fn(ctx)
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	returned := make(chan struct{})
	stop := context.AfterFunc(cctx, func() {
		if !errors.Is(cctx.Err(), context.DeadlineExceeded) {
			return
		}
		select {
		case <-returned:
		default:
			r.log.Warn().Str(FieldStepID, id).Float64(FieldTimeoutSeconds, timeout.Seconds()).
				Msg("step overran its timeout and is still running: its function does not honour its context")
		}
	})
	out, err := fn(cctx)
	close(returned)
	stop()
	return out, err
}

// recordTry records a failed try that will be retried, so the try count
// survives a crash. A failure to record is logged: the retry goes on.
func (r *Run) recordTry(ctx context.Context, cp *checkpoint.Step, tryErr error) {
	traceRetry(ctx, cp.Tries, tryErr)
	if r.dryRun {
		return
	}
	f := *cp
	f.Status, f.Error, f.FinishedAt, f.Output, f.Plan = checkpoint.StepFailed, tryErr.Error(), r.now(), nil, nil
	if err := r.runTx(context.WithoutCancel(ctx), func(tx checkpoint.Tx) error { return tx.PutStep(f) }); err != nil {
		r.log.Warn().Str(FieldStepID, cp.ID).Err(err).Msg("could not record the failed try")
	}
}

// DefaultStoreRetry is the policy a transient store fault
// (checkpoint.ErrTransient: a dropped connection, a server restart, a
// deadlock) is tried again under when the job's own RetryPolicy retries
// nothing: six tries over about twelve seconds, long enough for a server
// restart or a failover.
var DefaultStoreRetry = RetryPolicy{MaxTries: 6, Initial: 500 * time.Millisecond, Max: 8 * time.Second, Jitter: EqualJitter}

// StoreRetryPolicy is the policy under which a transient store fault of
// a job with retry policy job is tried again: job itself when it retries,
// DefaultStoreRetry otherwise, with defaults filled in.
func StoreRetryPolicy(job RetryPolicy) RetryPolicy {
	if job.MaxTries > 1 {
		return job.withDefaults()
	}
	return DefaultStoreRetry.withDefaults()
}
