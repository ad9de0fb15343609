package steps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// A batch step's chunk commit: its item checkpoints with its effects,
// through the exactly-once protocol (protocol.go), and the chunk plans an
// earlier attempt left to finish.

// commit writes the chunk: item checkpoints and their effects. A chunk
// whose items have run is committed even if the run is being interrupted.
func (b *batch[I, O]) commit(ctx context.Context) error {
	ctx = context.WithoutCancel(ctx)
	point := b.name + "#" + strconv.Itoa(b.chunk)
	switch {
	case b.r.dryRun:
		if err := b.commitDry(ctx); err != nil {
			return err
		}
	case b.target == nil || len(b.groups) == 0:
		crashStep(point, "before-commit")
		if err := b.r.inTx(ctx, func(tx checkpoint.Tx) error { return b.putItems(tx) }); err != nil {
			return fmt.Errorf("steps: commit chunk %d of %s: %w", b.chunk, b.name, err)
		}
	case b.target.same:
		if err := b.r.applySame(ctx, b.target, b.unit(point, "")); err != nil {
			return err
		}
	default:
		crashStep(point, "before-commit") // before the plan is recorded
		if err := b.r.applySeparate(ctx, b.target, b.unit(point, "c"+strconv.Itoa(b.chunk))); err != nil {
			return err
		}
		b.settlePlanned()
	}
	crashStep(point, "after-commit")
	for _, rec := range b.recs {
		switch rec.Status {
		case checkpoint.StepRejected:
			b.sum.Rejected++
		case checkpoint.ItemSkipped:
			b.sum.Skipped++
		default:
			b.sum.Completed++
		}
		b.sum.Executed++
	}
	return nil
}

// putItems records the chunk's items in tx: as new ones when the step is
// fresh and its keys ascend, so that none of them can be recorded (the
// store may then skip looking), as doneKeys skips reading them back.
func (b *batch[I, O]) putItems(tx checkpoint.Tx) error {
	if b.fresh && b.ordered && len(b.resumed) == 0 {
		return tx.PutNewItems(b.recs)
	}
	return tx.PutItems(b.recs)
}

// samePlan is the record of a same-store chunk's applied writes and the
// items whose operations made them; none when nothing was written (every
// item rejected). Its ID has the form of a separate-store effect ID, "s"
// for same store in place of "c".
func (b *batch[I, O]) samePlan(writes []checkpoint.Write) (checkpoint.ChunkPlan, error) {
	if len(writes) == 0 {
		return checkpoint.ChunkPlan{}, nil
	}
	items, err := b.planItems(false)
	if err != nil {
		return checkpoint.ChunkPlan{}, err
	}
	pr := checkpoint.ChunkPlanRecord{Target: b.target.name, Writes: writes, Items: items,
		EffectID: fmt.Sprintf("%s/%s@%d.s%d", b.r.lease.RunID, b.name, b.r.lease.Fence, b.chunk)}
	if b.part != nil {
		pr.EffectID = fmt.Sprintf("%s/%s@%s.s%d", b.r.lease.RunID, b.name, b.partitionEffectTag(), b.chunk)
	}
	return checkpoint.ChunkPlan{Step: b.name, EffectID: pr.EffectID, Status: checkpoint.ChunkApplied, Plan: checkpoint.EncodeChunkPlan(pr)}, nil
}

// planError names the batch item whose operation made the planner fail
// (an *OverflowError carries its group).
func (b *batch[I, O]) planError(err error) error {
	var ov *OverflowError
	if errors.As(err, &ov) && ov.Group >= 0 && ov.Group < len(b.owners) {
		return fmt.Errorf("item %s/%s: %w", b.name, b.recs[b.owners[ov.Group]].Key, err)
	}
	return err
}

// pinRejected turns the items whose effects broke a guard into rejections.
func (b *batch[I, O]) pinRejected(rejected map[int]*GuardError) {
	for gi, g := range rejected {
		rec := &b.recs[b.owners[gi]]
		// The item's output is kept: the rejection is recorded beside what
		// the item computed (an amount, say) for summaries to read.
		rec.Status, rec.Error = checkpoint.StepRejected, g.Error()
		b.groups[gi] = nil // pinned: never planned again
	}
}

// chunkUnit is one ForEach chunk's effects (see effectUnit): its plan is
// recorded as a chunk plan with the chunk's item checkpoints (planned, then
// completed when the plan is finished).
type chunkUnit[I, O any] struct {
	b          *batch[I, O]
	pt         string       // crash point prefix
	tag        string       // names the chunk in its effect IDs
	supersedes string       // a stale plan the next one replaces
	final      map[int]bool // items an earlier plan of this unit recorded as rejected
}

// unit is the buffered chunk as an effect unit; tag names it in its
// separate-store effect IDs.
func (b *batch[I, O]) unit(point, tag string) *chunkUnit[I, O] {
	return &chunkUnit[I, O]{b: b, pt: point, tag: tag, final: map[int]bool{}}
}

func (u *chunkUnit[I, O]) label() string {
	return "chunk " + strconv.Itoa(u.b.chunk) + " of " + u.b.name
}
func (u *chunkUnit[I, O]) stepID() string               { return u.b.name }
func (u *chunkUnit[I, O]) point() string                { return u.pt }
func (u *chunkUnit[I, O]) groups() [][]Op               { return u.b.groups }
func (u *chunkUnit[I, O]) planError(err error) error    { return u.b.planError(err) }
func (u *chunkUnit[I, O]) superseded(effectID string)   { u.supersedes = effectID }
func (u *chunkUnit[I, O]) planned(res PlanResult) error { u.b.pinRejected(res.Rejected); return nil }

func (u *chunkUnit[I, O]) effectID(replan int) string {
	if u.b.part != nil {
		// A partition's chunk: the partition and its fence in place of
		// the run's fence, so every holder's IDs differ.
		return fmt.Sprintf("%s/%s@%s.%s.%d", u.b.r.lease.RunID, u.b.name, u.b.partitionEffectTag(), u.tag, replan)
	}
	return fmt.Sprintf("%s/%s@%d.%s.%d", u.b.r.lease.RunID, u.b.name, u.b.r.lease.Fence, u.tag, replan)
}

func (u *chunkUnit[I, O]) record(tx checkpoint.Tx, effectID string, writes []checkpoint.Write, applied bool) error {
	b := u.b
	if applied {
		if err := b.putItems(tx); err != nil {
			return err
		}
		// The plan is recorded applied with the writes it describes:
		// what each chunk changed (key, before, after) stays auditable.
		plan, err := b.samePlan(writes)
		if err != nil || plan.EffectID == "" {
			return err
		}
		return tx.PutChunkPlan(plan)
	}
	items, err := b.planItems(true)
	if err != nil {
		return err
	}
	plan := checkpoint.EncodeChunkPlan(checkpoint.ChunkPlanRecord{Target: b.target.name, Writes: writes, EffectID: effectID, Items: items})
	put := make([]checkpoint.Item, 0, len(b.recs))
	for i := range b.recs {
		if b.recs[i].Status == checkpoint.StepCompleted || b.recs[i].Status == checkpoint.StepPlanned {
			b.recs[i].Status, b.recs[i].Chunk = checkpoint.StepPlanned, effectID
		}
		if !u.final[i] { // a rejection recorded by an earlier plan stays as it is
			put = append(put, b.recs[i])
		}
	}
	if err := tx.PutItems(put); err != nil {
		return err
	}
	if err := tx.PutChunkPlan(checkpoint.ChunkPlan{Step: b.name, EffectID: effectID, Plan: plan, Supersedes: u.supersedes}); err != nil {
		return err
	}
	for i := range b.recs {
		if b.recs[i].Status == checkpoint.StepRejected {
			u.final[i] = true
		}
	}
	return nil
}

func (u *chunkUnit[I, O]) finish(tx checkpoint.Tx, effectID string) error {
	return tx.FinishChunk(u.b.name, effectID)
}

// planItems lists the chunk's items that are planned (not rejected by a
// guard), in item order, with their operations as JSON when withOps (a
// separate-store plan, which may be made again from them).
func (b *batch[I, O]) planItems(withOps bool) ([]checkpoint.PlanItem, error) {
	items := make([]checkpoint.PlanItem, 0, len(b.groups))
	for gi, ops := range b.groups {
		if ops == nil { // rejected by a guard, nothing of it applied
			continue
		}
		it := checkpoint.PlanItem{Key: b.recs[b.owners[gi]].Key}
		if withOps {
			var err error
			if it.Ops, err = json.Marshal(ops); err != nil {
				return nil, fmt.Errorf("steps: encode the operations of item %s/%s: %w", b.name, it.Key, err)
			}
		}
		items = append(items, it)
	}
	return items, nil
}

// settlePlanned marks the chunk's planned items completed once their plan
// is recorded applied.
func (b *batch[I, O]) settlePlanned() {
	for i := range b.recs {
		if b.recs[i].Status == checkpoint.StepPlanned {
			b.recs[i].Status = checkpoint.StepCompleted
		}
	}
}

// resumePlanned finishes chunk plans an earlier attempt recorded but did not
// see applied: applied already (effect ID in the target) or still applicable
// (versions unchanged) are finished; a plan that lost a race is made again
// from its items' recorded operations.
func (b *batch[I, O]) resumePlanned(ctx context.Context) error {
	plans, err := b.r.store.ChunkPlans(ctx, b.r.lease.RunID, b.name)
	if err != nil {
		return err
	}
	for _, p := range plans {
		if b.part != nil && !strings.HasPrefix(p.EffectID, fmt.Sprintf("%s/%s@p%d.", b.r.lease.RunID, b.name, b.part.Index)) {
			continue // another partition's: its holder finishes it
		}
		pr, err := checkpoint.DecodeChunkPlan(p.Plan)
		if err != nil {
			return fmt.Errorf("steps: decode chunk plan %s of %s: %w", p.EffectID, b.name, err)
		}
		b.r.log.Info().Str(FieldStepID, b.name).Str("effect_id", p.EffectID).Msg("finishing a recorded chunk plan")
		err = b.r.resumeRecorded(ctx, b.target, b.unit(b.name+"#resume", ""), pr.EffectID, pr.Writes,
			func() (effectUnit, error) { return b.replanRecorded(ctx, pr) })
		b.resetEffects()
		if err != nil {
			return err
		}
		for _, it := range pr.Items {
			b.resumed[it.Key] = true
		}
	}
	return nil
}

// replanRecorded loads a stale chunk plan's items into the chunk buffers,
// to be planned again from their recorded operations. Their outputs are
// already recorded with the planned items.
func (b *batch[I, O]) replanRecorded(ctx context.Context, old checkpoint.ChunkPlanRecord) (effectUnit, error) {
	keys := make([]string, len(old.Items))
	for i, it := range old.Items {
		keys[i] = it.Key
	}
	outputs := map[string]checkpoint.Item{}
	err := b.r.store.Items(ctx, checkpoint.ItemQuery{RunID: b.r.lease.RunID, Step: b.name, Keys: keys}, func(it checkpoint.Item) error {
		outputs[it.Key] = it
		return nil
	})
	if err != nil {
		return nil, err
	}
	b.resetEffects()
	for _, it := range old.Items {
		rec, ok := outputs[it.Key]
		if !ok || rec.Status != checkpoint.StepPlanned {
			return nil, fmt.Errorf("steps: chunk plan %s lists item %s of %s, recorded as %q, not planned", old.EffectID, it.Key, b.name, rec.Status)
		}
		var ops []Op
		if err := unmarshalOps(it.Ops, &ops); err != nil {
			return nil, fmt.Errorf("steps: chunk plan %s: decode the operations of item %s of %s: %w", old.EffectID, it.Key, b.name, err)
		}
		rec.Step, rec.Status = b.name, checkpoint.StepCompleted
		b.recs = append(b.recs, rec)
		b.groups = append(b.groups, ops)
		b.owners = append(b.owners, len(b.recs)-1)
	}
	b.replans++
	u := b.unit(b.name+"#resume", "r"+strconv.Itoa(b.replans))
	u.supersedes = old.EffectID
	return u, nil
}

// unmarshalOps decodes an item's recorded operations; none is nil.
func unmarshalOps(raw []byte, ops *[]Op) error {
	if len(raw) == 0 {
		*ops = nil
		return nil
	}
	return json.Unmarshal(raw, ops)
}

// commitDry plans the chunk against current values and earlier dry-run
// plans, writing nothing.
func (b *batch[I, O]) commitDry(ctx context.Context) error {
	if b.target == nil || len(b.groups) == 0 {
		return nil
	}
	keys := keysOf(b.groups...)
	cur, err := readTarget(ctx, b.target, keys)
	if err != nil {
		return err
	}
	r := b.r
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		if s, ok := r.dryState[b.target.name+"\x00"+k]; ok {
			cur[k] = s
		}
	}
	res, err := Plan(cur, b.groups...)
	if err != nil {
		return fmt.Errorf("steps: plan chunk %d of %s for %s: %w", b.chunk, b.name, b.target.name, b.planError(err))
	}
	b.pinRejected(res.Rejected)
	for _, w := range res.Writes {
		r.dryState[b.target.name+"\x00"+w.Key] = checkpoint.State{Value: w.NewValue, Version: w.OldVersion + 1, Exists: true}
	}
	plan := DryPlan{Step: fmt.Sprintf("%s chunk %d", b.name, b.chunk), Target: b.target.name, Writes: res.Writes, Items: len(b.recs)}
	for gi, owner := range b.owners { // in item order
		if g := res.Rejected[gi]; g != nil {
			plan.Rejected = append(plan.Rejected, b.recs[owner].Key+": "+g.Error())
		}
	}
	r.dryPlans = append(r.dryPlans, plan)
	return nil
}
