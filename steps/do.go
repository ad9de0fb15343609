package steps

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// Option changes how one Do or Apply call behaves.
type Option func(*doOptions)

type doOptions struct {
	input     any
	hasInput  bool
	retry     *RetryPolicy
	timeout   time.Duration
	reconcile ReconcileFunc
	chunkSize int
	target    *Target
	skipLimit int
	// Partitions (partition.go).
	partitions int
}

// Input declares the step's input. Its JSON encoding is hashed and recorded
// with the checkpoint; a rerun whose input hashes differently fails with a
// *StepChangedError instead of replaying an output computed from other data.
func Input(v any) Option {
	return func(o *doOptions) { o.input, o.hasInput = v, true }
}

func newOptions(opts []Option) doOptions {
	var o doOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// hash returns the hex SHA-256 of the input's JSON, or "" without input.
func (o *doOptions) hash(id string) (string, error) {
	if !o.hasInput {
		return "", nil
	}
	b, err := json.Marshal(o.input)
	if err != nil {
		return "", fmt.Errorf("steps: step %s: encode input for hashing: %w", id, err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// Do runs the step id once per run. If the step is already checkpointed it
// returns the recorded output without calling fn. Otherwise it calls fn and
// commits its output (as JSON) with the step's checkpoint; the value returned
// is always decoded from that JSON, so the first attempt and every rerun see
// identical data.
//
// An error from fn is classified (see Classify): a transient one is retried
// under the step's RetryPolicy (Retry, or the job's), each try counted in
// the checkpoint; a permanent one, or the last transient one, is returned
// wrapped in a *StepError and recorded as failed, and a rerun runs the step
// again. An error wrapped with Reject is pinned: recorded, and returned as a
// *RejectedError on every rerun. Timeout bounds each try.
func Do[T any](ctx context.Context, r *Run, id string, fn func(ctx context.Context) (T, error), opts ...Option) (out T, err error) {
	ctx, sp := r.startStep(ctx, id, kindDo)
	defer func() { sp.end(err) }()
	var zero T
	cp, out, done, err := start[T](ctx, r, id, opts, sp)
	if done || err != nil {
		return out, err
	}
	result, fnErr := callWithPolicy(ctx, r, &cp, newOptions(opts), fn)
	// From here the step's result is known: record it even if the run is
	// being interrupted, so a finished step is never thrown away.
	ctx = context.WithoutCancel(ctx)
	if fnErr != nil {
		return zero, r.recordFailure(ctx, cp, fnErr)
	}
	if cp.Output, err = json.Marshal(result); err != nil {
		return zero, fmt.Errorf("steps: step %s: encode output %T as JSON: %w", id, result, err)
	}
	cp.Status, cp.FinishedAt = checkpoint.StepCompleted, r.now()
	if r.dryRun {
		return finish[T](r, cp)
	}
	crashStep(id, "before-checkpoint")
	if err := r.runTx(ctx, func(tx checkpoint.Tx) error { return tx.PutStep(cp) }); err != nil {
		return zero, fmt.Errorf("steps: checkpoint step %s: %w", id, err)
	}
	crashStep(id, "after-checkpoint")
	return finish[T](r, cp)
}

// start claims id for this attempt. If the step is already finished it
// returns its recorded output (or rejection) with done set. Otherwise it
// returns the checkpoint to fill in, with input hash, try count and start
// time set. A step left planned by a crash is returned with done unset and
// cp.Status == StepPlanned for Apply to finish.
func start[T any](ctx context.Context, r *Run, id string, opts []Option, sp *stepSpan) (cp checkpoint.Step, out T, done bool, err error) {
	o := newOptions(opts)
	rec, recorded, err := r.use(id)
	if err != nil {
		return cp, out, false, err
	}
	hash, err := o.hash(id)
	if err != nil {
		return cp, out, false, err
	}
	if r.worker != nil && r.worker.Step != id && !(recorded && (rec.Status == checkpoint.StepCompleted || rec.Status == checkpoint.StepRejected)) {
		// A partition worker replays recorded steps only: the run's owner
		// runs the rest.
		return cp, out, false, &StepNotRecordedError{RunID: r.lease.RunID, Step: id, Status: rec.Status, Partition: r.worker.Step}
	}
	if recorded && rec.Status != checkpoint.StepFailed {
		if rec.InputHash != hash {
			return cp, out, false, &StepChangedError{RunID: r.lease.RunID, Step: id, Old: rec.InputHash, New: hash}
		}
		switch rec.Status {
		case checkpoint.StepPlanned, checkpoint.StepCalling:
			return rec, out, false, nil
		case checkpoint.StepCompleted, checkpoint.StepRejected:
			sp.replayed, sp.tries = true, rec.Tries
			r.count(func(s *Stats) { s.Skipped++ })
			r.log.Info().Str(FieldStepID, id).Msg("skipped (checkpointed)")
			out, err = decodeOutput[T](rec)
			return rec, out, true, err
		}
	}
	if err := ctx.Err(); err != nil {
		return cp, out, false, fmt.Errorf("%w before step %s: %w", ErrInterrupted, id, context.Cause(ctx))
	}
	cp = checkpoint.Step{ID: id, InputHash: hash, Tries: 1, StartedAt: r.now()}
	if recorded {
		cp.Tries = rec.Tries + 1
	}
	sp.tries = cp.Tries
	return cp, out, false, nil
}

// finish counts and logs a step this attempt completed and returns its
// output decoded from the recorded JSON.
func finish[T any](r *Run, cp checkpoint.Step) (T, error) {
	r.count(func(s *Stats) { s.Executed++ })
	r.log.Info().Str(FieldStepID, cp.ID).Float64(FieldTookSeconds, cp.FinishedAt.Sub(cp.StartedAt).Seconds()).Msg("step completed")
	return decodeOutput[T](cp)
}

// decodeOutput decodes a finished checkpoint's output, or returns its pinned
// rejection.
func decodeOutput[T any](cp checkpoint.Step) (T, error) {
	var out T
	if cp.Status == checkpoint.StepRejected {
		return out, &RejectedError{Step: cp.ID, Reason: cp.Error}
	}
	if err := json.Unmarshal(cp.Output, &out); err != nil {
		return out, fmt.Errorf("steps: step %s: decode recorded output into %T: %w", cp.ID, out, err)
	}
	return out, nil
}

// recordFailure records a failed try or a pinned rejection and returns the
// error the step reports. A failure to record a plain failure is logged, not
// returned: the step is retried by a rerun either way.
func (r *Run) recordFailure(ctx context.Context, cp checkpoint.Step, fnErr error) error {
	cp.FinishedAt = r.now()
	cp.Error = fnErr.Error()
	cp.Output, cp.Plan = nil, nil
	var rej *rejection
	if errors.As(fnErr, &rej) {
		return r.pin(ctx, cp, rej.err)
	}
	cp.Status = checkpoint.StepFailed
	r.count(func(s *Stats) { s.Failed++ })
	if !r.dryRun {
		err := r.runTx(ctx, func(tx checkpoint.Tx) error { return tx.PutStep(cp) })
		if errors.Is(err, checkpoint.ErrFenced) {
			return fmt.Errorf("steps: record failure of step %s: %w", cp.ID, err)
		}
		if err != nil {
			r.log.Warn().Str(FieldStepID, cp.ID).Err(err).Msg("could not record the step's failure")
		}
	}
	ev := r.log.Warn()
	if errors.Is(fnErr, context.Canceled) {
		ev = r.log.Debug() // stopped by an interruption, which the runner logs once
	}
	ev.Str(FieldStepID, cp.ID).Int("tries", cp.Tries).Err(fnErr).Msg("step failed")
	return &StepError{RunID: r.lease.RunID, Step: cp.ID, Err: fnErr}
}

// pin records a business rejection so every rerun returns it.
func (r *Run) pin(ctx context.Context, cp checkpoint.Step, cause error) error {
	cp.Status = checkpoint.StepRejected
	if cp.FinishedAt.IsZero() { // an effect step's guard broke before it set one
		cp.FinishedAt = r.now()
	}
	cp.Error = cause.Error()
	if !r.dryRun {
		if err := r.runTx(ctx, func(tx checkpoint.Tx) error { return tx.PutStep(cp) }); err != nil {
			return fmt.Errorf("steps: record rejection of step %s: %w", cp.ID, err)
		}
	}
	r.count(func(s *Stats) { s.Executed++ })
	r.log.Info().Str(FieldStepID, cp.ID).Str("reason", cp.Error).Msg("step rejected (pinned)")
	return &RejectedError{Step: cp.ID, Reason: cp.Error, err: cause}
}

// ChunkSize sets how many items a ForEach commits together (its commit
// interval). Defaults to 500. Ignored by Do and Apply.
func ChunkSize(n int) Option { return func(o *doOptions) { o.chunkSize = n } }

// WithTarget says where a ForEach's item effects land. Ignored by Do; Apply
// takes its target as an argument.
func WithTarget(t Target) Option { return func(o *doOptions) { o.target = &t } }

// SkipFailures lets a ForEach go on past up to limit failing items: each is
// recorded as skipped with its error, reported in the summary and by `show`,
// and not retried by a plain rerun. Beyond limit the step fails. Without
// it, the first failing item fails the step. Ignored by Do and Apply.
func SkipFailures(limit int) Option { return func(o *doOptions) { o.skipLimit = limit } }
