package checkpoint

import (
	"context"
	"fmt"
	"time"
)

// HeldLease is a live lease on a run or on a partition of one of its
// batch steps, as TakeoverStore.HeldLeases lists it.
type HeldLease struct {
	RunID string
	Job   string
	// Queue is the run's queue; empty for a run started directly (never
	// enqueued), which only its own process or `run`/`resume` take over.
	Queue string
	// Step and Index name the partition held; Step is empty for the run's
	// own lease.
	Step  string
	Index int
	// Owner is the lease's full owner string, Fence the run's or the
	// partition's fence, LeaseUntil when the lease expires.
	Owner      string
	Fence      int64
	LeaseUntil time.Time
}

// IsRun reports whether h is a run's lease (not a partition's).
func (h HeldLease) IsRun() bool { return h.Step == "" }

// TakeOverRequest asks for a run held by a runner known to be gone to be
// taken over at once, before its lease expires.
type TakeOverRequest struct {
	RunID string
	// AtFence is the run's fence as HeldLeases listed it: the take-over
	// happens only while the run is still running at it, so a run claimed,
	// finished or taken over by another since is left alone.
	AtFence  int64
	Owner    string
	Now      time.Time
	LeaseFor time.Duration
}

// Validate checks a take-over request as every store does; needNow as
// for ClaimRequest.Validate.
func (r TakeOverRequest) Validate(needNow bool) error {
	if r.RunID == "" || r.AtFence <= 0 || r.Owner == "" || r.LeaseFor <= 0 || (needNow && r.Now.IsZero()) {
		return fmt.Errorf("checkpoint: a take-over needs a RunID, a positive AtFence, an Owner, a positive LeaseFor and, "+
			"on the caller's clock, Now (got %q, %d, %q, %s, %v)", r.RunID, r.AtFence, r.Owner, r.LeaseFor, r.Now)
	}
	return nil
}

// TakeoverStore is the part of a store that lets any runner take over at
// once the work of a runner it knows is gone (its process surely exited:
// same kernel boot and PID namespace, PID dead), where a claim would wait
// for the lease to expire. Knowing who is gone is the runner's business;
// the store lists who holds what and takes over exactly the lease named,
// raising its fence, so a runner that is not gone after all (a wrong
// guess) is fenced out like any runner whose lease was taken.
type TakeoverStore interface {
	// HeldLeases lists the leases live at now (on the store's clock for a
	// store that keeps one) of running queued runs (those a worker may
	// take: enqueued, QueueStore) and of running partitions of running
	// runs (enqueued or not), whose owner is "NAME DETAILS" with exactly these
	// details (see OwnerName): the runners of one host and PID namespace.
	// Empty details lists every live lease. Runs come before partitions.
	HeldLeases(ctx context.Context, details string, now time.Time) ([]HeldLease, error)
	// TakeOverRun claims the queued run req.RunID while it is still
	// running at req.AtFence, whatever its lease: it raises the fence,
	// marks the unfinished attempt lost and records a new one, as
	// ClaimNext does for a lease that expired (Claim.TookOverFrom and
	// PreviousLeaseUntil name the lease taken over). ok is false when the
	// run is no longer so (claimed, ended or taken over since), or was
	// never enqueued. A partition is taken over by ClaimPartition with
	// AtFence.
	TakeOverRun(ctx context.Context, req TakeOverRequest) (c Claim, ok bool, err error)
}
