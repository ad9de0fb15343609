package runner

import (
	"context"
	"sync"
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

// storeSkewReuse is how long a runner reuses a reading of the store's
// clock for the attempts it begins: clocks drift by microseconds a
// minute, and a pool worker begins hundreds of attempts a second, each of
// which would otherwise cost a round trip.
const storeSkewReuse = time.Minute

// storeSkew is a runner's last reading of how far the store's clock is
// from its own.
type storeSkew struct {
	mu     sync.Mutex
	skew   time.Duration
	read   time.Time // on the runner's clock; zero: never read
	server bool      // the store keeps a clock of its own
}

// storeClock is the clock of an attempt's steps: the runner's clock
// moved by how far the store's clock (checkpoint.Inspector.StoreNow,
// PostgreSQL's now()) is from it, read as the attempt begins, or taken
// from this runner's reading of the last storeSkewReuse. So step
// checkpoints carry times on the clock of the attempts and leases beside
// them, and `show` never mixes a skewed host's step times with the
// server's attempt times (issue 23.4). A store that keeps its caller's
// clock (SQLite) or cannot be read leaves the runner's clock as it is.
func (r *Runner) storeClock() func() time.Time {
	sk := &r.skew
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if sk.read.IsZero() || r.cfg.Clock.Now().Sub(sk.read) >= storeSkewReuse || sk.read.After(r.cfg.Clock.Now()) {
		ctx, cancel := context.WithTimeout(context.Background(), storeClockTimeout)
		defer cancel()
		before := r.cfg.Clock.Now()
		server, err := r.cfg.Store.StoreNow(ctx)
		if err != nil {
			return r.cfg.Clock.Now // not kept: read again next time
		}
		// The server read its clock somewhere in the round trip: its middle.
		local := before.Add(r.cfg.Clock.Now().Sub(before) / 2)
		sk.read, sk.server, sk.skew = before, !server.IsZero(), server.Sub(local)
	}
	if !sk.server {
		return r.cfg.Clock.Now
	}
	skew := sk.skew
	return func() time.Time { return r.cfg.Clock.Now().Add(skew) }
}
