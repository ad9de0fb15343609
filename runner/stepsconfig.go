package runner

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// dryConfig is the steps.Config of a dry run of runID: of stepsConfig it
// keeps the store (to read), the lease's run and owner, the clock, the
// logger and the tracer. A dry run is no attempt: it holds no lease (so it
// renews and fences nothing), writes nothing, retries nothing, adds to no
// histogram and reports no progress.
func (r *Runner) dryConfig(job jobs.Job, runID string, log zerolog.Logger) steps.Config {
	c := r.stepsConfig(job, checkpoint.Lease{RunID: runID, Owner: r.cfg.Owner}, log)
	return steps.Config{Store: c.Store, Lease: c.Lease, Logger: c.Logger, Now: c.Now, Tracer: c.Tracer, DryRun: true}
}

// stepsConfig is the one steps.Config of the runner's attempts on job
// under lease, logging to log: the store, clock, tracer, write path
// (lock waiting), retry policy, lease, step-end (metrics) and progress
// hooks. An attempt adds what its claim says, a partition worker's replay
// its partition; a dry run keeps only what a dry run uses (dryConfig).
func (r *Runner) stepsConfig(job jobs.Job, lease checkpoint.Lease, log zerolog.Logger) steps.Config {
	cfg := steps.Config{Store: r.cfg.Store, Lease: lease, Logger: &log, Now: r.storeClock(), Tracer: r.tracer,
		Write: r.writeHook(log), Retry: job.Settings().Retry, LeaseFor: r.cfg.Lease, SelfFenceMargin: r.cfg.SelfFenceMargin,
		OnStepEnd: r.cfg.Metrics.stepHook(job.Name()),
		OwnerGone: OwnerGone, PartitionSlots: r.cfg.PartitionSlots}
	cfg.OnProgress, cfg.ProgressEvery = r.progressHook(lease, log)
	cfg.Sleep = func(ctx context.Context, d time.Duration) error { return sleep(ctx, r.cfg.Clock, d) }
	return cfg
}

// storeClockTimeout bounds storeClock's one read of the store's clock.
const storeClockTimeout = 5 * time.Second

// storeClock is the clock of an attempt's steps: the runner's clock
// moved by how far the store's clock (checkpoint.Inspector.StoreNow,
// PostgreSQL's now()) is from it, read once as the attempt begins. So
// step checkpoints carry times on the clock of the attempts and leases
// beside them, and `show` never mixes a skewed host's step times with the
// server's attempt times (issue 23.4). A store that keeps its caller's
// clock (SQLite) or cannot be read leaves the runner's clock as it is.
func (r *Runner) storeClock() func() time.Time {
	ctx, cancel := context.WithTimeout(context.Background(), storeClockTimeout)
	defer cancel()
	before := r.cfg.Clock.Now()
	server, err := r.cfg.Store.StoreNow(ctx)
	if err != nil || server.IsZero() {
		return r.cfg.Clock.Now
	}
	// The server read its clock somewhere in the round trip: its middle.
	local := before.Add(r.cfg.Clock.Now().Sub(before) / 2)
	skew := server.Sub(local)
	return func() time.Time { return r.cfg.Clock.Now().Add(skew) }
}
