package steps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/steps/internal/partition"
)

// ErrPartitionWorked is returned by the partitioned ForEach a partition
// worker's replay reaches (Config.Partition) once its partition is done:
// it stops the job function there, before any later step, without
// finishing the run. Job code that wraps a ForEach's error keeps it
// matchable with errors.Is.
var ErrPartitionWorked = errors.New("steps: partition worked; the job stops here for this worker")

// StepNotRecordedError is returned to a partition worker's replay by a
// step before the partitioned batch step that is not recorded finished:
// only the run's owner runs steps, so the worker stops (exit 5, like a
// changed step) and leaves the partition to another runner.
type StepNotRecordedError struct {
	RunID     string
	Step      string
	Status    string // the step's recorded status, "" when none
	Partition string // the batch step whose partition the worker holds
}

func (e *StepNotRecordedError) Error() string {
	st := e.Status
	if st == "" {
		st = "not recorded"
	}
	return fmt.Sprintf("step %s of run %s is %s, but a worker of a partition of %s replays recorded steps only; "+
		"the job may have changed since the run's owner ran it: run the worker with the binary the run's owner uses", e.Step, e.RunID, st, e.Partition)
}

// Partitions splits a ForEach across n partitions, each worked by one
// runner at a time: goroutines of the run's own process (which works
// every partition by itself if no one else does) and any partition
// worker (runner.WorkPartition, `stepwise worker`) on other hosts. One
// partition (the default, or n < 2) is the plain ForEach, unchanged.
//
// The run's owner splits the step once, when it first reaches it: by key
// ranges holding equal item counts (the source is read once to find
// them), or with Source.PartitionBy by a hash of the job's value. The split is
// recorded with the step and never recomputed: a rerun or a takeover reads
// it. Each partition has a fence of its own and a lease: a runner that
// dies leaves its partition to be claimed once the lease passes (at once
// by the run's owner, when the dead runner was on its host), and the
// chunks it committed stay done. When every partition is done, the run's
// owner writes the step's summary from the partitions' counters and the
// job goes on. A partition whose item fails (beyond SkipFailures) fails
// the step; the next attempt reopens failed partitions and keeps done
// ones.
//
// Every partition reads the whole source and processes its own items, in
// the source's order, a chunk at a time, with the step's chunk size,
// target and options: exactly once, as in one partition.
//
// What changes with several partitions: guards see other partitions'
// effects in commit order, not in the source's order, so which transfer an
// overdraft guard rejects can differ from a one-partition run (and from
// run to run); every item is still processed exactly once, its effects
// applied exactly once, its outcome pinned. Source.PartitionBy (by debit account,
// say) keeps every item that debits one account in one partition, in
// source order, so such guards decide as in one partition. A rerun of a
// partitioned step holds finished items to their fingerprints, but does
// not notice finished items its source no longer yields, nor a source
// yielding more than its declared total. RetrySkipped does not reopen a
// finished partitioned step. Partitions are ignored by a dry run.
func Partitions(n int) Option { return func(o *doOptions) { o.partitions = n } }

// ErrPartitionLeaseLost is matched (errors.Is) by a
// *PartitionLeaseLostError.
var ErrPartitionLeaseLost = errors.New("steps: the partition's lease could not be renewed in time")

// PartitionLeaseLostError says the holder of a partition stopped working
// it by itself (self-fenced): no renewal of the partition's lease (a
// heartbeat or a chunk's commit) succeeded by its known expiry less
// Config.SelfFenceMargin (the database unreachable, the process paused),
// so it cancelled the partition's items, and with them their outside
// calls, before another runner may claim the partition. Nobody need have
// claimed it yet; its chunks committed so far stay done.
type PartitionLeaseLostError struct {
	RunID string
	Step  string
	Index int
	Fence int64
	// Expiry is when the lease expires as last renewed (or claimed), on
	// the holder's clock: the renewal's send time plus the lease, so never
	// later than the store's own expiry.
	Expiry time.Time
	// Margin is Config.SelfFenceMargin: the holder stopped at Expiry less
	// Margin.
	Margin time.Duration
	// Failures counts the heartbeats that failed since the last renewal
	// (zero when none was tried in time: the process was paused, say).
	Failures int
	// LastErr is the last failed heartbeat's error, or nil.
	LastErr error
}

func (e *PartitionLeaseLostError) Error() string {
	why := "no renewal was tried in time"
	if e.LastErr != nil {
		why = fmt.Sprintf("%d renewal(s) failed, the last with: %v", e.Failures, e.LastErr)
	}
	return fmt.Sprintf("partition %d of %s of run %s (fence %d) stopped by its holder (self-fenced): %s; its lease expires at %s, "+
		"and the holder stopped %s before that, calling no outside system after it; any runner may claim the partition once the lease passes",
		e.Index, e.Step, e.RunID, e.Fence, why, e.Expiry.UTC().Format(time.RFC3339Nano), e.Margin)
}

// Is reports whether target is ErrPartitionLeaseLost.
func (e *PartitionLeaseLostError) Is(target error) bool { return target == ErrPartitionLeaseLost }

// Unwrap returns the last failed heartbeat's error.
func (e *PartitionLeaseLostError) Unwrap() error { return e.LastErr }

// partitionView is a view of r that works one partition: its writes are
// fenced by the partition, its counts go to r.
func (r *Run) partitionView(h *partition.Hold) *Run {
	return &Run{runSettings: r.runSettings, lease: checkpoint.Lease{RunID: r.lease.RunID, Fence: r.lease.Fence, Attempt: h.Lease.Attempt, Owner: h.Lease.Owner},
		log: r.log.With().Int("partition", h.Lease.Index).Logger(), seen: map[string]struct{}{}, part: h, parent: r,
		progress: r.workerProgress()}
}

// workerProgress is the progress hook of a partition's view: the run's
// in a partition worker's replay, where the partition is all this attempt
// works; none for the run's owner, whose coordinator reports the
// partitions' sum (watchPartitions) instead.
func (r *Run) workerProgress() func(Progress) {
	if r.worker == nil {
		return nil
	}
	return r.progress
}

// partitionLease is how long a partition's lease lasts: the run's.
func (r *Run) partitionLease() time.Duration {
	if r.leaseFor > 0 {
		return r.leaseFor
	}
	return 30 * time.Second
}

// partitioned is one partitioned ForEach: what the work of each of its
// partitions shares.
type partitioned[I, O any] struct {
	r    *Run
	ps   checkpoint.PartitionStore
	name string
	src  Source[I]
	fn   func(context.Context, I, *Effects) (O, error)
	o    doOptions
	ot   *openTarget // the step's target, opened once; nil without one
}

// spec is which items the partition p holds.
func (pt *partitioned[I, O]) spec(p checkpoint.Partition) partition.Spec[I] {
	return partition.Spec[I]{P: p, By: pt.src.by}
}

// forEachPartitioned is ForEach with Partitions(n > 1): the coordinator
// (the run's owner) or, in a partition worker's replay, that partition.
func forEachPartitioned[I, O any](ctx context.Context, r *Run, name string, src Source[I], fn func(context.Context, I, *Effects) (O, error),
	o doOptions, cp checkpoint.Step, done bool) (BatchSummary, error) {
	var sum BatchSummary
	if err := o.checkChunkSize(name); err != nil {
		return sum, err
	}
	pt := &partitioned[I, O]{r: r, ps: r.store, name: name, src: src, fn: fn, o: o}
	if o.target != nil {
		var err error
		if pt.ot, err = r.target(ctx, *o.target); err != nil {
			return sum, err
		}
		sum.Target = pt.ot.name
	}
	if done {
		if r.worker != nil {
			return sum, ErrPartitionWorked
		}
		return sum, nil // a finished partitioned step is not reopened (RetrySkipped)
	}
	if r.worker != nil {
		return sum, pt.workerReplay(ctx)
	}
	specs, err := pt.start(ctx, cp, sum.Target)
	if err != nil {
		return sum, err
	}
	if err := pt.coordinate(ctx, specs); err != nil {
		return sum, err
	}
	return pt.finish(context.WithoutCancel(ctx), cp, sum)
}

// workerReplay works, in a partition worker's replay, its one partition,
// and then stops the job there (ErrPartitionWorked).
func (pt *partitioned[I, O]) workerReplay(ctx context.Context) error {
	r, w := pt.r, pt.r.worker
	parts, err := pt.ps.Partitions(ctx, r.lease.RunID, pt.name)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(parts, func(p checkpoint.Partition) bool { return p.Index == w.Index })
	if i < 0 {
		return fmt.Errorf("%w: partition %d of %s of run %s is not recorded", checkpoint.ErrFenced, w.Index, pt.name, r.lease.RunID)
	}
	if err := pt.work(ctx, pt.spec(parts[i]), *w, r.workerClaimedAt); err != nil {
		return err
	}
	return ErrPartitionWorked
}

// start records the step running with its partitions (split now, or as
// recorded before) and returns which items each holds, by index.
func (pt *partitioned[I, O]) start(ctx context.Context, cp checkpoint.Step, target string) (map[int]partition.Spec[I], error) {
	r, name := pt.r, pt.name
	split, err := recordedOrSplit(ctx, r, pt.ps, name, pt.src, pt.o.partitions, pt.src.by)
	if err != nil {
		return nil, err
	}
	head := cp
	head.Status, head.FinishedAt = checkpoint.StepRunning, r.now()
	head.Output, _ = json.Marshal(BatchSummary{Total: pt.src.total, Target: target})
	parts, err := pt.ps.StartPartitioned(ctx, r.lease, head, split)
	if err != nil {
		return nil, fmt.Errorf("steps: start batch step %s: %w", name, err)
	}
	if len(parts) > 0 && len(split) > 0 && parts[0].Count != pt.o.partitions {
		r.log.Info().Str(FieldStepID, name).Int("recorded", parts[0].Count).Int("asked", pt.o.partitions).
			Msg("the step's recorded split stands; it is never recomputed")
	}
	specs := map[int]partition.Spec[I]{}
	for _, p := range parts {
		specs[p.Index] = pt.spec(p)
	}
	r.log.Info().Str(FieldStepID, name).Int("partitions", len(parts)).Msg("batch step partitioned; working its partitions")
	return specs, nil
}

// finish records the step completed once every partition is done, its
// summary the partitions' counters summed.
func (pt *partitioned[I, O]) finish(ctx context.Context, cp checkpoint.Step, sum BatchSummary) (BatchSummary, error) {
	r, name := pt.r, pt.name
	parts, err := pt.ps.Partitions(ctx, r.lease.RunID, name)
	if err != nil {
		return sum, err
	}
	for _, p := range parts {
		sum.Completed += p.Done
		sum.Rejected += p.Rejected
		sum.Skipped += p.Skipped
		sum.Executed += p.Executed
	}
	sum.Total = sum.Completed + sum.Rejected + sum.Skipped
	cp.Status, cp.FinishedAt = checkpoint.StepCompleted, r.now()
	if cp.Output, err = json.Marshal(sum); err != nil {
		return sum, err
	}
	if err := r.inTx(ctx, func(tx checkpoint.Tx) error { return tx.PutStep(cp) }); err != nil {
		return sum, fmt.Errorf("steps: finish batch step %s: %w", name, err)
	}
	r.count(func(s *Stats) { s.Executed++ })
	r.log.Info().Str(FieldStepID, name).Int("partitions", len(parts)).Int64("completed", sum.Completed).Int64("rejected", sum.Rejected).
		Int64("skipped", sum.Skipped).Int64("executed", sum.Executed).Float64(FieldTookSeconds, cp.FinishedAt.Sub(cp.StartedAt).Seconds()).
		Msg("batch step completed")
	return sum, nil
}

// recordedOrSplit returns nil when the step's partitions are recorded
// (they stand), or else its split into n: key ranges of equal item counts,
// or by PartitionBy's hash. It reads the source once.
func recordedOrSplit[I any](ctx context.Context, r *Run, ps checkpoint.PartitionStore, name string, src Source[I], n int, by func(I) string) ([]checkpoint.Partition, error) {
	have, err := ps.Partitions(ctx, r.lease.RunID, name)
	if err != nil || len(have) > 0 {
		return nil, err
	}
	var keys []string
	counts := make([]int64, n)
	err = src.all(ctx, func(key string, item I) bool {
		if by != nil {
			counts[checkpoint.PartitionHashOf(by(item))%uint64(n)]++
		} else {
			keys = append(keys, key)
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("steps: split batch step %s: %w", name, err)
	}
	if by != nil {
		return partition.ByHash(counts), nil
	}
	return partition.ByRange(keys, n), nil
}

// work processes the items of one claimed partition, a chunk at a
// time, each chunk fenced by the partition, and records it done; an item
// failure records it failed, an interruption releases it. The partition's
// lease is renewed every third of its length meanwhile (partition.Heartbeat),
// and the work stops by itself if no renewal succeeds in time. claimedAt
// is the time read just before the partition's claim was sent.
func (pt *partitioned[I, O]) work(ctx context.Context, spec partition.Spec[I], pl checkpoint.PartitionLease, claimedAt time.Time) error {
	r, name := pt.r, pt.name
	h := partition.NewHold(pt.ps, pl, r.partitionLease(), claimedAt)
	pr := r.partitionView(h)
	maxKey := ""
	err := r.store.Items(ctx, checkpoint.ItemQuery{RunID: r.lease.RunID, Step: name, KeysOnly: true, Limit: 1, Last: true},
		func(it checkpoint.Item) error { maxKey = it.Key; return nil })
	if err != nil {
		return pt.release(ctx, pr, h, spec.P, err)
	}
	b := &batch[I, O]{r: pr, name: name, fn: pt.fn, opts: pt.o, target: pt.ot, fresh: pl.Fence == 1, ordered: true,
		resumed: map[string]bool{}, prog: Progress{Step: name, Total: spec.P.Total, StartedAt: r.now()},
		sourceCheck: sourceCheck[I]{r: pr, name: name, fp: newFingerprinter(name, pt.src.input), declared: -1, maxKey: maxKey},
		part:        &spec.P, hwm: spec.P.HighWater}
	if pt.ot != nil {
		b.sum.Target = pt.ot.name
	}
	h.Progress = b.partitionProgress
	pctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	beat := make(chan struct{})
	go func() {
		defer close(beat)
		partition.Heartbeat(pctx, h, pr.beat(h), stop)
	}()
	err = b.workPartition(pctx, pt.src, spec)
	stop(nil)
	<-beat
	return pt.end(ctx, pctx, h, b, err)
}

// release hands the partition p back, as claimed, when its work could not
// start (an interruption while reading what it needs), and returns err.
func (pt *partitioned[I, O]) release(ctx context.Context, pr *Run, h *partition.Hold, p checkpoint.Partition, err error) error {
	r := pt.r
	rctx, done := context.WithTimeout(context.WithoutCancel(ctx), r.fenceAhead)
	defer done()
	rel := checkpoint.PartitionProgress{State: checkpoint.PartitionPending, HighWater: p.HighWater,
		Done: p.Done, Rejected: p.Rejected, Skipped: p.Skipped, Executed: p.Executed}
	if eerr := pt.ps.EndPartition(rctx, h.Write(r.now()), rel); eerr != nil && !errors.Is(eerr, checkpoint.ErrFenced) {
		pr.log.Warn().Err(eerr).Msg("could not release the partition; it is claimable once its lease passes")
	}
	return err
}

// end records how the work of the partition b worked ended (err; pctx's
// cause, if the heartbeat stopped it): done, handed back (fenced,
// self-fenced, interrupted) or failed.
func (pt *partitioned[I, O]) end(ctx, pctx context.Context, h *partition.Hold, b *batch[I, O], err error) error {
	r, ps, pr, name, pl := pt.r, pt.ps, b.r, pt.name, h.Lease
	end := func(p checkpoint.PartitionProgress) error {
		return ps.EndPartition(context.WithoutCancel(ctx), h.Write(r.now()), p)
	}
	prog := b.partitionProgressAt(b.sum)
	switch {
	case err == nil:
		prog.State = checkpoint.PartitionDone
		if err := end(prog); err != nil {
			if errors.Is(err, checkpoint.ErrFenced) {
				// Its run ended meanwhile (or another runner claimed it):
				// hand it back, so the run's next attempt finds its items
				// finished at once rather than after the lease.
				prog.State = checkpoint.PartitionPending
				_ = end(prog)
			}
			return fmt.Errorf("steps: record partition %d of %s done: %w", pl.Index, name, err)
		}
		pr.log.Info().Str(FieldStepID, name).Int64("completed", prog.Done).Int64("rejected", prog.Rejected).
			Int64("skipped", prog.Skipped).Int64("executed", prog.Executed).Msg("partition done")
		return nil
	case errors.Is(err, checkpoint.ErrFenced) || errors.Is(context.Cause(pctx), checkpoint.ErrFenced):
		// Fenced: claimed by another runner (then the release below is
		// fenced too, and changes nothing), or its run ended, say as its
		// owner was interrupted beside this holder (then the release hands
		// the partition back for the run's next attempt, rather than leave
		// it held until its lease passes).
		prog.State = checkpoint.PartitionPending
		rctx, done := context.WithTimeout(context.WithoutCancel(ctx), r.fenceAhead)
		if eerr := ps.EndPartition(rctx, h.Write(r.now()), prog); eerr != nil && !errors.Is(eerr, checkpoint.ErrFenced) {
			pr.log.Warn().Err(eerr).Msg("could not release the fenced partition; it is claimable once its lease passes")
		}
		done()
		return errors.Join(err, context.Cause(pctx))
	case errors.Is(context.Cause(pctx), ErrPartitionLeaseLost) && ctx.Err() == nil:
		// Stopped by itself: release the partition if the store answers
		// (a fenced write: harmless if another runner claimed it), so it
		// need not wait out its lease.
		prog.State = checkpoint.PartitionPending
		rctx, done := context.WithTimeout(context.WithoutCancel(ctx), r.fenceAhead)
		eerr := ps.EndPartition(rctx, h.Write(r.now()), prog)
		done()
		if eerr != nil {
			pr.log.Warn().Err(eerr).Msg("could not release the self-fenced partition; it is claimable once its lease passes")
		}
		return context.Cause(pctx)
	case errors.Is(err, ErrInterrupted) || ctx.Err() != nil:
		prog.State = checkpoint.PartitionPending
		if eerr := end(prog); eerr != nil {
			pr.log.Warn().Err(eerr).Msg("could not release the interrupted partition; it is claimable once its lease passes")
		}
		return err
	case errors.Is(err, checkpoint.ErrTransient) && ctx.Err() == nil:
		// A store fault (a dropped connection, a deadlock), or a chunk out
		// of re-plans (*ContendedError): hand the partition back rather
		// than fail it, so any runner claims it
		// again and goes on from its committed chunks. If the store does
		// not answer, it is claimable once its lease passes.
		prog.State = checkpoint.PartitionPending
		rctx, done := context.WithTimeout(context.WithoutCancel(ctx), r.fenceAhead)
		if eerr := ps.EndPartition(rctx, h.Write(r.now()), prog); eerr != nil && !errors.Is(eerr, checkpoint.ErrFenced) {
			pr.log.Warn().Err(eerr).Msg("could not hand back the partition after a store fault; it is claimable once its lease passes")
		}
		done()
		return err
	default:
		prog.State, prog.Error = checkpoint.PartitionFailed, err.Error()
		if eerr := end(prog); eerr != nil {
			return errors.Join(err, fmt.Errorf("steps: record partition %d of %s failed: %w", pl.Index, name, eerr))
		}
		return err
	}
}

// workPartition reads the source and processes the items spec holds.
func (b *batch[I, O]) workPartition(ctx context.Context, src Source[I], spec partition.Spec[I]) error {
	if b.target != nil && !b.target.same && !b.fresh {
		if err := b.resumePlanned(context.WithoutCancel(ctx)); err != nil {
			return err
		}
	}
	return b.fill(ctx, src, spec.Holds)
}

// partitionProgress is what the partition's chunk transaction records:
// the counters with the chunk's items, and its last key.
func (b *batch[I, O]) partitionProgress() checkpoint.PartitionProgress {
	s := b.sum
	for _, rec := range b.recs {
		switch rec.Status {
		case checkpoint.StepRejected:
			s.Rejected++
		case checkpoint.ItemSkipped:
			s.Skipped++
		default:
			s.Completed++
		}
		s.Executed++
	}
	p := b.partitionProgressAt(s)
	if len(b.keys) > 0 {
		p.HighWater = b.keys[len(b.keys)-1]
	}
	return p
}

func (b *batch[I, O]) partitionProgressAt(s BatchSummary) checkpoint.PartitionProgress {
	return checkpoint.PartitionProgress{HighWater: b.hwm, Done: s.Completed, Rejected: s.Rejected, Skipped: s.Skipped, Executed: s.Executed}
}

// partitionEffectTag is what a partition's effect IDs carry in place of
// the run's fence: the partition and its fence.
func (b *batch[I, O]) partitionEffectTag() string {
	h := b.r.part
	return fmt.Sprintf("p%d.%d", h.Lease.Index, h.Lease.Fence)
}

// beat is what the heartbeat of the partition h pr works needs of pr.
func (pr *Run) beat(h *partition.Hold) partition.Beat {
	return partition.Beat{Now: pr.now, Sleep: pr.sleep, Log: &pr.log, Margin: pr.fenceAhead,
		Lost: func(expiry time.Time, failures int, lastErr error) error {
			return &PartitionLeaseLostError{RunID: h.Lease.RunID, Step: h.Lease.Step, Index: h.Lease.Index, Fence: h.Lease.Fence,
				Expiry: expiry, Margin: pr.fenceAhead, Failures: failures, LastErr: lastErr}
		}}
}
