package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// WorkPartition claims one claimable partition of a partitioned batch step
// (steps.Partitions) of any running run of a job in the runner's registry,
// as owner, and works it: it replays the run's job function from the top
// like any rerun (earlier steps return their recorded outputs; a step not
// recorded, or changed, stops it with the error exit 5 reports), processes
// the partition at the matching ForEach and stops the job function there,
// recording nothing for the run's later steps and leaving the run to its
// owner. Meanwhile it heartbeats the partition every third of Config.Lease
// and stops by itself (a *steps.PartitionLeaseLostError) if no renewal
// succeeded by the lease's expiry less Config.SelfFenceMargin. worked is
// false when no partition was claimable. It takes partitions of runs of
// any queue, and of runs started directly; a Worker claims partitions
// for its free slots the same way, narrowed to its Queues when it has
// any.
func (r *Runner) WorkPartition(ctx context.Context, owner string) (worked bool, err error) {
	task, ok, err := r.claimPartition(ctx, owner)
	if err != nil || !ok {
		return ok, err
	}
	return true, task(ctx)
}

// claimPartition claims a partition as WorkPartition does and returns the
// work on it, not yet started.
func (r *Runner) claimPartition(ctx context.Context, owner string) (task func(context.Context) error, ok bool, err error) {
	if owner == "" {
		owner = r.cfg.Owner
	}
	var names []string
	for _, j := range r.cfg.Jobs.Jobs() {
		names = append(names, j.Name())
	}
	claimedAt := r.cfg.Clock.Now()
	_, pl, ok, err := r.cfg.Store.ClaimPartition(ctx, checkpoint.PartitionClaim{Owner: owner, Jobs: names, Now: claimedAt, LeaseFor: r.cfg.Lease})
	if err != nil || !ok {
		return nil, false, err
	}
	return func(ctx context.Context) error { return r.workPartition(ctx, pl, claimedAt) }, true, nil
}

// workPartition works the claimed partition pl (see WorkPartition).
func (r *Runner) workPartition(ctx context.Context, pl checkpoint.PartitionLease, claimedAt time.Time) error {
	owner, ps := pl.Owner, r.cfg.Store
	log := r.cfg.Logger.With().Str(steps.FieldRunID, pl.RunID).Str(steps.FieldStepID, pl.Step).Int("partition", pl.Index).Logger()
	release := func(cause error) {
		end := checkpoint.PartitionProgress{State: checkpoint.PartitionPending}
		if p, err := ps.Partitions(context.WithoutCancel(ctx), pl.RunID, pl.Step); err == nil {
			for _, q := range p {
				if q.Index == pl.Index {
					end.HighWater, end.Done, end.Rejected, end.Skipped, end.Executed = q.HighWater, q.Done, q.Rejected, q.Skipped, q.Executed
				}
			}
		}
		w := checkpoint.PartitionWrite{Lease: pl, Now: r.cfg.Clock.Now(), LeaseFor: r.cfg.Lease}
		rctx, done := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.SelfFenceMargin)
		defer done()
		switch err := ps.EndPartition(rctx, w, end); {
		case errors.Is(err, checkpoint.ErrFenced):
			// Released, done or failed already, or claimed by another.
		case err != nil:
			log.Warn().Err(err).Msg("could not release the partition; it is claimable once its lease passes")
		default:
			log.Warn().Err(cause).Msg("partition released without being worked")
		}
	}
	info, err := r.cfg.Store.Run(ctx, pl.RunID)
	if err != nil {
		release(err)
		return err
	}
	job, err := r.cfg.Jobs.Lookup(info.Run.Job)
	if err != nil {
		release(err)
		return fmt.Errorf("run %s: %w", pl.RunID, err)
	}
	dec, err := job.Decode(nil, info.Run.Params)
	if err != nil {
		release(err)
		return fmt.Errorf("run %s: stored parameters no longer decode: %w", pl.RunID, err)
	}
	log.Info().Int64("fence", pl.Fence).Msg("partition claimed")
	jobLog := r.cfg.Logger.With().Str(steps.FieldJob, job.Name()).Int("partition", pl.Index).Logger()
	cfg := r.stepsConfig(job, checkpoint.Lease{RunID: pl.RunID, Fence: info.Run.Fence, Attempt: pl.Attempt, Owner: owner}, jobLog)
	cfg.Partition, cfg.PartitionClaimedAt = &pl, claimedAt
	run, err := steps.Begin(ctx, cfg)
	if err != nil {
		release(err)
		return err
	}
	jobErr := callJob(jobs.WithTargets(ctx, r.cfg.Targets), job, run, dec.JSON)
	if cerr := run.Close(); jobErr == nil {
		jobErr = cerr
	}
	r.cfg.Metrics.partitionEnded(job.Name(), errors.Is(jobErr, steps.ErrPartitionWorked), run.Stats())
	switch {
	case errors.Is(jobErr, steps.ErrPartitionWorked):
		log.Info().Msg("partition worked")
		return nil
	case jobErr == nil:
		jobErr = fmt.Errorf("run %s: the job returned without reaching batch step %s: it may have changed since the run's owner ran it", pl.RunID, pl.Step)
		release(jobErr)
	default:
		// Whatever stopped the replay (a step not recorded or changed, an
		// interruption before the partition was reached), hand the
		// partition back unless it was ended already: the release is
		// fenced by the partition, so it changes nothing then.
		release(jobErr)
	}
	return fmt.Errorf("partition %d of %s of run %s: %w", pl.Index, pl.Step, pl.RunID, jobErr)
}
