// Package partition is the lease keeping and the split behind steps'
// partitioned batch steps (steps.Partitions): what a holder of one
// partition writes with, the heartbeat that renews its lease and stops
// the work when it cannot, and how a step's items are split once. Job
// code never imports it; steps works it.
package partition

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// Hold is what a holder of one partition writes with: the partition's
// fenced lease and when it was last renewed.
type Hold struct {
	Store    checkpoint.PartitionStore
	Lease    checkpoint.PartitionLease
	LeaseFor time.Duration
	// Progress says what the partition's next write records.
	Progress func() checkpoint.PartitionProgress

	mu sync.Mutex
	// renewed is the send time of the latest write that extended the
	// lease (a chunk's commit, a heartbeat): the lease lasts at least
	// until renewed plus LeaseFor.
	renewed time.Time
}

// NewHold is the hold of a partition claimed with lease; claimedAt is the
// time read just before the claim was sent.
func NewHold(ps checkpoint.PartitionStore, lease checkpoint.PartitionLease, leaseFor time.Duration, claimedAt time.Time) *Hold {
	return &Hold{Store: ps, Lease: lease, LeaseFor: leaseFor, renewed: claimedAt}
}

// RenewedAt notes a write sent at t that extended the lease.
func (h *Hold) RenewedAt(t time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if t.After(h.renewed) {
		h.renewed = t
	}
}

// Expiry is when the lease expires as last renewed.
func (h *Hold) Expiry() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.renewed.Add(h.LeaseFor)
}

// Write is a write fenced by the partition, sent at now.
func (h *Hold) Write(now time.Time) checkpoint.PartitionWrite {
	return checkpoint.PartitionWrite{Lease: h.Lease, Now: now, LeaseFor: h.LeaseFor, Progress: h.Progress}
}

// InTx runs fn in one transaction fenced by the partition, sent at now,
// recording the partition's progress with it and extending its lease.
func (h *Hold) InTx(ctx context.Context, now time.Time, fn func(checkpoint.Tx) error) error {
	err := h.Store.InPartitionTx(ctx, h.Write(now), fn)
	if err == nil {
		h.RenewedAt(now)
	}
	return err
}

// Renew renews the lease at now (the heartbeat's write), which also checks
// the partition's fence.
func (h *Hold) Renew(ctx context.Context, now time.Time) error {
	return h.Store.HeartbeatPartition(ctx, h.Lease, now, h.LeaseFor)
}

// Beat is what Heartbeat needs of the holder's run.
type Beat struct {
	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration) error
	Log   *zerolog.Logger
	// Margin is how long before the lease's known expiry the holder
	// stops if no renewal succeeded (steps.Config.SelfFenceMargin).
	Margin time.Duration
	// Lost is the error the work is stopped with then: the lease's
	// expiry as last renewed, the heartbeats failed since, the last one's
	// error (nil when none was tried in time).
	Lost func(expiry time.Time, failures int, lastErr error) error
}

// Heartbeat renews the partition's lease every third of its length,
// through the run's clock, until ctx ends. A renewal refused with
// checkpoint.ErrFenced (another runner claimed the partition) stops the
// work at once with that error. Any other failure is retried, an eighth of
// the interval later, doubling; if no renewal (a heartbeat or a chunk's
// commit) succeeded by the lease's known expiry less the margin, the work
// is stopped with b.Lost's error. Each heartbeat's call is bounded by the
// self-fence time too, so a hung connection cannot hold the check up.
func Heartbeat(ctx context.Context, h *Hold, b Beat, stop context.CancelCauseFunc) {
	interval := h.LeaseFor / 3
	next := h.Expiry().Add(-h.LeaseFor).Add(interval)
	var (
		failures int
		lastErr  error
	)
	for {
		expiry := h.Expiry()
		if r := expiry.Add(interval - h.LeaseFor); r.After(next) {
			next = r // a chunk's commit renewed the lease: no heartbeat needed before then
		}
		fenceAt := expiry.Add(-b.Margin)
		now := b.Now()
		if wake := minTime(next, fenceAt); now.Before(wake) {
			if b.Sleep(ctx, wake.Sub(now)) != nil {
				return
			}
			now = b.Now()
			if e := h.Expiry(); e.After(expiry) {
				continue // a chunk's commit renewed it meanwhile
			}
		}
		if !now.Before(fenceAt) {
			b.Log.Error().AnErr("heartbeat_error", lastErr).Int("failures", failures).Time("lease_expires", expiry).
				Msg("the partition's lease could not be renewed in time: its holder stops working it (self-fenced) " +
					"and calls no outside system; any runner may claim it once the lease passes")
			stop(b.Lost(expiry, failures, lastErr))
			return
		}
		if now.Before(next) {
			continue
		}
		callCtx, done := context.WithTimeout(ctx, min(interval, fenceAt.Sub(now)))
		err := h.Renew(callCtx, now)
		done()
		if ctx.Err() != nil {
			return
		}
		switch {
		case err == nil:
			if failures > 0 {
				b.Log.Info().Int("failures", failures).Msg("the partition's heartbeat renewed its lease again")
			}
			h.RenewedAt(now)
			next, failures, lastErr = now.Add(interval), 0, nil
		case errors.Is(err, checkpoint.ErrFenced):
			stop(err)
			return
		default:
			failures, lastErr = failures+1, err
			next = now.Add(backoff(interval, failures))
			b.Log.Warn().Err(err).Int("failures", failures).Time("self_fence_at", fenceAt).
				Msg("the partition's heartbeat failed; retrying until its lease is nearly out")
		}
	}
}

// backoff is the wait after the failures-th failed heartbeat in a row:
// an eighth of interval, doubling, at most interval.
func backoff(interval time.Duration, failures int) time.Duration {
	d := interval / 8
	for i := 1; i < failures && d < interval; i++ {
		d *= 2
	}
	return min(d, interval)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
