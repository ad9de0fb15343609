package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// lockWaiter is the store an attempt writes through under Config.Wait: a
// write that finds the database locked by another process (ErrLocked,
// after the store's own busy timeout) waits and tries again, every
// WaitPoll, until it gets the lock or its context ends, instead of failing
// the run. Retrying is safe because a store keeps nothing of a write that
// returned an error (Store.InTx, Finish, Heartbeat), and a step's
// transaction function reads what it writes from within the transaction.
// The fence still decides: if another runner took the run over while this
// one waited, the retried write is refused with ErrFenced.
type lockWaiter struct {
	checkpoint.Store
	r   *Runner
	log zerolog.Logger
}

// waitingStore returns the store an attempt writes through: st itself
// unless the runner waits for locks.
func (r *Runner) waitingStore(st checkpoint.Store, log zerolog.Logger) checkpoint.Store {
	if !r.cfg.Wait {
		return st
	}
	// Store.OpenTarget is forwarded by embedding: a same-store target's
	// writes go through InTx, which waits here.
	return lockWaiter{Store: st, r: r, log: log}
}

// Unwrap returns the store waited on, for what it offers beyond
// checkpoint.Store (partitions: checkpoint.AsPartitionStore).
func (w lockWaiter) Unwrap() checkpoint.Store { return w.Store }

// InTx implements checkpoint.Store, waiting out a locked database.
func (w lockWaiter) InTx(ctx context.Context, l checkpoint.Lease, fn func(checkpoint.Tx) error) error {
	return w.retry(ctx, "write", func() error { return w.Store.InTx(ctx, l, fn) })
}

// Finish implements checkpoint.Store, waiting out a locked database.
func (w lockWaiter) Finish(ctx context.Context, l checkpoint.Lease, e checkpoint.Ending) error {
	return w.retry(ctx, "record the run's end", func() error { return w.Store.Finish(ctx, l, e) })
}

// Heartbeat implements checkpoint.Store, waiting out a locked database.
func (w lockWaiter) Heartbeat(ctx context.Context, l checkpoint.Lease, now, until time.Time) error {
	return w.retry(ctx, "extend the lease", func() error { return w.Store.Heartbeat(ctx, l, now, until) })
}

// retry calls write until it returns something other than ErrLocked or ctx
// ends, waiting WaitPoll between tries. It logs once per wait.
func (w lockWaiter) retry(ctx context.Context, what string, write func() error) error {
	for tries := 0; ; tries++ {
		err := write()
		if !errors.Is(err, checkpoint.ErrLocked) {
			if tries > 0 && err == nil {
				w.log.Info().Int("tries", tries+1).Msg("database lock released; the write went through")
			}
			return err
		}
		if tries == 0 {
			w.log.Warn().Err(err).Str("write", what).Msg("database locked by another process; waiting for it")
		}
		if serr := sleepOn(w.r.cfg.Clock, ctx, w.r.cfg.WaitPoll); serr != nil {
			return fmt.Errorf("%w while waiting for the database lock to %s: %w", ErrInterrupted, what, err)
		}
	}
}
