package checkpoint

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// RunQueued is the status of a run enqueued for a worker and not yet
// claimed (QueueStore).
const RunQueued = "queued"

// DefaultQueue is the queue a run is enqueued in when none is named.
const DefaultQueue = "default"

// Limit is a concurrency limit a run counts against: at most Max runs
// recorded with the same Key hold a live lease at once, whichever path
// started them (Claim or ClaimNext), on every host using the store. The
// zero Limit is none.
type Limit struct {
	// Key names what is limited: a job ("job:settle") or a resource a job
	// names from its parameters ("settle:ledger=/data/ledger.db").
	Key string
	// Max is how many runs with Key may hold a live lease at once; at least
	// 1 when Key is set.
	Max int
}

// IsZero reports whether l limits nothing.
func (l Limit) IsZero() bool { return l.Key == "" }

// validate checks a limit as the stores need it.
func (l Limit) validate() error {
	if l.Key == "" && l.Max == 0 {
		return nil
	}
	if l.Key == "" || l.Max < 1 {
		return fmt.Errorf("checkpoint: a limit needs a key and a Max of at least 1 (got %q, %d)", l.Key, l.Max)
	}
	return nil
}

// LimitReachedError is returned by Claim when starting the run would make
// more runs hold a live lease under a limit than it allows. Nothing was
// written: the run stays as it was (queued, failed, not yet created).
type LimitReachedError struct {
	RunID string
	Limit Limit
	// Holders are the runs holding the limit now (live leases), by ID.
	Holders []string
}

func (e *LimitReachedError) Error() string {
	verb := "hold"
	if len(e.Holders) == 1 {
		verb = "holds"
	}
	return fmt.Sprintf("run %s cannot start: limit %q allows %d at once and %s (%s) %s it",
		e.RunID, e.Limit.Key, e.Limit.Max, plural(len(e.Holders), "run"), strings.Join(e.Holders, ", "), verb)
}

func plural(n int, what string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", what)
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// EnqueueRequest asks for a run to be queued for a worker.
type EnqueueRequest struct {
	RunID      string
	Job        string
	RunKey     string
	Params     []byte // canonical JSON
	ParamsHash string
	// Queue is the queue's name; empty means DefaultQueue.
	Queue string
	// Priority orders the queue: higher first, then older first.
	Priority int
	// NotBefore is the earliest time a worker may claim the run; zero
	// means at once.
	NotBefore time.Time
	// Now is the enqueue time, on the caller's clock (a store that keeps
	// leases on its own clock uses its own, as for Claim).
	Now time.Time
	// Limit is the concurrency limit the run counts against once started.
	Limit Limit
}

// Validate checks an enqueue request as every store does before touching
// the database; needNow as for ClaimRequest.Validate.
func (r EnqueueRequest) Validate(needNow bool) error {
	if r.RunID == "" || r.Job == "" || (needNow && r.Now.IsZero()) {
		return fmt.Errorf("checkpoint: an enqueue needs a RunID, a Job and, on the caller's clock, Now (got %q, %q, %v)",
			r.RunID, r.Job, r.Now)
	}
	return r.Limit.validate()
}

// QueueName is the queue r names: Queue, or DefaultQueue when empty.
func (r EnqueueRequest) QueueName() string {
	if r.Queue == "" {
		return DefaultQueue
	}
	return r.Queue
}

// EnqueueResult says what Enqueue did.
type EnqueueResult struct {
	// Run is the run as recorded after the enqueue.
	Run Run
	// Created is true when the run was queued now; false when its run key
	// existed already (with the same parameters), which left it as it was.
	Created bool
}

// ClaimNextRequest asks a QueueStore for the next run to work on.
type ClaimNextRequest struct {
	// Queues restricts the claim to runs of these queues; empty means any
	// queue.
	Queues []string
	// Jobs restricts the claim to runs of these jobs (those the worker can
	// run); empty means any job.
	Jobs     []string
	Owner    string
	Now      time.Time
	LeaseFor time.Duration
	// Max is how many runs ClaimBatch and FinishAndClaim claim at most;
	// 0 means 1. ClaimNext claims one whatever it says.
	Max int
}

// Validate checks a ClaimNext request as every store does; needNow as for
// ClaimRequest.Validate.
func (r ClaimNextRequest) Validate(needNow bool) error {
	if r.Owner == "" || r.LeaseFor <= 0 || (needNow && r.Now.IsZero()) {
		return fmt.Errorf("checkpoint: a ClaimNext needs an Owner, a positive LeaseFor and, on the caller's clock, Now (got %q, %s, %v)",
			r.Owner, r.LeaseFor, r.Now)
	}
	if r.Max < 0 || r.Max > MaxClaimBatch {
		return fmt.Errorf("checkpoint: a claim takes 0 to %d runs at once (got Max %d)", MaxClaimBatch, r.Max)
	}
	return nil
}

// QueueStore is a store whose runs can be queued for a pool of workers.
type QueueStore interface {
	// Enqueue records a run as queued. A run key that exists already
	// with the same parameters is left as it is (EnqueueResult.Created
	// false, Run its current state); with other parameters it is refused
	// with a *ParamsMismatchError, and a pruned one with ErrPruned, as
	// Claim refuses them.
	Enqueue(ctx context.Context, req EnqueueRequest) (EnqueueResult, error)
	// ClaimNext claims one run of req's queues and jobs that is due: a
	// queued or interrupted run of a queue whose NotBefore has passed, or
	// a queued run left running by a runner whose lease expired; highest
	// priority first, then oldest. It raises the run's fence, marks an
	// unfinished attempt lost and records a new attempt, as Claim does.
	// A run whose limit is full is left queued and the next one is tried.
	// ok is false when no run is due (or every due run is being claimed by
	// someone else at that moment).
	ClaimNext(ctx context.Context, req ClaimNextRequest) (c Claim, ok bool, err error)
	// ClaimBatch claims up to req.Max runs (at least one) as ClaimNext
	// claims one, in claim order: each gets its own raised fence, lease
	// and attempt record, exactly as if claimed alone, and the runs
	// without a limit are taken in one statement and one commit. It
	// returns none when no run is due; a slot's worth of runs each when
	// that many are.
	ClaimBatch(ctx context.Context, req ClaimNextRequest) ([]Claim, error)
	// FinishAndClaim records the ends of several attempts, each as
	// Store.Finish does, and, in the same transaction (one commit),
	// claims up to next.Max runs as ClaimBatch does: a worker's slots
	// hand their runs back and take the next ones in one round trip.
	// results[i] is ends[i]'s outcome: nil when recorded, an error
	// wrapping ErrFenced when the run is at another fence (nothing of it
	// written; the other ends and the claims are not affected). An err
	// leaves every end unknown, as for Finish: finish them again (Finish
	// is idempotent for its lease).
	FinishAndClaim(ctx context.Context, ends []Finished, next ClaimNextRequest) (claims []Claim, results []error, err error)
}

// Finished is one attempt's end, as FinishAndClaim records it.
type Finished struct {
	Lease  Lease
	Ending Ending
}

// MaxClaimBatch is the most runs one ClaimBatch or FinishAndClaim takes.
const MaxClaimBatch = 1000

// QueueWaker is a QueueStore that can tell a worker at once when runs are
// enqueued (PostgreSQL's LISTEN/NOTIFY). It is the one optional
// capability of a Backend (SQLite has no way to wake another process):
// it is probed only by Waker, and workers of a store without it only
// poll.
type QueueWaker interface {
	// WakeOnEnqueue returns a channel that receives a value soon after
	// any Enqueue commits, in any process (several enqueues may share one
	// value), soon after partitions of a batch step become claimable
	// (recorded, reopened or released: PartitionStore), and after a lost
	// connection is reestablished (wake-ups may have been missed). It listens on a connection of its own until ctx
	// ends, then closes the channel.
	WakeOnEnqueue(ctx context.Context) (<-chan struct{}, error)
}

// MayEnqueue applies the rules every store shares to an enqueue of a run
// that exists: a pruned run is refused (ErrPruned) and other parameters
// are a *ParamsMismatchError, as Claim refuses them; anything else leaves
// the run as it is.
func MayEnqueue(run Run, req EnqueueRequest) error {
	if !run.PrunedAt.IsZero() {
		return fmt.Errorf("%w: %s was pruned at %s; its checkpoints are gone, so running it again "+
			"would redo its effects; pick another run key", ErrPruned, run.ID, run.PrunedAt.Format(time.RFC3339))
	}
	if run.ParamsHash != req.ParamsHash {
		return &ParamsMismatchError{RunID: run.ID, Stored: string(run.Params), Given: string(req.Params)}
	}
	return nil
}

// Waker returns b's QueueWaker, if it has one (see QueueWaker). It is the
// one place the optional capability is looked for.
func Waker(b Backend) (QueueWaker, bool) {
	qw, ok := b.(QueueWaker)
	return qw, ok
}

// MaintenanceChecker is a Store that can tell when its database's
// housekeeping is switched off in a way a queue in service suffers from
// (PostgreSQL without autovacuum: dead rows and stale statistics pile up
// as runs are claimed and finished, and claims slow down as the tables
// grow). Workers log what it finds when they start. Every Backend has it;
// one whose database needs no such housekeeping (SQLite) finds nothing.
type MaintenanceChecker interface {
	// MaintenanceWarnings returns one sentence per problem found, each
	// naming what is off, the tables it affects and what to do; none when
	// all is well.
	MaintenanceWarnings(ctx context.Context) ([]string, error)
}
