package steps

import (
	"context"
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
func Apply[T any](ctx context.Context, r *Run, id string, target Target, fn func(ctx context.Context, e *Effects) (T, error), opts ...Option) (out T, err error) {
	ctx, sp := r.startStep(ctx, id, kindApply)
	defer func() { sp.end(err) }()
	var zero T
	cp, out, done, err := start[T](ctx, r, id, opts, sp)
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
		u := &stepUnit{r: r, cp: &cp, pr: pr}
		err := r.resumeRecorded(ctx, ot, u, pr.EffectID, pr.Writes, func() (effectUnit, error) {
			// Another writer moved a key before our plan applied, so
			// nothing of ours applied: plan again from the recorded ops.
			return &stepUnit{r: r, cp: &cp, pr: PlanRecord{Target: pr.Target, Ops: pr.Ops}}, nil
		})
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
		if err = r.applySame(ctx, ot, &stepUnit{r: r, cp: &cp, pr: pr}); err == nil {
			crashStep(cp.ID, "after-commit")
		}
	default:
		err = r.applySeparate(ctx, ot, &stepUnit{r: r, cp: &cp, pr: pr})
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
	// Call, for an outside call (Call) a dry run reached, is the
	// idempotency key it would be called with. The dry run makes no call
	// and stops there (ErrDryRunStopped): the steps after it need the
	// call's result.
	Call string `json:"call,omitempty"`
}

// readTarget reads keys' current state in one read-only transaction, which
// takes no write lock from the target's other writers.
func readTarget(ctx context.Context, ot *openTarget, keys []string) (map[string]checkpoint.State, error) {
	var cur map[string]checkpoint.State
	err := ot.et.View(ctx, func(tgt checkpoint.Target) error {
		var err error
		cur, err = tgt.Read(ctx, keys)
		return err
	})
	return cur, err
}
