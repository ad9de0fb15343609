package checkpoint

import (
	"context"
	"fmt"
	"time"
)

// Partition rules: how a partitioned batch step's items are assigned to
// its partitions.
const (
	// PartitionRange assigns an item to the partition whose key range
	// [From, To) holds its key (bytewise; To "" is unbounded above).
	PartitionRange = "range"
	// PartitionHash assigns an item to partition PartitionHashOf(value) mod
	// Count, where value is what the job's PartitionBy function maps the
	// item to.
	PartitionHash = "hash"
)

// Partition states.
const (
	// PartitionPending: no runner holds the partition; any may claim it.
	PartitionPending = "pending"
	// PartitionRunning: a runner holds the partition until LeaseUntil.
	// Once that passes, any runner may claim it again (raising its fence).
	PartitionRunning = "running"
	// PartitionDone: every item of the partition is finished.
	PartitionDone = "done"
	// PartitionFailed: an item failed beyond the step's skip policy; the
	// step fails. The run's next attempt (its coordinator) reopens it.
	PartitionFailed = "failed"
)

// Partition is one partition of a batch step: which items it holds, who
// works it, and how far it got. A step's partitions are recorded once,
// with the step's running checkpoint, and never recomputed.
type Partition struct {
	RunID string
	Step  string
	Index int // 0 .. Count-1
	Count int // how many partitions the step has
	Rule  string
	// From and To bound a PartitionRange partition's keys: From <= key <
	// To, To "" meaning no upper bound.
	From, To   string
	State      string
	Owner      string    // the runner holding or last holding it
	Fence      int64     // raised by every claim; a chunk commits only at its fence
	LeaseUntil time.Time // zero unless running
	// HighWater is the last item key of the partition's last committed
	// chunk, in the source's order.
	HighWater string
	// Done, Rejected and Skipped count the partition's finished items as
	// its last pass saw them (items finished by earlier passes included);
	// exact once the partition is done. Executed counts those its last
	// pass processed itself.
	Done, Rejected, Skipped, Executed int64
	// Total is how many items the partition held when the step was split.
	Total     int64
	Error     string // why it failed
	UpdatedAt time.Time
}

// Finished is how many of the partition's items are finished.
func (p Partition) Finished() int64 { return p.Done + p.Rejected + p.Skipped }

// Holds reports whether a PartitionRange partition's key range holds key.
func (p Partition) Holds(key string) bool {
	return key >= p.From && (p.To == "" || key < p.To)
}

// PartitionHashOf is the hash a PartitionHash rule assigns by: 64-bit
// FNV-1a of the value, so every runner, on every host, assigns alike.
func PartitionHashOf(value string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(value); i++ {
		h ^= uint64(value[i])
		h *= 1099511628211
	}
	return h
}

// PartitionLease is one claim's right to write a partition's chunks.
type PartitionLease struct {
	RunID string
	Step  string
	Index int
	Fence int64
	Owner string
	// Attempt is the run's attempt when the partition was claimed: its
	// items are recorded under it.
	Attempt int
}

// PartitionClaim asks for a partition to work.
type PartitionClaim struct {
	// RunID and Step narrow the claim to one run, or one batch step of it;
	// empty claims from any running run.
	RunID, Step string
	// Jobs, when not empty, narrows the claim to partitions of runs of
	// these jobs: those the claimer can replay.
	Jobs []string
	// Queues, when not empty, narrows the claim to partitions of runs
	// enqueued in these queues (QueueStore), as a worker's --queues narrows
	// the runs it takes: runs started directly, in no queue, are left to
	// their own process and to claimers without Queues.
	Queues []string
	Owner  string
	// Now is the caller's time; a store judging leases by its own clock
	// (a server's now()) ignores it.
	Now      time.Time
	LeaseFor time.Duration
	// AtFence, when positive (with RunID and Step set), claims partition
	// Index while it is still at AtFence, whatever its lease: its owner
	// is known to be gone.
	Index   int
	AtFence int64
}

// Validate checks a partition claim as every store does.
func (c PartitionClaim) Validate(needNow bool) error {
	if c.Owner == "" || c.LeaseFor <= 0 || (needNow && c.Now.IsZero()) || (c.AtFence > 0 && (c.RunID == "" || c.Step == "")) {
		return fmt.Errorf("checkpoint: a partition claim needs an Owner, a positive LeaseFor, on the caller's clock Now, "+
			"and with AtFence a RunID and Step (got %q, %s, %v, %q, %q)", c.Owner, c.LeaseFor, c.Now, c.RunID, c.Step)
	}
	return nil
}

// PartitionProgress is what a partition's write records of it: its high
// water mark and counters (absolute, not increments), and its state.
type PartitionProgress struct {
	HighWater                         string
	Done, Rejected, Skipped, Executed int64
	// State is "" (still running: the lease is extended), PartitionDone,
	// PartitionFailed (with Error) or PartitionPending (released: the
	// holder stops, any runner may claim it at once).
	State string
	Error string
}

// PartitionWrite says which partition a chunk transaction writes.
type PartitionWrite struct {
	Lease    PartitionLease
	Now      time.Time     // the caller's time (see PartitionClaim.Now)
	LeaseFor time.Duration // the write extends the lease by this much
	// Progress, when not nil, is called once fn returned nil; what it
	// returns is recorded in the same transaction.
	Progress func() PartitionProgress
}

// PartitionStore is the part of a store that splits one batch step across
// runners (steps.Partitions). Both stores implement it.
//
// # The fence rule of a partition
//
// A partition has a fence of its own, raised by every claim of it. A
// partition's chunk transaction (InPartitionTx) commits only if the
// partition is still at the writer's fence, still running, and its run is
// still running, at the moment it commits: its first statement updates
// the partition row WHERE fence = the lease's (PostgreSQL: the row lock
// it takes is held to the commit, so a claim of the partition waits for
// it or skips it; SQLite: the one write lock). That update is the
// heartbeat too: it extends the partition's lease.
//
// A partition's fence never repeats within its run and step, not even
// across a reset of the step, since a partition's effects are named by
// its index and fence (steps.Partitions): a split records its partitions
// at the run's fence - 1, so a first claim gets the run's fence, and a
// reset raises the run's fence above every fence the run's partitions
// reached before it deletes them.
//
// A partition chunk is NOT fenced by the run's fence. The run's fence
// guards what the run's owner writes (the step's checkpoint, the
// partition split, the join's summary, later steps); a partition chunk
// writes none of those, only its own items, chunk plans, effects and
// outbox rows, and each item belongs to exactly one partition. A takeover
// of the run therefore keeps the partitions (it never re-splits them) and
// leaves their holders working: fencing them out as well would throw away
// every worker's progress whenever the coordinator moves, for no gain in
// safety. What stops a stale partition writer is its own partition's
// fence: a claim of a lease-expired partition, a reopen of a failed one,
// or the partitions' removal (a reset of the step) all fence it out. A
// run that is no longer running (finished, abandoned) refuses partition
// chunks too.
//
// A chunk in flight also holds its run against an operator action (a
// reset above all) and a claim of the run until it commits: PostgreSQL's
// partition fence locks the running run's row FOR KEY SHARE, as a run
// write's fence does, which their FOR UPDATE waits for; SQLite has its
// one write lock. So a reset never leaves behind items a chunk committed
// as it ran: the chunk commits first and the reset deletes its items, or
// the reset first and the chunk is fenced. On PostgreSQL the run's end by
// its own owner (Finish, which takes no FOR UPDATE) does not wait: a chunk
// already committing then may still commit after the run ended (its items
// and effects are still exactly once, and the run's next attempt resumes
// the partition from them). On SQLite it cannot.
//
// A partition's writes (items, chunk plans, target rows) are serialised
// with its claims; writes of different partitions run at once and meet
// only on target rows, which a store locks in key order (Target.Read), so
// partitions sharing keys wait for each other instead of aborting, and
// never deadlock.
type PartitionStore interface {
	// StartPartitioned records a partitioned batch step's running
	// checkpoint head and, when the step has none recorded, its
	// partitions ps, in one transaction fenced by the run's lease l. When
	// partitions are recorded already they are kept as they are (never
	// split again), except that failed ones are reopened (pending, fence
	// raised, error cleared). It returns the recorded partitions, by
	// index.
	StartPartitioned(ctx context.Context, l Lease, head Step, ps []Partition) ([]Partition, error)
	// Partitions returns a run's partitions of one batch step (step ""
	// means of every step), by step and index.
	Partitions(ctx context.Context, runID, step string) ([]Partition, error)
	// ClaimPartition claims one pending or lease-expired running partition
	// of a running run (narrowed by req), raising its fence; ok is false
	// when none is claimable. Concurrent claimers never get one partition
	// both (PostgreSQL: FOR UPDATE SKIP LOCKED).
	ClaimPartition(ctx context.Context, req PartitionClaim) (p Partition, l PartitionLease, ok bool, err error)
	// InPartitionTx runs fn in one write transaction fenced by the
	// partition (see the fence rule above), not by the run: every write of
	// fn's Tx commits only with the partition at w.Lease's fence. PutStep
	// and ResetStep are refused in it.
	InPartitionTx(ctx context.Context, w PartitionWrite, fn func(Tx) error) error
	// HeartbeatPartition extends the partition's lease by leaseFor, or
	// fails with ErrFenced when it was claimed by another since.
	HeartbeatPartition(ctx context.Context, l PartitionLease, now time.Time, leaseFor time.Duration) error
	// EndPartition records the partition's progress and state outside of
	// a chunk (done, failed or released), fenced like InPartitionTx.
	EndPartition(ctx context.Context, w PartitionWrite, p PartitionProgress) error
}

// PartitionFenced is the ErrFenced error a store returns when a write of
// the partition held by l found it as p: claimed since (another fence),
// no longer running, or its run no longer running.
func PartitionFenced(l PartitionLease, p Partition) error {
	switch {
	case p.Fence != l.Fence:
		return fmt.Errorf("%w: partition %d of %s of run %s is at fence %d (held by %s), this holder has fence %d; it writes nothing more",
			ErrFenced, l.Index, l.Step, l.RunID, p.Fence, OwnerName(p.Owner), l.Fence)
	case p.State != PartitionRunning:
		return fmt.Errorf("%w: partition %d of %s of run %s is %s; this holder writes nothing more",
			ErrFenced, l.Index, l.Step, l.RunID, p.State)
	default:
		return fmt.Errorf("%w: run %s is no longer running; partition %d of %s writes nothing more",
			ErrFenced, l.RunID, l.Index, l.Step)
	}
}
