package steps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// effectUnit is what the exactly-once effect protocol applies: one step's
// effects (Apply) or one batch chunk's (ForEach). The protocol itself
// (applySame, applySeparate, finishRecorded, resumeRecorded) is written
// once; a unit only says how its plan is recorded in the checkpoint store
// and what its failures are called.
type effectUnit interface {
	// label names the unit in errors: "step post/T-1", "chunk 3 of settle".
	label() string
	// stepID is the step the unit belongs to, recorded beside its effect ID
	// in a separate target.
	stepID() string
	// point is the name the unit's crash points are built from.
	point() string
	// groups are the unit's relative operations, one group per item (one
	// group for a step). A nil group is skipped.
	groups() [][]Op
	// planned takes the planner's result before anything is written. A
	// *GuardError it returns ends the unit as a pinned rejection; a chunk
	// pins its rejected items itself and goes on.
	planned(res PlanResult) error
	// planError names what made the planner fail (an item's key).
	planError(err error) error
	// effectID names the plan made after replan earlier conflicts.
	effectID(replan int) string
	// record writes the plan into tx: applied (same store: its writes are
	// in tx too, and effectID is empty) or planned under effectID.
	record(tx checkpoint.Tx, effectID string, writes []checkpoint.Write, applied bool) error
	// superseded says the plan recorded under effectID lost a race and is
	// being made again.
	superseded(effectID string)
	// finish marks the plan recorded under effectID applied, in tx.
	finish(tx checkpoint.Tx, effectID string) error
}

// applySame reads the unit's keys, plans, writes and records the plan in
// one checkpoint transaction: a crash anywhere keeps all of it or none. A
// guard failure the unit does not pin rolls back and is returned as a
// *GuardError.
func (r *Run) applySame(ctx context.Context, ot *openTarget, u effectUnit) error {
	writes := 0
	err := r.inTx(ctx, func(tx checkpoint.Tx) error {
		tgt, err := tx.Target(ot.table)
		if err != nil {
			return err
		}
		groups := u.groups()
		cur, err := tgt.Read(ctx, keysOf(groups...))
		if err != nil {
			return err
		}
		res, err := Plan(cur, groups...)
		if err != nil {
			return u.planError(err)
		}
		if err := u.planned(res); err != nil {
			return err
		}
		if err := tgt.Write(ctx, res.Writes); err != nil {
			return err
		}
		writes = len(res.Writes)
		crashStep(u.point(), "before-commit")
		return u.record(tx, "", res.Writes, true)
	})
	if err != nil {
		var g *GuardError
		if errors.As(err, &g) {
			return g
		}
		return fmt.Errorf("steps: %s: apply effects to %s: %w", u.label(), ot.name, err)
	}
	r.count(func(s *Stats) { s.Effects += writes })
	return nil
}

// PartitionReplanTime bounds, by time rather than count, the re-plans of
// a partition's separate-store chunk: other processes' partitions may
// move its keys meanwhile, as often as their chunks commit, so a chunk
// goes on re-planning (after a jittered pause) until it applies or this
// long has passed since its first conflict, and at least MaxReplans times.
// Past it the chunk returns a *ContendedError and its partition is handed
// back, to be claimed again after a pause.
const PartitionReplanTime = 30 * time.Second

// replanTime is PartitionReplanTime, shortened by tests (export_test.go).
var replanTime atomic.Int64

func partitionReplanTime() time.Duration {
	if d := replanTime.Load(); d > 0 {
		return time.Duration(d)
	}
	return PartitionReplanTime
}

// applySeparate plans the unit against the target's current state, records
// the plan in the checkpoint store, applies it in one target transaction
// with its effect ID, and records it applied. A version conflict (another
// writer moved a key) re-plans, at most MaxReplans times in all (a
// partition's chunk: for PartitionReplanTime), then returns the
// *checkpoint.VersionConflictError (a partition's chunk: a *ContendedError
// wrapping it). The re-plans are counted in Stats and
// logged once per chunk: the first, and how many it took once it applied.
func (r *Run) applySeparate(ctx context.Context, ot *openTarget, u effectUnit) error {
	if r.part != nil {
		// Partitions of one process take turns on a separate target
		// (their reads and applies would only race each other); those of
		// other processes may still move its keys, so they re-plan for
		// longer, after a jittered pause.
		ot.mu.Lock()
		defer ot.mu.Unlock()
	}
	var firstConflict time.Time
	for replan := 0; ; replan++ {
		groups := u.groups()
		cur, err := readTarget(ctx, ot, keysOf(groups...))
		if err != nil {
			return fmt.Errorf("steps: %s: read %s: %w", u.label(), ot.name, err)
		}
		res, err := Plan(cur, groups...)
		if err != nil {
			return fmt.Errorf("steps: %s: plan effects on %s: %w", u.label(), ot.name, u.planError(err))
		}
		if err := u.planned(res); err != nil {
			return err
		}
		id := u.effectID(replan)
		err = r.inTx(ctx, func(tx checkpoint.Tx) error { return u.record(tx, id, res.Writes, false) })
		if err != nil {
			return fmt.Errorf("steps: %s: record plan: %w", u.label(), err)
		}
		crashStep(u.point(), "after-plan")
		err = r.finishRecorded(ctx, ot, u, id, res.Writes)
		var conflict *checkpoint.VersionConflictError
		if !errors.As(err, &conflict) {
			if err == nil && replan > 0 {
				r.log.Info().Str(FieldStepID, u.stepID()).Str("chunk", u.label()).Int("replans", replan).
					Msg("applied after re-planning")
			}
			return err
		}
		r.count(func(s *Stats) { s.Conflicts++ })
		if replan == 0 {
			firstConflict = r.now()
		}
		if replan+1 >= MaxReplans && r.part == nil {
			return err
		}
		if took := r.now().Sub(firstConflict); replan+1 >= MaxReplans && took >= partitionReplanTime() {
			return &ContendedError{Step: u.stepID(), Chunk: u.label(), Replans: replan, For: took, Err: conflict}
		}
		if r.part != nil {
			pause := time.Duration(rand.Int64N(int64(min(replan+1, 20)) * int64(5*time.Millisecond)))
			if err := r.sleep(ctx, pause); err != nil {
				return err
			}
		}
		r.count(func(s *Stats) { s.Replans++ })
		if replan == 0 {
			r.log.Warn().Str(FieldStepID, u.stepID()).Str("chunk", u.label()).Str("key", conflict.Key).Int64("expected", conflict.Expected).
				Int64("found", conflict.Found).Msg("another writer moved a key; re-planning (logged once per chunk)")
		}
		u.superseded(id)
	}
}

// resumeRecorded finishes a plan an earlier attempt recorded under
// effectID. If it lost a race (a version conflict: nothing of ours
// applied), replan builds the unit again from the recorded operations and
// it is planned and applied afresh.
func (r *Run) resumeRecorded(ctx context.Context, ot *openTarget, u effectUnit, effectID string, writes []checkpoint.Write, replan func() (effectUnit, error)) error {
	err := r.finishRecorded(ctx, ot, u, effectID, writes)
	var conflict *checkpoint.VersionConflictError
	if !errors.As(err, &conflict) {
		return err
	}
	r.log.Warn().Str(FieldStepID, u.stepID()).Str("effect_id", effectID).Str("key", conflict.Key).
		Msg("recorded plan is stale; re-planning")
	r.count(func(s *Stats) { s.Conflicts++; s.Replans++ })
	again, err := replan()
	if err != nil {
		return err
	}
	return r.applySeparate(ctx, ot, again)
}

// finishRecorded brings a recorded separate-store plan to completion: if
// the target already holds its effect ID it applied (record it); otherwise
// apply it if every expected version still matches; otherwise it returns
// the *checkpoint.VersionConflictError: nothing of ours applied, and the
// caller re-plans from the recorded operations.
func (r *Run) finishRecorded(ctx context.Context, ot *openTarget, u effectUnit, effectID string, writes []checkpoint.Write) error {
	if err := r.checkFence(ctx); err != nil {
		return err
	}
	applied := false
	err := ot.et.Update(ctx, func(tgt checkpoint.Target) error {
		var err error
		if applied, err = tgt.IsApplied(ctx, effectID); err != nil || applied {
			return err
		}
		if err := tgt.Write(ctx, writes); err != nil {
			return err
		}
		return tgt.MarkApplied(ctx, checkpoint.Applied{EffectID: effectID, RunID: r.lease.RunID, StepID: u.stepID(), At: r.now()})
	})
	var conflict *checkpoint.VersionConflictError
	if errors.As(err, &conflict) {
		return conflict
	}
	if err != nil {
		return fmt.Errorf("steps: %s: apply plan %s to %s: %w", u.label(), effectID, ot.name, err)
	}
	if applied {
		r.log.Info().Str(FieldStepID, u.stepID()).Str("effect_id", effectID).Msg("plan had already applied; recording it")
	} else {
		r.count(func(s *Stats) { s.Effects += len(writes) })
	}
	crashStep(u.stepID()+"#"+effectID, "after-apply")
	crashStep(u.stepID(), "after-apply")
	if err := r.inTx(ctx, func(tx checkpoint.Tx) error { return u.finish(tx, effectID) }); err != nil {
		return fmt.Errorf("steps: %s: record plan %s applied: %w", u.label(), effectID, err)
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
	if h := r.part; h != nil {
		// A partition's chunk: its holder must still hold the partition.
		return h.Renew(ctx, r.now())
	}
	fence, err := r.store.Fence(ctx, r.lease.RunID)
	if err != nil {
		return err
	}
	if fence != r.lease.Fence {
		return fmt.Errorf("%w: run %s is at fence %d, this attempt holds %d", checkpoint.ErrFenced, r.lease.RunID, fence, r.lease.Fence)
	}
	return nil
}

// stepUnit is one Apply step's effects: its plan is recorded in the step's
// own checkpoint (planned, then completed).
type stepUnit struct {
	r  *Run
	cp *checkpoint.Step
	pr PlanRecord
}

func (u *stepUnit) label() string              { return "step " + u.cp.ID }
func (u *stepUnit) stepID() string             { return u.cp.ID }
func (u *stepUnit) point() string              { return u.cp.ID }
func (u *stepUnit) groups() [][]Op             { return [][]Op{u.pr.Ops} }
func (u *stepUnit) planError(err error) error  { return err }
func (u *stepUnit) superseded(effectID string) {}

func (u *stepUnit) planned(res PlanResult) error {
	if g := res.Rejected[0]; g != nil {
		return g
	}
	return nil
}

func (u *stepUnit) effectID(replan int) string {
	return fmt.Sprintf("%s/%s@%d.%d", u.r.lease.RunID, u.cp.ID, u.r.lease.Fence, replan)
}

func (u *stepUnit) record(tx checkpoint.Tx, effectID string, writes []checkpoint.Write, applied bool) error {
	u.pr.Writes, u.pr.EffectID = writes, effectID
	u.cp.Status, u.cp.FinishedAt = checkpoint.StepPlanned, u.r.now()
	if applied {
		u.cp.Status = checkpoint.StepCompleted
	}
	var err error
	if u.cp.Plan, err = json.Marshal(u.pr); err != nil {
		return err
	}
	return tx.PutStep(*u.cp)
}

func (u *stepUnit) finish(tx checkpoint.Tx, effectID string) error {
	u.cp.Status, u.cp.FinishedAt = checkpoint.StepCompleted, u.r.now()
	return tx.PutStep(*u.cp)
}
