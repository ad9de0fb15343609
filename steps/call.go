package steps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// ErrDryRunStopped ends a dry run at an outside call (Call) not yet made:
// the call is planned (DryPlan.Call) but not made, and the steps after it
// need its result. The runner counts such a dry run as done, not failed.
var ErrDryRunStopped = errors.New("dry run stops before an outside call, which it does not make")

type stepKey struct{}

// stepInfo is what a running step's context carries.
type stepInfo struct{ runID, stepID string }

// IdempotencyKey returns the stable idempotency key of the step running in
// ctx, "RUN_ID/STEP_ID" (e.g. "settle/2026-11-28/pay/T-1001"): the same on
// every rerun, so an outside system that deduplicates by key (a payment
// provider, a bank API) never acts twice. Empty outside a step.
func IdempotencyKey(ctx context.Context) string {
	if si, ok := ctx.Value(stepKey{}).(stepInfo); ok {
		return si.runID + "/" + si.stepID
	}
	return ""
}

func withStep(ctx context.Context, r *Run, id string) context.Context {
	return context.WithValue(ctx, stepKey{}, stepInfo{runID: r.lease.RunID, stepID: id})
}

// OutcomeUnknownError is returned by Call when an outside call may or may
// not have happened (the runner died, or the call timed out or was cut
// off, after its intent was recorded) and nothing in this attempt could
// settle it: calling again could act twice, so the step stops. It carries
// data only; what settles it depends on Reconcilable.
type OutcomeUnknownError struct {
	RunID string
	Step  string
	// Key is the call's idempotency key, to look it up by in the outside
	// system.
	Key string
	// Cause is why the outcome is unknown: the call's error, or what an
	// earlier attempt left.
	Cause string
	// Reconcilable is true when the step has a Reconcile function: a rerun
	// runs it again and settles the call by itself. Without one only an
	// operator who checked the outside system can settle it.
	Reconcilable bool
	// ReconcileErr is why the Reconcile function failed, when it ran.
	ReconcileErr string
}

func (e *OutcomeUnknownError) Error() string {
	cause := ""
	if e.Cause != "" {
		cause = " (" + e.Cause + ")"
	}
	msg := fmt.Sprintf("the outcome of outside call %s of run %s is unknown%s: it may or may not have happened", e.Step, e.RunID, cause)
	switch {
	case !e.Reconcilable:
		return msg + fmt.Sprintf("; the step has no reconcile function, so it is not called again until someone checks "+
			"the outside system for idempotency key %s and settles it", e.Key)
	case e.ReconcileErr != "":
		return msg + "; its reconcile check failed: " + e.ReconcileErr + "; a rerun runs the check again"
	}
	return msg + "; a rerun reconciles it"
}

type unknownOutcome struct{ err error }

func (u *unknownOutcome) Error() string { return u.err.Error() }
func (u *unknownOutcome) Unwrap() error { return u.err }

// OutcomeUnknown marks an error of an outside call after which the call may
// have happened (a timeout after sending, a dropped connection): the step
// is left "outcome unknown" instead of failed, and never retried blindly.
// Timeouts are treated so without marking.
func OutcomeUnknown(err error) error {
	if err == nil {
		return nil
	}
	return &unknownOutcome{err: err}
}

// ReconcileFunc looks up an outside call by its idempotency key when its
// outcome is unknown: found reports whether it happened, and output is its
// result (recorded as the step's output). A call the outside system has
// received but not finished must count as found: not found means calling
// again is safe.
type ReconcileFunc func(ctx context.Context, key string) (output any, found bool, err error)

// Reconcile gives Call a way to settle an unknown outcome by itself (e.g.
// look the payment up by reference) instead of stopping for an operator.
func Reconcile(fn ReconcileFunc) Option { return func(o *doOptions) { o.reconcile = fn } }

// Call runs a step that calls an outside system which is not an effect (a
// payment provider, a bank file upload, an e-mail), once per run. fn gets
// the step's stable idempotency key to send along, the same on every try
// and every rerun.
//
// Before each try the step records its intent, then renews the run's lease,
// which checks that this attempt still holds the run: a runner that lost
// its lease (paused, partitioned) never starts a call. fn's context ends
// Config.CallMargin before the renewed lease would (and after Timeout, if
// shorter), so a call never outlives the lease it was started under; give
// slow calls a longer lease. After the call, the step records its result.
//
// An error from fn means the call did not happen: it is recorded as failed
// (a rerun calls again), and one marked with Transient is retried in this
// attempt under the step's RetryPolicy (Retry, or the job's), with its
// backoff and each try counted in the checkpoint. Unmarked errors are not
// retried in the attempt (the policy's Default does not apply to calls);
// Reject pins a business refusal as for Do.
//
// A timeout, an interruption, or an error marked with OutcomeUnknown means
// the call may have happened: it is never retried blindly. With a Reconcile
// function the step waits CallMargin and reconciles in the same attempt:
// found completes the step with the function's output, not found counts as
// a transient failure (retried under the policy). A crash leaves the step
// "outcome unknown" for the next attempt, which reconciles it the same way,
// after waiting out the crashed runner's lease. When reconciling fails, or
// there is no Reconcile function, the step stops with an
// *OutcomeUnknownError.
func Call[T any](ctx context.Context, r *Run, id string, fn func(ctx context.Context, key string) (T, error), opts ...Option) (out T, err error) {
	key := r.lease.RunID + "/" + id
	ctx, sp := r.startStep(ctx, id, kindCall)
	defer func() { sp.end(err, attribute.String(AttrIdempotencyKey, key)) }()
	var zero T
	cp, out, done, err := start[T](ctx, r, id, opts, sp)
	if done || err != nil {
		return out, err
	}
	if r.dryRun {
		// A dry run neither calls outside systems nor reconciles them: it
		// plans the call and stops, as what follows needs its result.
		r.dryPlans = append(r.dryPlans, DryPlan{Step: id, Call: key})
		r.count(func(s *Stats) { s.Executed++ }) // it would run
		return zero, fmt.Errorf("%w: outside call %s (idempotency key %s)", ErrDryRunStopped, id, key)
	}
	// The record goes with every write from the intent on: operations
	// tell an outside call by it, and check a resolved output against
	// the shape.
	cp.Call = callRecord[T](key)
	c := &outsideCall[T]{r: r, id: id, key: key, fn: fn, o: newOptions(opts), cp: cp}
	if cp.Status == checkpoint.StepCalling {
		if out, done, err := c.settleEarlier(ctx); done || err != nil {
			return out, err
		}
	}
	policy := r.policy(c.o)
	for try := 1; ; try++ {
		out, done, err := c.try(ctx, try, policy)
		if done || err != nil {
			return out, err
		}
	}
}

// outsideCall is the state one Call step's protocol shares across its
// phases: the intent an earlier attempt left (settleEarlier), each try
// (try), a try of unknown outcome (afterUnknown).
type outsideCall[T any] struct {
	r       *Run
	id, key string
	fn      func(ctx context.Context, key string) (T, error)
	o       doOptions
	cp      checkpoint.Step // the step's checkpoint, as the next write records it
}

// unknown is the step's *OutcomeUnknownError.
func (c *outsideCall[T]) unknown(cause, reconcileErr string) error {
	return &OutcomeUnknownError{RunID: c.r.lease.RunID, Step: c.id, Key: c.key, Cause: cause,
		Reconcilable: c.o.reconcile != nil, ReconcileErr: reconcileErr}
}

// settleEarlier settles the intent an earlier attempt recorded without
// its result: with a Reconcile function, after waiting out that attempt's
// lease, a call found completes the step (done); one not found is called
// again, as this attempt's first try.
func (c *outsideCall[T]) settleEarlier(ctx context.Context) (out T, done bool, err error) {
	r, id := c.r, c.id
	cause := c.cp.Error
	if cause == "" {
		cause = "an earlier attempt stopped between recording the call's intent and its result"
	}
	if c.o.reconcile == nil {
		return out, false, c.unknown(cause, "")
	}
	if err := r.waitOutPreviousLease(ctx, id); err != nil {
		return out, false, fmt.Errorf("%w while waiting to reconcile outside call %s: %w", ErrInterrupted, id, err)
	}
	res, found, err := c.o.reconcile(withStep(ctx, r, id), c.key)
	if err != nil {
		return out, false, c.unknown(cause, err.Error())
	}
	r.log.Info().Str(FieldStepID, id).Bool("found", found).Msg("reconciled an outside call of unknown outcome")
	if found {
		out, err = completeReconciled[T](ctx, r, c.cp, res)
		return out, true, err
	}
	// It never happened: call again, as this attempt's first try.
	c.cp.Tries++
	c.cp.StartedAt = r.now()
	return out, false, nil
}

// try records the call's intent, checks the lease and calls once: done
// with the result, an error when the step ends without one, neither when
// a transient failure is to be tried again (after the policy's backoff,
// slept here).
func (c *outsideCall[T]) try(ctx context.Context, try int, policy RetryPolicy) (out T, done bool, err error) {
	r, id := c.r, c.id
	intent := c.cp
	intent.Status, intent.Error, intent.FinishedAt = checkpoint.StepCalling, "", r.now()
	if err := r.runTx(ctx, func(tx checkpoint.Tx) error { return tx.PutStep(intent) }); err != nil {
		return out, false, fmt.Errorf("steps: record intent of outside call %s: %w", id, err)
	}
	crashStep(id, "after-intent")
	var window time.Duration
	err = ctx.Err()
	if err != nil {
		err = fmt.Errorf("%w before outside call %s: %w", ErrInterrupted, id, context.Cause(ctx))
	} else if window, err = r.callWindow(ctx, id); errors.Is(err, checkpoint.ErrFenced) {
		// Another runner holds the run: it finds the intent and settles
		// it. Nothing was called.
		return out, false, err
	}
	if err != nil {
		// Not called: record so, and a rerun calls.
		r.recordFailure(context.WithoutCancel(ctx), c.cp, err)
		return out, false, err
	}
	timeout := c.o.timeout
	if window > 0 && (timeout <= 0 || window < timeout) {
		timeout = window
	}
	result, fnErr := callOnce(ctx, r, id, timeout, func(ctx context.Context) (T, error) { return c.fn(ctx, c.key) })
	interrupted := ctx.Err() != nil
	wctx := context.WithoutCancel(ctx)
	if fnErr == nil {
		if c.cp.Output, err = json.Marshal(result); err != nil {
			return out, false, fmt.Errorf("steps: step %s: encode output %T as JSON: %w", id, result, err)
		}
		crashStep(id, "before-result")
		out, err = completeStep[T](wctx, r, c.cp)
		return out, true, err
	}
	var unk *unknownOutcome
	if errors.As(fnErr, &unk) || errors.Is(fnErr, context.DeadlineExceeded) ||
		(interrupted && errors.Is(fnErr, context.Canceled)) {
		// A call cut short by a timeout or an interruption may have
		// reached the outside system: its outcome is unknown, not a
		// failure.
		cause := fnErr.Error()
		if errors.Is(fnErr, context.DeadlineExceeded) && timeout == window && window > 0 {
			cause += fmt.Sprintf(" (a call may take %s: its lease less a %s margin)", window.Round(time.Millisecond), r.callMargin)
		}
		intent.Error = cause
		if out, done, fnErr, err = c.afterUnknown(ctx, intent, fnErr, interrupted); done || err != nil {
			return out, done, err
		}
	}
	return out, false, c.failed(ctx, try, policy, fnErr, interrupted)
}

// afterUnknown records a try's unknown outcome (intent, with its cause)
// and, with a Reconcile function and the attempt not interrupted, waits
// CallMargin for a request on its way to land and looks: found completes
// the step (done); not found is the transient failure it returns.
func (c *outsideCall[T]) afterUnknown(ctx context.Context, intent checkpoint.Step, fnErr error, interrupted bool) (out T, done bool, failure, err error) {
	r, id, cause := c.r, c.id, intent.Error
	wctx := context.WithoutCancel(ctx)
	if err := r.runTx(wctx, func(tx checkpoint.Tx) error { return tx.PutStep(intent) }); err != nil {
		r.log.Warn().Str(FieldStepID, id).Err(err).Msg("could not record the unknown outcome")
	}
	if c.o.reconcile == nil || interrupted {
		return out, false, nil, c.unknown(cause, "")
	}
	// Give a request on its way time to land, then look.
	r.log.Warn().Str(FieldStepID, id).Err(fnErr).Float64("reconcile_in_seconds", r.callMargin.Seconds()).
		Msg("outside call of unknown outcome; reconciling")
	if r.callMargin > 0 {
		if err := r.sleep(ctx, r.callMargin); err != nil {
			return out, false, nil, c.unknown(cause, "")
		}
	}
	res, found, err := c.o.reconcile(withStep(ctx, r, id), c.key)
	if err != nil {
		return out, false, nil, c.unknown(cause, err.Error())
	}
	r.log.Info().Str(FieldStepID, id).Bool("found", found).Msg("reconciled an outside call of unknown outcome")
	if found {
		out, err = completeReconciled[T](wctx, r, c.cp, res)
		return out, true, nil, err
	}
	return out, false, Transient(fmt.Errorf("%w; reconciled: the call did not happen", fnErr)), nil
}

// failed ends the step with fnErr, a try's failure, unless it is
// transient with tries left under policy and the attempt goes on: then it
// records the try, waits the backoff and returns nil for the next try.
func (c *outsideCall[T]) failed(ctx context.Context, try int, policy RetryPolicy, fnErr error, interrupted bool) error {
	r, id := c.r, c.id
	class := Classify(fnErr, ClassPermanent)
	if class != ClassTransient || try >= policy.MaxTries || interrupted {
		if class == ClassTransient && policy.MaxTries > 1 {
			fnErr = fmt.Errorf("%w (gave up after %s)", fnErr, plural(try, "try", "tries"))
		}
		return r.recordFailure(context.WithoutCancel(ctx), c.cp, fnErr)
	}
	delay := policy.Backoff(try, rand.Float64())
	r.recordTry(ctx, &c.cp, fnErr)
	r.log.Warn().Str(FieldStepID, id).Int("try", try).Int("tries_total", c.cp.Tries).Float64(FieldRetryInSeconds, delay.Seconds()).Err(fnErr).
		Msg("outside call failed; retrying with the same idempotency key")
	c.cp.Tries++
	if err := r.sleep(ctx, delay); err != nil {
		return fmt.Errorf("%w while waiting to retry outside call %s: %w", ErrInterrupted, id, err)
	}
	c.cp.StartedAt = r.now()
	return nil
}

// callRecord is the checkpoint.CallRecord of a call with key whose
// output type is T, as Step.Call holds it.
func callRecord[T any](key string) []byte {
	shape, err := json.Marshal(OutputShape[T]())
	if err != nil {
		// Strings, integers and booleans: cannot fail.
		panic(fmt.Sprintf("steps: encode the shape of %s: %v", reflect.TypeFor[T](), err))
	}
	return checkpoint.CallRecord{Key: key, OutputShape: shape}.Encode()
}

// CheckCallOutput checks output, an operator's result for an outside call
// whose record is call (checkpoint.Step.Call), against the shape of the
// step's output type (see CheckShape), and returns the shape it checked
// against: nil when the step recorded none (a step that is not a Call, or
// one recorded before calls kept their shape), and then checks nothing.
func CheckCallOutput(call, output []byte) (*Shape, error) {
	rec, err := checkpoint.DecodeCallRecord(call)
	if err != nil || rec == nil || len(rec.OutputShape) == 0 {
		return nil, err
	}
	var s Shape
	if err := json.Unmarshal(rec.OutputShape, &s); err != nil {
		return nil, fmt.Errorf("steps: decode the recorded output shape: %w", err)
	}
	return &s, CheckShape(&s, output)
}

// callWindow checks, right before an outside call, that this attempt still
// holds the run, and returns how long the call may take. It renews the
// lease (a write checked against the fence): the lease then runs until at
// least LeaseFor after the renewal began, and the call may take until
// CallMargin before that. Without LeaseFor it renews nothing: it checks
// the fence and that the lease has not expired (a fence check alone would
// let a call start on an expired lease, which a runner taking over may
// be about to reconcile or repeat), and the call is bounded by the
// lease's end less CallMargin.
func (r *Run) callWindow(ctx context.Context, id string) (time.Duration, error) {
	if r.leaseFor <= 0 {
		info, err := r.store.Run(ctx, r.lease.RunID)
		if err != nil {
			return 0, fmt.Errorf("steps: check the lease before outside call %s: %w", id, err)
		}
		run := info.Run
		if run.Fence != r.lease.Fence {
			return 0, fmt.Errorf("steps: outside call %s not made: %w: run %s is at fence %d, this attempt holds %d",
				id, checkpoint.ErrFenced, r.lease.RunID, run.Fence, r.lease.Fence)
		}
		window := run.LeaseUntil.Sub(r.now()) - r.callMargin
		if window <= 0 {
			return 0, fmt.Errorf("steps: outside call %s not made: %w: the lease of run %s ends at %s, leaving no time for it "+
				"(give Config.LeaseFor so the call renews the lease first)",
				id, ErrLeaseExpired, r.lease.RunID, run.LeaseUntil.UTC().Format(time.RFC3339))
		}
		return window, nil
	}
	begun := r.now()
	if err := r.write(ctx, "extend the lease", func() error { return r.store.Heartbeat(ctx, r.lease, begun, begun.Add(r.leaseFor)) }); err != nil {
		if errors.Is(err, checkpoint.ErrFenced) {
			return 0, fmt.Errorf("steps: outside call %s not made: %w", id, err)
		}
		return 0, fmt.Errorf("steps: renew the lease before outside call %s: %w", id, err)
	}
	window := r.leaseFor - r.callMargin - r.now().Sub(begun)
	if window <= 0 {
		return 0, fmt.Errorf("steps: outside call %s not made: renewing the %s lease took %s, leaving no time before its %s margin",
			id, r.leaseFor, r.now().Sub(begun), r.callMargin)
	}
	return window, nil
}

// waitOutPreviousLease waits until the lease of the attempt this one took
// over has run out, so that an outside call that attempt sent has landed
// (or never will) before it is reconciled.
func (r *Run) waitOutPreviousLease(ctx context.Context, id string) error {
	if r.prevUntil.IsZero() {
		return nil
	}
	d := r.prevUntil.Sub(r.now())
	if d <= 0 {
		return nil
	}
	r.log.Info().Str(FieldStepID, id).Float64("wait_seconds", d.Seconds()).Time("until", r.prevUntil).
		Msg("waiting out the previous runner's lease before reconciling its outside call: a request it sent may still land")
	return r.sleep(ctx, d)
}

// completeReconciled records a reconciled call's output as the step's.
func completeReconciled[T any](ctx context.Context, r *Run, cp checkpoint.Step, res any) (T, error) {
	var zero T
	var err error
	if cp.Output, err = json.Marshal(res); err != nil {
		return zero, fmt.Errorf("steps: step %s: encode reconciled output: %w", cp.ID, err)
	}
	return completeStep[T](ctx, r, cp)
}

// completeStep records cp as completed and returns its output.
func completeStep[T any](ctx context.Context, r *Run, cp checkpoint.Step) (T, error) {
	var zero T
	cp.Status, cp.FinishedAt, cp.Error = checkpoint.StepCompleted, r.now(), ""
	if err := r.runTx(ctx, func(tx checkpoint.Tx) error { return tx.PutStep(cp) }); err != nil {
		return zero, fmt.Errorf("steps: checkpoint step %s: %w", cp.ID, err)
	}
	return finish[T](r, cp)
}
