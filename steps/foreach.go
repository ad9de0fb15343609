package steps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// DefaultChunkSize is a ForEach's commit interval unless ChunkSize says
// otherwise.
const DefaultChunkSize = 500

// MaxChunkSize is the largest ChunkSize accepted: a chunk's keys are read
// back with one query, which SQLite bounds.
const MaxChunkSize = 10000

// BatchSummary is the result of a ForEach, recorded as its step's output.
type BatchSummary struct {
	Total     int64 `json:"total"`     // items the source yielded
	Completed int64 `json:"completed"` // items done (this attempt or before)
	Rejected  int64 `json:"rejected"`  // items with a pinned rejection
	Skipped   int64 `json:"skipped"`   // failed items let through by SkipFailures
	Executed  int64 `json:"executed"`  // items processed by this attempt
	// Target names where the items' effects landed, if anywhere: an
	// operator resetting the step is told these effects stay applied.
	Target string `json:"target,omitempty"`
}

// Progress reports a running ForEach after each chunk commit.
type Progress struct {
	Step      string
	Total     int64 // -1 when the source does not know
	Done      int64 // completed + rejected + skipped so far
	Rejected  int64
	Skipped   int64
	Replayed  int64 // already done by earlier attempts
	StartedAt time.Time
	// Final marks the batch step's last report, sent once its source is
	// exhausted (whether or not the source declared its total).
	Final bool
}

// A chunk's plan is recorded as a checkpoint.ChunkPlanRecord, encoded
// with checkpoint.EncodeChunkPlan: separate store, recorded planned and
// then applied, each item with its operations (JSON), from which a plan
// that lost a race is made again; same store, recorded applied in the
// chunk's own transaction, its items by key only: it is never made again,
// and its writes (key, old version, old value, new value) are the record
// DESIGN asks for.

// ForEach runs fn once per item of src as the batch step name: item IDs are
// name/key, each chunk of items (ChunkSize) commits its item checkpoints,
// outputs and effects together (WithTarget), and items completed by an
// earlier attempt are skipped without calling fn. Items are processed in the
// source's order; effects of several items on one key fold in that order,
// guards checked as they go. An item whose effects break a guard, or whose
// fn returns an error wrapped with Reject, is pinned as rejected and the
// batch goes on. Any other error fails the step, or skips the item under
// SkipFailures.
//
// Skipping needs no probe per item: a fresh step with keys in ascending
// order reads nothing back; otherwise completed keys are read once per
// chunk, as one key range (ordered sources) or one IN list. The order of a
// source may change between attempts without harm: items are matched by key,
// never by position. A key yielded twice in one attempt is an error.
//
// Each item's content is fingerprinted (its JSON, or what ItemInput
// declares) and recorded with its checkpoint. A rerun holds the source to
// what the earlier attempts saw and stops with an *ItemChangedError before
// processing the chunk where it finds a finished item whose fingerprint
// changed, a finished item the source no longer yields, or more items than
// the source declares (see Source); Config.AcceptChanged lets an operator
// go on past them, audited. A new item never processed is simply
// processed, with its current content. The fingerprints come back with the
// chunk's read-back, so the check adds no query per item; a fresh step
// with ascending keys still reads nothing back.
//
// When the step's own checkpoint records it finished in an earlier attempt,
// ForEach returns that recorded summary without reading the source at all:
// a change to the source after the step finished is not seen (a limit, by
// design: a finished step is not re-read). A step whose items are all
// finished but whose own checkpoint is not (a crash between the last chunk
// and the step's record) reads the source again like any rerun, chunk by
// chunk, so every finished item is held to its fingerprint and every
// recorded item must be yielded again: item counts alone cannot tell an
// unchanged source from one whose items were altered or replaced.
func ForEach[I, O any](ctx context.Context, r *Run, name string, src Source[I], fn func(ctx context.Context, item I, e *Effects) (O, error), opts ...Option) (sum BatchSummary, err error) {
	ctx, sp := r.startStep(ctx, name, kindBatch)
	defer func() { sp.end(err, batchAttrs(sum)...) }()
	o := newOptions(opts)
	cp, sum, done, err := start[BatchSummary](ctx, r, name, opts, sp)
	if err != nil {
		return sum, err
	}
	if (o.partitions > 1 || (r.worker != nil && r.worker.Step == name)) && !r.dryRun {
		return forEachPartitioned(ctx, r, name, src, fn, o, cp, done)
	}
	if done && !(r.retrySkipped && sum.Skipped > 0) {
		return sum, nil
	}
	if o.chunkSize <= 0 {
		o.chunkSize = DefaultChunkSize
	}
	if o.chunkSize > MaxChunkSize {
		return sum, fmt.Errorf("steps: batch step %s: ChunkSize(%d) is over the limit of %d", name, o.chunkSize, MaxChunkSize)
	}
	fps, err := newFingerprinter[I](name, o.itemInput)
	if err != nil {
		return sum, err
	}
	// A step is fresh when no item of it is recorded yet: then a source with
	// ascending keys needs no read-back at all. Decided from the items
	// themselves, not from the step's own checkpoint, which a reopened or
	// interrupted step may lack. The same query finds the greatest
	// recorded key.
	fresh, maxKey := true, ""
	err = r.store.Items(ctx, checkpoint.ItemQuery{RunID: r.lease.RunID, Step: name, KeysOnly: true, Limit: 1, Last: true},
		func(it checkpoint.Item) error { fresh, maxKey = false, it.Key; return nil })
	if err != nil {
		return sum, err
	}
	b := &batch[I, O]{r: r, name: name, fn: fn, opts: o, fresh: fresh, lastKey: "", ordered: true,
		resumed: map[string]bool{}, prog: Progress{Step: name, Total: src.total, StartedAt: r.now()},
		fp: fps, ascending: src.ascending, declared: src.total, maxKey: maxKey}
	if done {
		cp = checkpoint.Step{ID: name, InputHash: cp.InputHash, Tries: cp.Tries + 1, StartedAt: r.now()}
	}
	if o.target != nil {
		if b.target, err = r.target(ctx, *o.target); err != nil {
			return sum, err
		}
		b.sum.Target = b.target.name
	}
	if !r.dryRun && !b.fresh && b.target != nil && !b.target.same {
		if err := b.resumePlanned(context.WithoutCancel(ctx)); err != nil {
			return sum, err
		}
	}
	if !b.fresh {
		// How many items earlier attempts recorded: the source must yield
		// each of them again, and at most its declared total in all.
		counts, err := r.store.ItemCounts(ctx, r.lease.RunID)
		if err != nil {
			return sum, err
		}
		for _, c := range counts {
			if c.Step == name {
				b.before += c.Count
			}
		}
	}
	head := cp
	if !r.dryRun {
		head.Status, head.FinishedAt = checkpoint.StepRunning, r.now()
		head.Output, _ = json.Marshal(BatchSummary{Total: src.total, Target: b.sum.Target})
		// A step reopened to retry its skipped items swaps its finished
		// checkpoint for the running one in one transaction.
		err := r.inTx(ctx, func(tx checkpoint.Tx) error {
			if done {
				if err := tx.ResetStep(name); err != nil {
					return err
				}
			}
			return tx.PutStep(head)
		})
		if err != nil {
			return sum, fmt.Errorf("steps: start batch step %s: %w", name, err)
		}
	}
	b.reserve()
	var loopErr error
	srcErr := src.all(ctx, func(key string, item I) bool {
		b.yielded++
		b.keys = append(b.keys, key)
		b.items = append(b.items, item)
		if len(b.keys) < o.chunkSize {
			return true
		}
		loopErr = b.flush(ctx)
		return loopErr == nil
	})
	if loopErr == nil && srcErr == nil && len(b.keys) > 0 {
		loopErr = b.flush(ctx)
	}
	if err := errors.Join(loopErr, srcErr); err != nil {
		return b.sum, b.stopped(ctx, head, err)
	}
	if err := b.checkGone(ctx, src); err != nil {
		return b.sum, b.stopped(ctx, head, err)
	}
	b.prog.Final = true // the source is exhausted: this is the last report
	b.report()
	ctx = context.WithoutCancel(ctx)
	b.sum.Total = b.sum.Completed + b.sum.Rejected + b.sum.Skipped
	cp.Status, cp.FinishedAt = checkpoint.StepCompleted, r.now()
	if cp.Output, err = json.Marshal(b.sum); err != nil {
		return b.sum, err
	}
	if !r.dryRun {
		if err := r.inTx(ctx, func(tx checkpoint.Tx) error { return tx.PutStep(cp) }); err != nil {
			return b.sum, fmt.Errorf("steps: finish batch step %s: %w", name, err)
		}
	}
	r.count(func(s *Stats) { s.Executed++ })
	r.log.Info().Str(FieldStepID, name).Int64("completed", b.sum.Completed).Int64("rejected", b.sum.Rejected).
		Int64("skipped", b.sum.Skipped).Int64("executed", b.sum.Executed).Float64(FieldTookSeconds, cp.FinishedAt.Sub(cp.StartedAt).Seconds()).
		Msg("batch step completed")
	return b.sum, nil
}

// stopped records, when the step stops before its end (interrupted,
// failed, refused) after this attempt committed items, how far it got: the
// running checkpoint's output counts the items done so far and those this
// attempt processed, so an inspection of the stopped step does not show
// the empty summary it started with. It returns err; a failure to record
// is logged (the items themselves are committed either way), unless the
// run was fenced.
func (b *batch[I, O]) stopped(ctx context.Context, head checkpoint.Step, err error) error {
	if b.r.dryRun || b.sum.Executed == 0 {
		return err
	}
	sum := b.sum
	sum.Total = b.declared // as the running checkpoint says: the declared total, or -1
	head.FinishedAt = b.r.now()
	head.Output, _ = json.Marshal(sum)
	perr := b.r.inTx(context.WithoutCancel(ctx), func(tx checkpoint.Tx) error { return tx.PutStep(head) })
	if errors.Is(perr, checkpoint.ErrFenced) {
		return errors.Join(err, fmt.Errorf("steps: record progress of batch step %s: %w", b.name, perr))
	}
	if perr != nil {
		b.r.log.Warn().Str(FieldStepID, b.name).Err(perr).Msg("could not record the stopped batch step's progress")
	}
	return err
}

// batch is the state of one ForEach call.
type batch[I, O any] struct {
	r      *Run
	name   string
	fn     func(context.Context, I, *Effects) (O, error)
	opts   doOptions
	target *openTarget

	fresh   bool   // the step had no items before this attempt
	ordered bool   // keys so far strictly ascending
	lastKey string // last key seen, while ordered
	resumed map[string]bool

	// Holding the source to what earlier attempts saw (fingerprint.go).
	fp        *fingerprinter[I]
	ascending bool   // the source guarantees ascending keys
	declared  int64  // the source's declared total, -1 if none
	maxKey    string // greatest key recorded before this attempt
	before    int64  // items recorded before this attempt
	seenOld   int64  // of those, how many the source yielded again
	goneOK    int64  // of those not yielded, how many an operator accepted
	yielded   int64  // items the source yielded
	tileFrom  string // an ascending source's read-backs tile the key space from here
	changes   changeSet
	decided   map[string]checkpoint.ItemChange // refused and accepted changes, by item key (loadDecisions)
	extraOK   int64                            // items accepted beyond the declared total (inserted or extra)
	chunk     int
	replans   int   // stale plans of earlier attempts made again
	skips     int64 // items skipped under SkipFailures, this attempt or before

	// per-chunk buffers, reused
	keys   []string
	items  []I
	recs   []checkpoint.Item
	groups [][]Op
	owners []int // index into recs of each group
	seen   map[string]bool
	done   map[string]doneItem
	fps    [][FingerprintSize]byte // of the chunk's items

	sum  BatchSummary
	prog Progress

	// In a partition's view (partition.go): the partition worked, and
	// the last key of its last committed chunk.
	part *checkpoint.Partition
	hwm  string
}

func (b *batch[I, O]) reserve() {
	n := b.opts.chunkSize
	b.keys = make([]string, 0, n)
	b.items = make([]I, 0, n)
	b.recs = make([]checkpoint.Item, 0, n)
	b.groups = make([][]Op, 0, n)
	b.owners = make([]int, 0, n)
	b.seen = make(map[string]bool, n)
	b.fps = make([][FingerprintSize]byte, 0, n)
}

// doneItem is a chunk's item recorded before this attempt: its status
// ("" when it is processed again, a skipped item under RetrySkipped) and
// fingerprint.
type doneItem struct {
	status string
	fp     []byte
}

// flushChunk processes and commits the buffered chunk.
func (b *batch[I, O]) flushChunk(ctx context.Context) error {
	defer func() {
		b.keys, b.items = b.keys[:0], b.items[:0]
		b.recs, b.groups, b.owners = b.recs[:0], b.groups[:0], b.owners[:0]
		clear(b.seen)
		b.chunk++
	}()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w before chunk %d of %s: %w", ErrInterrupted, b.chunk, b.name, context.Cause(ctx))
	}
	for _, k := range b.keys {
		if err := validItemKey(b.name, k); err != nil {
			return err
		}
		if b.seen[k] {
			return fmt.Errorf("%w: item %q yielded twice by the source of %s", ErrDuplicateStep, k, b.name)
		}
		b.seen[k] = true
		if b.ordered && b.lastKey != "" && k <= b.lastKey {
			b.ordered = false
		}
		if b.ordered {
			b.lastKey = k
		}
	}
	done, err := b.doneKeys(ctx)
	if err != nil {
		return err
	}
	if err := b.check(ctx, done); err != nil {
		return err
	}
	var failure error
	for i, k := range b.keys {
		if d, ok := done[k]; ok && d.status != "" {
			switch d.status {
			case checkpoint.StepRejected:
				b.sum.Rejected++
			case checkpoint.ItemSkipped:
				b.sum.Skipped++
				b.skips++
			default:
				b.sum.Completed++
			}
			b.prog.Replayed++
			continue
		}
		rec, ops, err := b.runItem(ctx, k, b.items[i])
		if err != nil {
			failure = err
			break
		}
		rec.Fingerprint = b.fp.recorded(i, b.fps[i])
		b.recs = append(b.recs, rec)
		if rec.Status == checkpoint.StepCompleted && len(ops) > 0 {
			b.groups = append(b.groups, ops)
			b.owners = append(b.owners, len(b.recs)-1)
		}
	}
	if len(b.recs) > 0 {
		if err := b.commit(ctx); err != nil {
			return err
		}
		b.hwm = b.keys[len(b.keys)-1]
	}
	b.report()
	return failure
}

// runItem calls fn for one item and returns its checkpoint (completed,
// rejected or skipped) and effects. A failure beyond the skip policy is
// returned as an error.
func (b *batch[I, O]) runItem(ctx context.Context, key string, item I) (checkpoint.Item, []Op, error) {
	rec := checkpoint.Item{Step: b.name, Key: key, Status: checkpoint.StepCompleted}
	var e Effects
	out, err := b.fn(ctx, item, &e)
	var rej *rejection
	switch {
	case err == nil:
	case errors.As(err, &rej):
		rec.Status, rec.Error = checkpoint.StepRejected, rej.err.Error()
		return rec, nil, nil
	case ctx.Err() != nil:
		// The run is being interrupted: not the item's failure. Record
		// nothing for it; the rerun processes it.
		return rec, nil, fmt.Errorf("%w in item %s/%s: %w", ErrInterrupted, b.name, key, context.Cause(ctx))
	case b.opts.skipLimit > 0 && b.skips < int64(b.opts.skipLimit):
		b.skips++
		rec.Status, rec.Error = checkpoint.ItemSkipped, err.Error()
		b.r.log.Warn().Str(FieldStepID, b.name+"/"+key).Err(err).Msg("item failed; skipped by policy")
		return rec, nil, nil
	default:
		if b.opts.skipLimit > 0 {
			err = fmt.Errorf("%w (more than %s failed; the skip limit is reached)", err, plural(b.opts.skipLimit, "item", "items"))
		}
		return rec, nil, &StepError{RunID: b.r.lease.RunID, Step: b.name + "/" + key, Err: err}
	}
	if len(e.ops) > 0 && b.target == nil {
		return rec, nil, fmt.Errorf("steps: item %s/%s recorded effects but %s has no target; pass steps.WithTarget", b.name, key, b.name)
	}
	if rec.Output, err = json.Marshal(out); err != nil {
		return rec, nil, fmt.Errorf("steps: item %s/%s: encode output %T as JSON: %w", b.name, key, out, err)
	}
	return rec, e.ops, nil
}

// doneKeys returns the items among the chunk's keys recorded before this
// attempt, with their fingerprints, read with one query, or nothing when
// the step is fresh and its keys ascend. The map is reused from chunk to
// chunk. A source guaranteed ascending has its reads tile the key space,
// each from the previous chunk's last key, so a recorded key it skipped
// over is found here: gone from the source.
func (b *batch[I, O]) doneKeys(ctx context.Context) (map[string]doneItem, error) {
	if b.fresh && b.ordered && len(b.resumed) == 0 {
		return nil, nil
	}
	if b.done == nil {
		b.done = make(map[string]doneItem, len(b.keys))
	}
	clear(b.done)
	if err := b.loadDecisions(ctx); err != nil { // read before a gone item is sorted, in the read below
		return nil, err
	}
	q := checkpoint.ItemQuery{RunID: b.r.lease.RunID, Step: b.name, KeysOnly: true}
	tile := b.ascending // Paged refuses a key that does not ascend: always ordered
	if b.ordered {
		q.From, q.To = b.keys[0], b.keys[len(b.keys)-1]
		if tile {
			q.From = b.tileFrom
		}
	} else {
		q.Keys = b.keys
	}
	if b.ordered && q.From > b.maxKey {
		// Past every key recorded before this attempt (a rerun after a
		// crash part-way): nothing there to read back or find gone.
		if tile {
			b.tileFrom = q.To
		}
		return b.done, nil
	}
	err := b.r.store.Items(ctx, q, func(it checkpoint.Item) error {
		if !b.seen[it.Key] {
			if tile && it.Key != b.tileFrom {
				b.gone(it.Key)
			}
			return nil
		}
		b.seenOld++
		// Only unordered reads carry the attempt; an ascending source
		// cannot yield a key twice.
		if !b.ordered && it.Attempt == b.r.lease.Attempt && !b.resumed[it.Key] && !b.r.dryRun && b.part == nil {
			return fmt.Errorf("%w: item %q of %s was already processed by this attempt: the source yielded it twice",
				ErrDuplicateStep, it.Key, b.name)
		}
		d := doneItem{status: it.Status, fp: it.Fingerprint}
		if it.Status == checkpoint.ItemSkipped && b.r.retrySkipped {
			d.status = ""
		}
		b.done[it.Key] = d
		return nil
	})
	if err != nil {
		return nil, err
	}
	if tile {
		b.tileFrom = q.To
	}
	return b.done, nil
}

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
		b.recs, b.groups, b.owners = b.recs[:0], b.groups[:0], b.owners[:0]
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
	b.recs, b.groups, b.owners = b.recs[:0], b.groups[:0], b.owners[:0]
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

// report sends progress to the run's progress hook.
func (b *batch[I, O]) report() {
	if b.r.progress == nil {
		return
	}
	b.prog.Done = b.sum.Completed + b.sum.Rejected + b.sum.Skipped
	b.prog.Rejected, b.prog.Skipped = b.sum.Rejected, b.sum.Skipped
	b.r.progress(b.prog)
}

func validItemKey(step, key string) error {
	if strings.IndexByte(key, '/') >= 0 {
		return fmt.Errorf("%w: item key %q of %s contains /", ErrInvalidID, key, step)
	}
	if err := ValidateID(key); err != nil {
		return fmt.Errorf("item key of %s: %w", step, err)
	}
	return nil
}

// ItemResult is one finished item of a batch step, as recorded.
type ItemResult struct {
	Key    string
	Status string // completed, rejected or skipped
	// Output is what the item's function returned, also kept when its
	// effects were rejected by a guard; nil when the function failed or
	// returned a Reject error.
	Output json.RawMessage
	// Error is the rejection reason or the skipped failure.
	Error string
}

// Items streams the recorded items of the batch step name of this run, in
// key order; status "" means every status. Use it to summarise a batch
// (the rejected transfers of a settlement, say) without holding it in
// memory.
func (r *Run) Items(ctx context.Context, name, status string, fn func(ItemResult) error) error {
	q := checkpoint.ItemQuery{RunID: r.lease.RunID, Step: name, Status: status}
	return r.store.Items(ctx, q, func(it checkpoint.Item) error {
		return fn(ItemResult{Key: it.Key, Status: it.Status, Output: it.Output, Error: it.Error})
	})
}
