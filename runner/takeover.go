package runner

import (
	"context"
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/steps"
)

// takeOverGone is the worker's first source of work: the queued runs and
// the partitions held by runners of this host and PID namespace whose
// process is surely gone (OwnerGone: the check a claim makes of a live
// lease), taken over at once, each at the fence it was listed with, where
// a claim would wait for the lease to expire. A run or partition taken
// meanwhile by another is left alone, and a runner wrongly found gone (a
// reused PID cannot make it so: its owner string is then alive) is fenced
// out like any whose lease was taken. Across hosts and PID namespaces the
// lease still decides (ClaimNext, ClaimPartition). It reads the store at
// most once per half poll. Nil when this process has no identity to judge
// owners by (no /proc).
func (w *Worker) takeOverGone(jobNames []string) WorkSource {
	details, ok := identity()
	if !ok {
		return nil
	}
	var (
		found  []checkpoint.HeldLease // gone owners' leases not yet tried
		looked time.Time
	)
	return func(ctx context.Context) (Task, error) {
		now := w.cfg.Runner.Clock.Now()
		if len(found) == 0 {
			if !looked.IsZero() && now.Sub(looked) < w.cfg.Poll/2 {
				return nil, nil
			}
			looked = now
			held, err := w.cfg.Runner.Store.HeldLeases(ctx, details, now)
			if err != nil {
				// Not the queue's error: the next sources are still tried.
				w.warnTakeover(ctx, err)
				return nil, nil
			}
			found = w.goneLeases(held, jobNames)
		}
		for len(found) > 0 {
			h := found[0]
			found = found[1:]
			t, err := w.takeOver(ctx, h)
			if err != nil {
				w.warnTakeover(ctx, err)
				return nil, nil
			}
			if t != nil {
				return t, nil
			}
		}
		return nil, nil
	}
}

// goneLeases keeps the leases of held the worker may take (its jobs, its
// queues, partitions unless NoPartitions) whose owner is gone.
func (w *Worker) goneLeases(held []checkpoint.HeldLease, jobNames []string) []checkpoint.HeldLease {
	gone := map[string]bool{}
	var out []checkpoint.HeldLease
	for _, h := range held {
		switch {
		case h.Owner == w.cfg.Runner.Owner, !slices.Contains(jobNames, h.Job),
			len(w.cfg.Queues) > 0 && !slices.Contains(w.cfg.Queues, h.Queue),
			!h.IsRun() && w.cfg.NoPartitions:
			continue
		}
		g, asked := gone[h.Owner]
		if !asked {
			g = OwnerGone(h.Owner)
			gone[h.Owner] = g
		}
		if g {
			out = append(out, h)
		}
	}
	return out
}

// takeOver takes the run or partition h over at its fence: its task, or
// nil when another took it first.
func (w *Worker) takeOver(ctx context.Context, h checkpoint.HeldLease) (Task, error) {
	claimedAt := w.cfg.Runner.Clock.Now()
	owner, lease := w.cfg.Runner.Owner, w.cfg.Runner.Lease
	if h.IsRun() {
		c, ok, err := w.cfg.Runner.Store.TakeOverRun(ctx, checkpoint.TakeOverRequest{RunID: h.RunID, AtFence: h.Fence,
			Owner: owner, Now: claimedAt, LeaseFor: lease})
		if err != nil || !ok {
			return nil, err
		}
		w.logTakeover(h).Msg("took over at once a run whose runner's process is gone")
		// A queued run's task, as a claim's: its end can claim the slot's
		// next run in the same commit.
		return w.runTask(ctx, c, claimedAt), nil
	}
	// Not cut short by ctx, as claimPartitions claims.
	cctx, done := context.WithTimeout(context.WithoutCancel(ctx), lease)
	defer done()
	_, pl, ok, err := w.cfg.Runner.Store.ClaimPartition(cctx, checkpoint.PartitionClaim{RunID: h.RunID, Step: h.Step,
		Index: h.Index, AtFence: h.Fence, Owner: owner, Now: claimedAt, LeaseFor: lease})
	if err != nil || !ok {
		return nil, err
	}
	w.logTakeover(h).Str(steps.FieldStepID, h.Step).Int("partition", h.Index).Msg("took over at once a partition whose runner's process is gone")
	return w.partitionTask(pl, claimedAt), nil
}

// warnTakeover logs why looking for, or taking over, a gone runner's work
// failed (unless the worker is stopping): the leases still expire, and the
// next poll looks again.
func (w *Worker) warnTakeover(ctx context.Context, err error) {
	if ctx.Err() == nil {
		w.log.Warn().Err(err).Msg("could not take over the work of a runner gone on this host; trying again at the next poll (its leases still expire)")
	}
}

// logTakeover is the warning that h was taken over before its lease ended.
func (w *Worker) logTakeover(h checkpoint.HeldLease) *zerolog.Event {
	return w.log.Warn().Str(steps.FieldRunID, h.RunID).Str("previous_owner", checkpoint.OwnerName(h.Owner)).
		Time("lease_until", h.LeaseUntil)
}
