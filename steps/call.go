package steps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/stepwise-run/stepwise/checkpoint"
)

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

// OutcomeUnknownError is returned by Call when a call to an outside system
// may or may not have happened (the runner crashed, or the call timed out,
// after the intent was recorded) and the step has no Reconcile function:
// calling again could act twice, so the run stops for an operator.
type OutcomeUnknownError struct {
	RunID string
	Step  string
	Cause string
}

func (e *OutcomeUnknownError) Error() string {
	cause := ""
	if e.Cause != "" {
		cause = " (" + e.Cause + ")"
	}
	return fmt.Sprintf("the outcome of outside call %s of run %s is unknown%s: check the outside system, then settle it with "+
		"`stepwise resolve %s --step %s --as done|retry --reason \"...\"` (done: it happened; retry: it did not, call again)",
		e.Step, e.RunID, cause, e.RunID, e.Step)
}

type unknownOutcome struct{ err error }

func (u *unknownOutcome) Error() string { return u.err.Error() }
func (u *unknownOutcome) Unwrap() error { return u.err }

// OutcomeUnknown marks an error of an outside call after which the call may
// have happened (a timeout after sending, a dropped connection): the step
// is left "outcome unknown" instead of failed. Timeouts are treated so
// without marking.
func OutcomeUnknown(err error) error {
	if err == nil {
		return nil
	}
	return &unknownOutcome{err: err}
}

// ReconcileFunc looks up an outside call by its idempotency key after a
// crash left its outcome unknown: found reports whether it happened, and
// output is its result (recorded as the step's output).
type ReconcileFunc func(ctx context.Context, key string) (output any, found bool, err error)

// Reconcile gives Call a way to settle an unknown outcome by itself (e.g.
// look the payment up by reference) instead of stopping for an operator.
func Reconcile(fn ReconcileFunc) Option { return func(o *doOptions) { o.reconcile = fn } }

// Call runs a step that calls an outside system which is not an effect (a
// payment provider, a bank file upload, an e-mail), once per run. fn gets
// the step's stable idempotency key to send along. Before calling, the step
// records its intent; after, its result. A crash in between leaves the step
// "outcome unknown": a rerun does not call again blindly but runs the
// step's Reconcile function, or stops with an *OutcomeUnknownError (exit 5)
// naming the `stepwise resolve` command that settles it.
//
// An error from fn means the call did not happen (recorded as failed; a
// rerun calls again) unless it is a timeout or marked with OutcomeUnknown.
func Call[T any](ctx context.Context, r *Run, id string, fn func(ctx context.Context, key string) (T, error), opts ...Option) (T, error) {
	var zero T
	cp, out, done, err := start[T](ctx, r, id, opts)
	if done || err != nil {
		return out, err
	}
	o := newOptions(opts)
	key := r.lease.RunID + "/" + id
	if r.dryRun {
		// A dry run neither calls outside systems nor reconciles them.
		return zero, fmt.Errorf("steps: dry run stops before outside call %s", id)
	}
	if cp.Status == checkpoint.StepCalling {
		if o.reconcile == nil {
			return zero, &OutcomeUnknownError{RunID: r.lease.RunID, Step: id, Cause: cp.Error}
		}
		res, found, err := o.reconcile(withStep(ctx, r, id), key)
		if err != nil {
			return zero, fmt.Errorf("steps: reconcile outside call %s: %w", id, err)
		}
		r.log.Info().Str(FieldStepID, id).Bool("found", found).Msg("reconciled an outside call of unknown outcome")
		if found {
			if cp.Output, err = json.Marshal(res); err != nil {
				return zero, fmt.Errorf("steps: step %s: encode reconciled output: %w", id, err)
			}
			return completeStep[T](ctx, r, cp)
		}
		// It never happened: call again.
		cp.Tries++
	}
	intent := cp
	intent.Status, intent.FinishedAt = checkpoint.StepCalling, r.now()
	if err := r.store.InTx(ctx, r.lease, func(tx checkpoint.Tx) error { return tx.PutStep(intent) }); err != nil {
		return zero, fmt.Errorf("steps: record intent of outside call %s: %w", id, err)
	}
	crashStep(id, "after-intent")
	result, fnErr := callOnce(ctx, r, id, o.timeout, func(ctx context.Context) (T, error) { return fn(ctx, key) })
	interrupted := ctx.Err() != nil
	ctx = context.WithoutCancel(ctx)
	if fnErr != nil {
		// A call cut short by a timeout or an interruption may have reached
		// the outside system: its outcome is unknown, not a failure.
		var unk *unknownOutcome
		if errors.As(fnErr, &unk) || errors.Is(fnErr, context.DeadlineExceeded) ||
			(interrupted && errors.Is(fnErr, context.Canceled)) {
			intent.Error = fnErr.Error()
			if err := r.store.InTx(ctx, r.lease, func(tx checkpoint.Tx) error { return tx.PutStep(intent) }); err != nil {
				r.log.Warn().Str(FieldStepID, id).Err(err).Msg("could not record the unknown outcome")
			}
			return zero, &OutcomeUnknownError{RunID: r.lease.RunID, Step: id, Cause: fnErr.Error()}
		}
		return zero, r.recordFailure(ctx, cp, fnErr)
	}
	if cp.Output, err = json.Marshal(result); err != nil {
		return zero, fmt.Errorf("steps: step %s: encode output %T as JSON: %w", id, result, err)
	}
	crashStep(id, "before-result")
	return completeStep[T](ctx, r, cp)
}

// completeStep records cp as completed and returns its output.
func completeStep[T any](ctx context.Context, r *Run, cp checkpoint.Step) (T, error) {
	var zero T
	cp.Status, cp.FinishedAt, cp.Error = checkpoint.StepCompleted, r.now(), ""
	if err := r.store.InTx(ctx, r.lease, func(tx checkpoint.Tx) error { return tx.PutStep(cp) }); err != nil {
		return zero, fmt.Errorf("steps: checkpoint step %s: %w", cp.ID, err)
	}
	return finish[T](r, cp)
}
