package steps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
// Each item's content is fingerprinted (its JSON, or what Source.ItemInput
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
	if err := o.checkChunkSize(name); err != nil {
		return sum, err
	}
	b, err := newBatch(ctx, r, name, src, fn, o)
	if err != nil {
		return sum, err
	}
	if done {
		cp = checkpoint.Step{ID: name, InputHash: cp.InputHash, Tries: cp.Tries + 1, StartedAt: r.now()}
	}
	if err := b.prepare(ctx); err != nil {
		return sum, err
	}
	head, err := b.begin(ctx, cp, done, src.total)
	if err != nil {
		return sum, err
	}
	if err := b.fill(ctx, src, nil); err != nil {
		return b.sum, b.stopped(ctx, head, err)
	}
	if err := b.checkGone(ctx, src); err != nil {
		return b.sum, b.stopped(ctx, head, err)
	}
	b.prog.Final = true // the source is exhausted: this is the last report
	b.report()
	err = b.finish(context.WithoutCancel(ctx), cp)
	return b.sum, err
}

// checkChunkSize defaults the chunk size and refuses one over the limit.
func (o *doOptions) checkChunkSize(name string) error {
	if o.chunkSize <= 0 {
		o.chunkSize = DefaultChunkSize
	}
	if o.chunkSize > MaxChunkSize {
		return fmt.Errorf("steps: batch step %s: ChunkSize(%d) is over the limit of %d", name, o.chunkSize, MaxChunkSize)
	}
	return nil
}

// newBatch is the state of one (unpartitioned) ForEach, knowing whether
// earlier attempts recorded items of the step and its greatest key.
func newBatch[I, O any](ctx context.Context, r *Run, name string, src Source[I], fn func(context.Context, I, *Effects) (O, error), o doOptions) (*batch[I, O], error) {
	// A step is fresh when no item of it is recorded yet: then a source with
	// ascending keys needs no read-back at all. Decided from the items
	// themselves, not from the step's own checkpoint, which a reopened or
	// interrupted step may lack. The same query finds the greatest
	// recorded key.
	fresh, maxKey := true, ""
	err := r.store.Items(ctx, checkpoint.ItemQuery{RunID: r.lease.RunID, Step: name, KeysOnly: true, Limit: 1, Last: true},
		func(it checkpoint.Item) error { fresh, maxKey = false, it.Key; return nil })
	if err != nil {
		return nil, err
	}
	b := &batch[I, O]{r: r, name: name, fn: fn, opts: o, fresh: fresh, lastKey: "", ordered: true,
		resumed: map[string]bool{}, prog: Progress{Step: name, Total: src.total, StartedAt: r.now()},
		sourceCheck: sourceCheck[I]{r: r, name: name, fp: newFingerprinter(name, src.input), ascending: src.ascending,
			declared: src.total, maxKey: maxKey}}
	return b, nil
}

// prepare opens the step's target, finishes the chunk plans earlier
// attempts left, and counts the items they recorded.
func (b *batch[I, O]) prepare(ctx context.Context) error {
	r := b.r
	if t := b.opts.target; t != nil {
		var err error
		if b.target, err = r.target(ctx, *t); err != nil {
			return err
		}
		b.sum.Target = b.target.name
	}
	if !r.dryRun && !b.fresh && b.target != nil && !b.target.same {
		if err := b.resumePlanned(context.WithoutCancel(ctx)); err != nil {
			return err
		}
	}
	if !b.fresh {
		// How many items earlier attempts recorded: the source must yield
		// each of them again, and at most its declared total in all.
		counts, err := r.store.ItemCounts(ctx, r.lease.RunID)
		if err != nil {
			return err
		}
		for _, c := range counts {
			if c.Step == b.name {
				b.before += c.Count
			}
		}
	}
	return nil
}

// begin records the step running (cp, its summary empty but for the
// source's declared total) and returns that checkpoint. A step reopened
// (done) to retry its skipped items swaps its finished checkpoint for the
// running one in one transaction.
func (b *batch[I, O]) begin(ctx context.Context, cp checkpoint.Step, done bool, total int64) (checkpoint.Step, error) {
	head := cp
	if b.r.dryRun {
		return head, nil
	}
	head.Status, head.FinishedAt = checkpoint.StepRunning, b.r.now()
	head.Output, _ = json.Marshal(BatchSummary{Total: total, Target: b.sum.Target})
	err := b.r.inTx(ctx, func(tx checkpoint.Tx) error {
		if done {
			if err := tx.ResetStep(b.name); err != nil {
				return err
			}
		}
		return tx.PutStep(head)
	})
	if err != nil {
		return head, fmt.Errorf("steps: start batch step %s: %w", b.name, err)
	}
	return head, nil
}

// finish records the step completed (cp) with its summary.
func (b *batch[I, O]) finish(ctx context.Context, cp checkpoint.Step) error {
	r := b.r
	b.sum.Total = b.sum.Completed + b.sum.Rejected + b.sum.Skipped
	cp.Status, cp.FinishedAt = checkpoint.StepCompleted, r.now()
	var err error
	if cp.Output, err = json.Marshal(b.sum); err != nil {
		return err
	}
	if !r.dryRun {
		if err := r.inTx(ctx, func(tx checkpoint.Tx) error { return tx.PutStep(cp) }); err != nil {
			return fmt.Errorf("steps: finish batch step %s: %w", b.name, err)
		}
	}
	r.count(func(s *Stats) { s.Executed++ })
	r.log.Info().Str(FieldStepID, b.name).Int64("completed", b.sum.Completed).Int64("rejected", b.sum.Rejected).
		Int64("skipped", b.sum.Skipped).Int64("executed", b.sum.Executed).Float64(FieldTookSeconds, cp.FinishedAt.Sub(cp.StartedAt).Seconds()).
		Msg("batch step completed")
	return nil
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
	chunk   int
	replans int   // stale plans of earlier attempts made again
	skips   int64 // items skipped under SkipFailures, this attempt or before

	sourceCheck[I] // fingerprint.go
	chunkBuf[I]

	sum  BatchSummary
	prog Progress

	// In a partition's view (partition.go): the partition worked, and
	// the last key of its last committed chunk.
	part *checkpoint.Partition
	hwm  string
}

// chunkBuf is the chunk a batch step is working on: its items as the
// source yielded them, then their checkpoints and effects. Its slices are
// reused from chunk to chunk.
type chunkBuf[I any] struct {
	keys   []string
	items  []I
	recs   []checkpoint.Item
	groups [][]Op
	owners []int // index into recs of each group
	seen   map[string]bool
	done   map[string]doneItem
	fps    [][FingerprintSize]byte // of the chunk's items
}

func (c *chunkBuf[I]) reserve(n int) {
	c.keys = make([]string, 0, n)
	c.items = make([]I, 0, n)
	c.recs = make([]checkpoint.Item, 0, n)
	c.groups = make([][]Op, 0, n)
	c.owners = make([]int, 0, n)
	c.seen = make(map[string]bool, n)
	c.fps = make([][FingerprintSize]byte, 0, n)
}

// resetEffects empties the chunk's checkpoints and effects.
func (c *chunkBuf[I]) resetEffects() {
	c.recs, c.groups, c.owners = c.recs[:0], c.groups[:0], c.owners[:0]
}

// fill reads src to its end, a chunk of the items holds keeps (all
// with a nil holds) at a time, each chunk processed and committed (flush)
// as it fills.
func (b *batch[I, O]) fill(ctx context.Context, src Source[I], holds func(key string, item I) bool) error {
	if src.readAhead {
		return b.fillAhead(ctx, src, holds) // readahead.go
	}
	b.reserve(b.opts.chunkSize)
	var loopErr error
	srcErr := src.all(ctx, func(key string, item I) bool {
		if holds != nil && !holds(key, item) {
			return true
		}
		b.yielded++
		b.keys = append(b.keys, key)
		b.items = append(b.items, item)
		if len(b.keys) < b.opts.chunkSize {
			return true
		}
		loopErr = b.flush(ctx)
		return loopErr == nil
	})
	if loopErr == nil && srcErr == nil && len(b.keys) > 0 {
		loopErr = b.flush(ctx)
	}
	return errors.Join(loopErr, srcErr)
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
		b.resetEffects()
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
