package steps

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// Option changes how one Do call behaves.
type Option func(*doOptions)

type doOptions struct {
	input    any
	hasInput bool
}

// Input declares the step's input. Its JSON encoding is hashed and recorded
// with the checkpoint; a rerun whose input hashes differently fails with a
// *StepChangedError instead of replaying an output computed from other data.
func Input(v any) Option {
	return func(o *doOptions) { o.input, o.hasInput = v, true }
}

// Do runs the step id once per run. If the step is already checkpointed it
// returns the recorded output without calling fn. Otherwise it calls fn and
// commits its output (as JSON) with the step's checkpoint; the value returned
// is always decoded from that JSON, so the first attempt and every rerun see
// identical data.
//
// An error from fn is returned wrapped in a *StepError and recorded as a
// failed try; a rerun runs the step again. An error wrapped with Reject is
// pinned: recorded, and returned as a *RejectedError on every rerun.
func Do[T any](ctx context.Context, r *Run, id string, fn func(ctx context.Context) (T, error), opts ...Option) (T, error) {
	var zero T
	var o doOptions
	for _, opt := range opts {
		opt(&o)
	}
	rec, recorded, err := r.use(id)
	if err != nil {
		return zero, err
	}
	hash := ""
	if o.hasInput {
		if hash, err = hashInput(o.input); err != nil {
			return zero, fmt.Errorf("steps: step %s: hash input: %w", id, err)
		}
	}
	if recorded && (rec.Status == checkpoint.StepCompleted || rec.Status == checkpoint.StepRejected) {
		if rec.InputHash != hash {
			return zero, &StepChangedError{RunID: r.lease.RunID, Step: id, Old: rec.InputHash, New: hash}
		}
		r.count(func(s *Stats) { s.Skipped++ })
		r.log.Info().Str(FieldStepID, id).Msg("skipped (checkpointed)")
		if rec.Status == checkpoint.StepRejected {
			return zero, &RejectedError{Step: id, Reason: rec.Error}
		}
		var out T
		if err := json.Unmarshal(rec.Output, &out); err != nil {
			return zero, fmt.Errorf("steps: step %s: decode recorded output into %T: %w", id, out, err)
		}
		return out, nil
	}
	if err := ctx.Err(); err != nil {
		return zero, fmt.Errorf("%w before step %s: %w", ErrInterrupted, id, context.Cause(ctx))
	}
	tries := 1
	if recorded {
		tries = rec.Tries + 1
	}
	started := r.now()
	out, fnErr := fn(ctx)
	cp := checkpoint.Step{ID: id, InputHash: hash, Tries: tries, StartedAt: started}
	if fnErr != nil {
		return zero, r.recordFailure(ctx, cp, fnErr)
	}
	encoded, err := json.Marshal(out)
	if err != nil {
		return zero, fmt.Errorf("steps: step %s: encode output %T as JSON: %w", id, out, err)
	}
	cp.Status, cp.Output, cp.FinishedAt = checkpoint.StepCompleted, encoded, r.now()
	crashStep(id, "before-checkpoint")
	if err := r.store.InTx(ctx, r.lease, func(tx checkpoint.Tx) error { return tx.PutStep(cp) }); err != nil {
		return zero, fmt.Errorf("steps: checkpoint step %s: %w", id, err)
	}
	crashStep(id, "after-checkpoint")
	r.count(func(s *Stats) { s.Executed++ })
	r.log.Info().Str(FieldStepID, id).Dur("took", cp.FinishedAt.Sub(started)).Msg("step completed")
	var result T
	if err := json.Unmarshal(encoded, &result); err != nil {
		return zero, fmt.Errorf("steps: step %s: decode output %T: %w", id, result, err)
	}
	return result, nil
}

// recordFailure records a failed try or a pinned rejection and returns the
// error Do reports. A failure to record a plain failure is logged, not
// returned: the step is retried by a rerun either way.
func (r *Run) recordFailure(ctx context.Context, cp checkpoint.Step, fnErr error) error {
	cp.FinishedAt = r.now()
	cp.Error = fnErr.Error()
	var rej *rejection
	if errors.As(fnErr, &rej) {
		cp.Status = checkpoint.StepRejected
		if err := r.store.InTx(ctx, r.lease, func(tx checkpoint.Tx) error { return tx.PutStep(cp) }); err != nil {
			return fmt.Errorf("steps: record rejection of step %s: %w", cp.ID, err)
		}
		r.count(func(s *Stats) { s.Executed++ })
		r.log.Info().Str(FieldStepID, cp.ID).Str("reason", cp.Error).Msg("step rejected (pinned)")
		return &RejectedError{Step: cp.ID, Reason: cp.Error, err: rej.err}
	}
	cp.Status = checkpoint.StepFailed
	r.count(func(s *Stats) { s.Failed++ })
	if err := r.store.InTx(context.WithoutCancel(ctx), r.lease, func(tx checkpoint.Tx) error { return tx.PutStep(cp) }); err != nil {
		r.log.Warn().Str(FieldStepID, cp.ID).Err(err).Msg("could not record the step's failure")
		if errors.Is(err, checkpoint.ErrFenced) {
			return err
		}
	}
	r.log.Warn().Str(FieldStepID, cp.ID).Int("tries", cp.Tries).Err(fnErr).Msg("step failed")
	return &StepError{RunID: r.lease.RunID, Step: cp.ID, Err: fnErr}
}

func hashInput(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}
