package steps

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// MaxReplans bounds how often a separate-store step re-plans after another
// writer moved one of its keys, before it fails with the conflict.
const MaxReplans = 8

// PlanRecord is the effect plan stored with a step's checkpoint (as JSON in
// checkpoint.Step.Plan).
type PlanRecord struct {
	// Target names where the effects land.
	Target string `json:"target"`
	// EffectID identifies a separate-store plan in the target's
	// stepwise_applied table; empty on the same store.
	EffectID string `json:"effect_id,omitempty"`
	// Ops are the step's relative operations, kept so a plan that lost a
	// race can be made again from them.
	Ops []Op `json:"ops"`
	// Writes are the compare-and-set writes computed from Ops.
	Writes []checkpoint.Write `json:"writes"`
}

// Apply runs the step id once per run, like Do, with effects: fn records
// relative operations on e, and after it returns the runner turns them into
// compare-and-set writes on target and applies them exactly once.
//
// If an operation would break a guard (an overdraft), nothing is applied and
// the step is pinned as rejected: Apply returns a *RejectedError, now and on
// every rerun, even if the balance has grown since.
//
// On the same store the read, plan, writes and checkpoint commit in one
// transaction. On a separate store the plan is recorded first, then applied
// in one target transaction that also records its effect ID, then the step
// is marked done; a rerun finishes whichever part is missing.
func Apply[T any](ctx context.Context, r *Run, id string, target Target, fn func(ctx context.Context, e *Effects) (T, error), opts ...Option) (T, error) {
	var zero T
	cp, out, done, err := start[T](ctx, r, id, opts)
	if done || err != nil {
		return out, err
	}
	ot, err := r.target(ctx, target)
	if err != nil {
		return zero, err
	}
	if cp.Status == checkpoint.StepPlanned {
		ctx = context.WithoutCancel(ctx) // a recorded plan is always finished
		var pr PlanRecord
		if err := json.Unmarshal(cp.Plan, &pr); err != nil {
			return zero, fmt.Errorf("steps: step %s: decode recorded plan: %w", id, err)
		}
		if r.dryRun {
			// Preview what re-planning from the recorded operations would do.
			return settle[T](ctx, r, cp, r.dryApply(ctx, ot, &cp, PlanRecord{Target: pr.Target, Ops: pr.Ops}))
		}
		r.log.Info().Str(FieldStepID, id).Str("effect_id", pr.EffectID).Msg("finishing a recorded plan")
		err := r.finishPlanned(ctx, ot, &cp, pr)
		var conflict *checkpoint.VersionConflictError
		if errors.As(err, &conflict) {
			// Another writer moved a key before our plan applied, so
			// nothing of ours applied: plan again from the recorded ops.
			r.log.Warn().Str(FieldStepID, id).Str("key", conflict.Key).Msg("recorded plan is stale; re-planning")
			r.count(func(s *Stats) { s.Conflicts++; s.Replans++ })
			err = r.applySeparate(ctx, ot, &cp, PlanRecord{Target: pr.Target, Ops: pr.Ops})
		}
		return settle[T](ctx, r, cp, err)
	}
	var e Effects
	result, fnErr := callWithPolicy(ctx, r, &cp, newOptions(opts), func(ctx context.Context) (T, error) {
		e = Effects{} // a retried try records its operations afresh
		return fn(ctx, &e)
	})
	ctx = context.WithoutCancel(ctx) // finish recording even if interrupted
	if fnErr != nil {
		return zero, r.recordFailure(ctx, cp, fnErr)
	}
	if cp.Output, err = json.Marshal(result); err != nil {
		return zero, fmt.Errorf("steps: step %s: encode output %T as JSON: %w", id, result, err)
	}
	pr := PlanRecord{Target: ot.name, Ops: e.ops}
	switch {
	case r.dryRun:
		err = r.dryApply(ctx, ot, &cp, pr)
	case ot.same:
		err = r.applySame(ctx, ot, &cp, pr)
	default:
		err = r.applySeparate(ctx, ot, &cp, pr)
	}
	return settle[T](ctx, r, cp, err)
}

// settle ends an effect step after its plan was applied (err nil), broke a
// guard (pinned as a rejection) or failed.
func settle[T any](ctx context.Context, r *Run, cp checkpoint.Step, err error) (T, error) {
	var zero T
	var guard *GuardError
	if errors.As(err, &guard) {
		return zero, r.pin(ctx, cp, guard)
	}
	if err != nil {
		return zero, err
	}
	return finish[T](r, cp)
}

// applySame reads, plans, writes and checkpoints in one transaction. A
// guard failure rolls back and is returned as a *GuardError.
func (r *Run) applySame(ctx context.Context, ot *openTarget, cp *checkpoint.Step, pr PlanRecord) error {
	err := r.store.InTx(ctx, r.lease, func(tx checkpoint.Tx) error {
		cur, err := ot.h.Read(ctx, tx.SQL(), keysOf(pr.Ops))
		if err != nil {
			return err
		}
		res, err := Plan(cur, pr.Ops)
		if err != nil {
			return err
		}
		if g := res.Rejected[0]; g != nil {
			return g
		}
		if err := ot.h.Write(ctx, tx.SQL(), res.Writes); err != nil {
			return err
		}
		pr.Writes = res.Writes
		cp.Status, cp.FinishedAt = checkpoint.StepCompleted, r.now()
		if cp.Plan, err = json.Marshal(pr); err != nil {
			return err
		}
		crashStep(cp.ID, "before-commit")
		return tx.PutStep(*cp)
	})
	if err != nil {
		var g *GuardError
		if errors.As(err, &g) {
			return g
		}
		return fmt.Errorf("steps: step %s: apply effects to %s: %w", cp.ID, ot.name, err)
	}
	r.count(func(s *Stats) { s.Effects += len(pr.Writes) })
	crashStep(cp.ID, "after-commit")
	return nil
}

// applySeparate plans against the target's current state, records the plan
// in the checkpoint store, applies it in one target transaction, and records
// the step done. A version conflict (another writer moved a key) re-plans.
func (r *Run) applySeparate(ctx context.Context, ot *openTarget, cp *checkpoint.Step, pr PlanRecord) error {
	for replan := 0; ; replan++ {
		cur, err := readTarget(ctx, ot, keysOf(pr.Ops))
		if err != nil {
			return fmt.Errorf("steps: step %s: read %s: %w", cp.ID, ot.name, err)
		}
		res, err := Plan(cur, pr.Ops)
		if err != nil {
			return fmt.Errorf("steps: step %s: plan effects on %s: %w", cp.ID, ot.name, err)
		}
		if g := res.Rejected[0]; g != nil {
			return g
		}
		pr.Writes = res.Writes
		pr.EffectID = fmt.Sprintf("%s/%s@%d.%d", r.lease.RunID, cp.ID, r.lease.Fence, replan)
		cp.Status, cp.FinishedAt = checkpoint.StepPlanned, r.now()
		if cp.Plan, err = json.Marshal(pr); err != nil {
			return err
		}
		if err := r.store.InTx(ctx, r.lease, func(tx checkpoint.Tx) error { return tx.PutStep(*cp) }); err != nil {
			return fmt.Errorf("steps: step %s: record plan: %w", cp.ID, err)
		}
		crashStep(cp.ID, "after-plan")
		err = r.finishPlanned(ctx, ot, cp, pr)
		var conflict *checkpoint.VersionConflictError
		if !errors.As(err, &conflict) {
			return err
		}
		r.count(func(s *Stats) { s.Conflicts++ })
		if replan+1 >= MaxReplans {
			return err
		}
		r.count(func(s *Stats) { s.Replans++ })
		r.log.Warn().Str(FieldStepID, cp.ID).Str("key", conflict.Key).Int64("expected", conflict.Expected).
			Int64("found", conflict.Found).Msg("another writer moved a key; re-planning")
	}
}

// finishPlanned brings a recorded separate-store plan to completion: if the
// target already holds its effect ID it applied (record it); otherwise apply
// it if every expected version still matches; otherwise it returns the
// *checkpoint.VersionConflictError: nothing of ours applied, and the caller
// re-plans from the recorded operations.
func (r *Run) finishPlanned(ctx context.Context, ot *openTarget, cp *checkpoint.Step, pr PlanRecord) error {
	if err := r.checkFence(ctx); err != nil {
		return err
	}
	applied := false
	err := targetTx(ctx, ot.h.DB(), nil, func(tx *sql.Tx) error {
		var err error
		if applied, err = ot.h.IsApplied(ctx, tx, pr.EffectID); err != nil || applied {
			return err
		}
		if err := ot.h.Write(ctx, tx, pr.Writes); err != nil {
			return err
		}
		return ot.h.MarkApplied(ctx, tx, pr.EffectID, r.lease.RunID, cp.ID, r.now())
	})
	if err == nil && !applied {
		r.count(func(s *Stats) { s.Effects += len(pr.Writes) })
	}
	var conflict *checkpoint.VersionConflictError
	if errors.As(err, &conflict) {
		return conflict
	}
	if err != nil {
		return fmt.Errorf("steps: step %s: apply plan %s to %s: %w", cp.ID, pr.EffectID, ot.name, err)
	}
	if applied {
		r.log.Info().Str(FieldStepID, cp.ID).Str("effect_id", pr.EffectID).Msg("plan had already applied; recording it")
	}
	crashStep(cp.ID, "after-apply")
	cp.Status, cp.FinishedAt = checkpoint.StepCompleted, r.now()
	if err := r.store.InTx(ctx, r.lease, func(tx checkpoint.Tx) error { return tx.PutStep(*cp) }); err != nil {
		return fmt.Errorf("steps: step %s: record applied plan: %w", cp.ID, err)
	}
	return nil
}

// checkFence fails with checkpoint.ErrFenced if another runner claimed the
// run, so a runner that lost its lease does not touch a separate target
// with a plan recorded by an earlier attempt. (A takeover between this
// check and the target's commit can still let the old runner apply its own
// recorded plan once; the new owner then finds its effect ID, so the effect
// is still applied exactly once.)
func (r *Run) checkFence(ctx context.Context) error {
	fence, err := r.store.Fence(ctx, r.lease.RunID)
	if err != nil {
		return err
	}
	if fence != r.lease.Fence {
		return fmt.Errorf("%w: run %s is at fence %d, this attempt holds %d", checkpoint.ErrFenced, r.lease.RunID, fence, r.lease.Fence)
	}
	return nil
}

// dryApply plans against current values (and earlier dry-run plans) and
// records the plan for printing; nothing is written.
func (r *Run) dryApply(ctx context.Context, ot *openTarget, cp *checkpoint.Step, pr PlanRecord) error {
	keys := keysOf(pr.Ops)
	cur, err := readTarget(ctx, ot, keys)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		if s, ok := r.dryState[ot.name+"\x00"+k]; ok {
			cur[k] = s
		}
	}
	res, err := Plan(cur, pr.Ops)
	if err != nil {
		return fmt.Errorf("steps: step %s: plan effects on %s: %w", cp.ID, ot.name, err)
	}
	if g := res.Rejected[0]; g != nil {
		r.dryPlans = append(r.dryPlans, DryPlan{Step: cp.ID, Target: ot.name, Rejected: []string{g.Error()}})
		return g
	}
	for _, w := range res.Writes {
		r.dryState[ot.name+"\x00"+w.Key] = checkpoint.State{Value: w.NewValue, Version: w.OldVersion + 1, Exists: true}
	}
	r.dryPlans = append(r.dryPlans, DryPlan{Step: cp.ID, Target: ot.name, Writes: res.Writes})
	cp.Status, cp.FinishedAt = checkpoint.StepCompleted, r.now()
	return nil
}

// DryPlan is what a dry run would have applied for one step.
type DryPlan struct {
	Step   string             `json:"step"`
	Target string             `json:"target"`
	Writes []checkpoint.Write `json:"writes,omitempty"`
	// Rejected says why each rejected step or item would be rejected, in
	// item order.
	Rejected []string `json:"rejected,omitempty"`
	// Items is how many batch items the plan covers (0 for a plain step).
	Items int `json:"items,omitempty"`
}

// readTarget reads keys' current state in one read transaction (a
// deferred BEGIN: reading takes no write lock from the target's other
// writers).
func readTarget(ctx context.Context, ot *openTarget, keys []string) (map[string]checkpoint.State, error) {
	var cur map[string]checkpoint.State
	err := targetTx(ctx, ot.h.DB(), &sql.TxOptions{ReadOnly: true}, func(tx *sql.Tx) error {
		var err error
		cur, err = ot.h.Read(ctx, tx, keys)
		return err
	})
	return cur, err
}

// targetTx runs fn in one transaction on a target database.
func targetTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}
