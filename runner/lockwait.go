package runner

import (
	"context"
	"errors"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// write is the runner's one write path for an attempt's writes of its run
// (its steps' checkpoints through steps.Config.Write, the lease renewal
// before an outside call, the attempt's end): it calls write once, or
// under Config.Wait waits out a locked database. A write that finds the
// database locked by another process (ErrLocked, after the store's own
// busy timeout) then waits and tries again, every WaitPoll, until it gets
// the lock or its context ends, instead of failing the run. Retrying is
// safe because a store keeps nothing of a write that returned an error
// (Store.InTx, Finish, Heartbeat), and a step's transaction function reads
// what it writes from within the transaction. The fence still decides: if
// another runner took the run over while this one waited, the retried
// write is refused with ErrFenced.
func (r *Runner) write(ctx context.Context, log zerolog.Logger, what string, write func() error) error {
	for tries := 0; ; tries++ {
		err := write()
		if !r.cfg.Wait || !errors.Is(err, checkpoint.ErrLocked) {
			if tries > 0 && err == nil {
				log.Info().Int("tries", tries+1).Msg("database lock released; the write went through")
			}
			return err
		}
		if tries == 0 {
			log.Warn().Err(err).Str("write", what).Msg("database locked by another process; waiting for it")
		}
		if serr := sleep(ctx, r.cfg.Clock, r.cfg.WaitPoll); serr != nil {
			return fmt.Errorf("%w while waiting for the database lock to %s: %w", ErrInterrupted, what, err)
		}
	}
}

// writeHook is the steps.Config.Write of an attempt logging to log: the
// runner's write path, or nil when it only calls the write (no Wait).
func (r *Runner) writeHook(log zerolog.Logger) func(ctx context.Context, what string, write func() error) error {
	if !r.cfg.Wait {
		return nil
	}
	return func(ctx context.Context, what string, write func() error) error {
		return r.write(ctx, log, what, write)
	}
}
