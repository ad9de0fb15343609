package steps

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/steps/internal/partition"
)

// The run's owner coordinating a partitioned batch step: partitions
// claimed and worked on goroutines, others' watched, taken over when
// their holder is gone, their progress summed.

// coordinate works the step's partitions on goroutines until every one is
// done: it claims pending and lease-expired ones, and those whose holder is
// known gone, waiting while others hold live leases. A failed partition
// fails the step once the goroutines stopped.
func (pt *partitioned[I, O]) coordinate(ctx context.Context, specs map[int]partition.Spec[I]) error {
	r, name := pt.r, pt.name
	// How often the coordinator looks at partitions others hold: its
	// join waits at most this long past the last one done.
	poll := min(r.partitionLease()/10, 200*time.Millisecond)
	finish := r.watchPartitions(ctx, pt.ps, name, r.progressEvery)
	defer finish(false)
	claim := checkpoint.PartitionClaim{RunID: r.lease.RunID, Step: name, Owner: r.lease.Owner, LeaseFor: r.partitionLease()}
	for {
		slots := len(specs)
		if r.partSlots > 0 && r.partSlots < slots {
			slots = r.partSlots
		}
		if err := pt.workSlots(ctx, claim, slots); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%w in batch step %s: %w", ErrInterrupted, name, context.Cause(ctx))
		}
		left, err := pt.review(ctx, claim)
		if err != nil {
			return err
		}
		if left == 0 {
			finish(true)
			return nil
		}
		if err := r.sleep(ctx, poll); err != nil {
			return fmt.Errorf("%w in batch step %s: %w", ErrInterrupted, name, err)
		}
	}
}

// workSlots claims and works partitions on slots goroutines until none is
// left to claim, and returns the first failure (which stops the others).
func (pt *partitioned[I, O]) workSlots(ctx context.Context, claim checkpoint.PartitionClaim, slots int) error {
	gctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pt.claimAndWork(ctx, gctx, claim); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
				cancel(err)
			}
		}()
	}
	wg.Wait()
	return first
}

// claimAndWork is one slot: it claims a partition and works it, again,
// until no partition is left to claim or gctx ends. A partition taken over
// by another runner, or given up by its self-fenced holder, is not a
// failure: the slot claims the next.
func (pt *partitioned[I, O]) claimAndWork(ctx, gctx context.Context, claim checkpoint.PartitionClaim) error {
	r, name := pt.r, pt.name
	policy, faults := StoreRetryPolicy(r.retry), 0
	for gctx.Err() == nil {
		claim.Now = r.now()
		// Not cut short by gctx: a claim the server made but whose answer
		// was lost would leave the partition held until its lease passed;
		// claimed, it is handed back at once if gctx ended.
		cctx, done := context.WithTimeout(context.WithoutCancel(gctx), r.partitionLease())
		p, pl, ok, err := pt.ps.ClaimPartition(cctx, claim)
		done()
		if err == nil && !ok {
			return nil
		}
		if err == nil {
			err = pt.work(gctx, pt.spec(p), pl, claim.Now)
		}
		if errors.Is(err, checkpoint.ErrFenced) && ctx.Err() == nil {
			r.log.Warn().Str(FieldStepID, name).Int("partition", pl.Index).Err(err).Msg("partition taken over by another runner")
			continue
		}
		if errors.Is(err, ErrPartitionLeaseLost) && ctx.Err() == nil {
			// Claimable again once its lease passes, by this runner too:
			// the next claim finds it then.
			if r.sleep(gctx, min(r.partitionLease()/10, time.Second)) != nil {
				return nil
			}
			continue
		}
		if errors.Is(err, checkpoint.ErrTransient) && ctx.Err() == nil && faults+1 < policy.MaxTries {
			// A store fault, or a chunk that ran out of re-plans
			// (*ContendedError): the partition was handed back (end), so
			// it is claimable again, by this runner too, after a pause.
			faults++
			delay := policy.Backoff(faults, rand.Float64())
			r.log.Warn().Str(FieldStepID, name).Int("partition", pl.Index).Int("try", faults).
				Float64(FieldRetryInSeconds, delay.Seconds()).Err(err).Msg(handedBack(err))
			if r.sleep(gctx, delay) != nil {
				return nil
			}
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// review reads the step's partitions once the slots found none to claim:
// how many are left (running elsewhere, or pending), working at once any
// whose holder is known gone; a failed partition fails the step.
func (pt *partitioned[I, O]) review(ctx context.Context, claim checkpoint.PartitionClaim) (left int, err error) {
	r, name := pt.r, pt.name
	parts, err := pt.ps.Partitions(ctx, r.lease.RunID, name)
	if err != nil {
		return 0, err
	}
	var failed []string
	for _, p := range parts {
		switch p.State {
		case checkpoint.PartitionFailed:
			failed = append(failed, fmt.Sprintf("partition %d: %s", p.Index, p.Error))
		case checkpoint.PartitionRunning:
			left++
			if r.ownerGone != nil && p.Owner != r.lease.Owner && r.ownerGone(p.Owner) {
				if err := pt.takeOver(ctx, claim, p); err != nil {
					return 0, err
				}
			}
		case checkpoint.PartitionPending:
			left++
		}
	}
	if len(failed) > 0 {
		return 0, &StepError{RunID: r.lease.RunID, Step: name, Err: fmt.Errorf("%d of %d partitions failed: %s", len(failed), len(parts), strings.Join(failed, "; "))}
	}
	return left, nil
}

// takeOver claims, at its fence, the partition p whose holder is known
// gone, and works it.
func (pt *partitioned[I, O]) takeOver(ctx context.Context, claim checkpoint.PartitionClaim, p checkpoint.Partition) error {
	r := pt.r
	c := claim
	c.Now, c.Index, c.AtFence = r.now(), p.Index, p.Fence
	np, pl, ok, err := pt.ps.ClaimPartition(ctx, c)
	if err != nil || !ok {
		return err
	}
	r.log.Warn().Str(FieldStepID, pt.name).Int("partition", p.Index).Str("previous_owner", checkpoint.OwnerName(p.Owner)).
		Msg("took over a partition whose runner is gone")
	if err := pt.work(ctx, pt.spec(np), pl, c.Now); err != nil && !errors.Is(err, checkpoint.ErrFenced) && !errors.Is(err, ErrPartitionLeaseLost) {
		return err
	}
	return nil
}

// DefaultProgressEvery is how often the run's owner reports a
// partitioned batch step's progress, summed over its partitions, when
// Config.ProgressEvery is zero.
const DefaultProgressEvery = 500 * time.Millisecond

// watchPartitions reports the progress of the partitioned batch step name
// to the run's progress hook while its owner coordinates it: every
// interval, the partitions' counters summed, whoever works them (this
// process or other workers). What the partitions had finished when it
// started counts as replayed. The returned finish stops the reports and,
// with final, sends the step's last one; only its first call counts.
func (r *Run) watchPartitions(ctx context.Context, ps checkpoint.PartitionStore, name string, every time.Duration) (finish func(final bool)) {
	if r.progress == nil {
		return func(bool) {}
	}
	started := r.now()
	replayed := int64(-1)
	report := func(ctx context.Context, final bool) {
		parts, err := ps.Partitions(ctx, r.lease.RunID, name)
		if err != nil || len(parts) == 0 {
			return // progress is advice: the next report, or the step's end, tells
		}
		p := Progress{Step: name, StartedAt: started, Final: final}
		for _, pt := range parts {
			p.Total += pt.Total
			p.Done += pt.Finished()
			p.Rejected += pt.Rejected
			p.Skipped += pt.Skipped
		}
		if replayed < 0 {
			replayed = p.Done
		}
		p.Replayed = replayed
		r.progress(p)
	}
	report(ctx, false)
	wctx, cancel := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
				report(wctx, false)
			}
		}
	}()
	var once sync.Once
	return func(final bool) {
		once.Do(func() {
			cancel()
			<-stopped
			if final {
				report(ctx, true)
			}
		})
	}
}

// handedBack is the log message of a partition handed back after err.
func handedBack(err error) string {
	var contended *ContendedError
	if errors.As(err, &contended) {
		return "a chunk of a partition ran out of re-plans under contention; the partition is claimed again after a pause"
	}
	return "store fault in a partition; it is claimed again after a pause"
}
