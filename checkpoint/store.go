package checkpoint

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Store is the durable record a runner writes to. Each backend package
// implements it (checkpoint/sqlite), keeps the promises in the package
// documentation (fenced at commit, serialised writes, bytewise keys) and
// passes the same conformance suite.
type Store interface {
	// Claim creates the run if it does not exist, or takes it over if it is
	// not held by a live runner, increments its fence number and records a
	// new attempt. It returns a *LeaseHeldError while another runner holds it.
	Claim(ctx context.Context, req ClaimRequest) (Claim, error)
	// Heartbeat extends the lease until the given time, which must be after
	// now (otherwise it is an error and nothing changes). It returns
	// ErrFenced if the run has been claimed by another runner since, or if
	// the lease has expired (judged as the store judges leases: at now,
	// or by the database's clock): an expired lease is never renewed (see
	// LeaseExpired).
	Heartbeat(ctx context.Context, l Lease, now, until time.Time) error
	// Finish records how the attempt ended, sets the run's status and
	// releases the lease, all checked against the fence.
	Finish(ctx context.Context, l Lease, e Ending) error
	// InTx runs fn in one write transaction, serialised with the run's
	// other writes and claims from its start (SQLite: BEGIN IMMEDIATE).
	// Every write made through the Tx is checked against the lease's
	// fence, and the fence holds until the commit; if fn returns an error
	// or a write is fenced, nothing of it is kept.
	InTx(ctx context.Context, l Lease, fn func(Tx) error) error
	// Steps calls fn for each checkpoint of the run, in the order the steps
	// started, with one query.
	Steps(ctx context.Context, runID string, fn func(Step) error) error
	// Items calls fn for the item checkpoints of one batch step that q
	// selects, in key order, with one query.
	Items(ctx context.Context, q ItemQuery, fn func(Item) error) error
	// ChunkPlans returns a batch step's chunk plans that are recorded but
	// not yet known to be applied.
	ChunkPlans(ctx context.Context, runID, step string) ([]ChunkPlan, error)
	// ItemCounts counts a run's item checkpoints by step and status.
	ItemCounts(ctx context.Context, runID string) ([]ItemCount, error)
	// ItemChanges returns the changes to a batch step's source that reruns
	// refused or operators accepted, in key order.
	ItemChanges(ctx context.Context, runID, step string) ([]ItemChange, error)
	// Fence returns the run's current fence number, for a runner to check
	// it still holds the run before writing somewhere the store cannot
	// fence (a separate effect target).
	Fence(ctx context.Context, runID string) (int64, error)
	// Runs lists runs, newest first.
	Runs(ctx context.Context, f RunFilter) ([]Run, error)
	// Run returns one run and its attempts; ErrNotFound if there is none.
	Run(ctx context.Context, runID string) (RunInfo, error)
	// OpenTarget opens an effect target table: in the store's own database
	// (effects then commit through Tx.Target in the checkpoint's
	// transaction) or in a separate database the store's backend can open,
	// with the store's own settings. Which one is decided by database
	// identity. The caller closes it.
	OpenTarget(ctx context.Context, spec TargetSpec) (EffectTarget, error)
	// Close releases the database.
	Close() error
}

// Tx is the view of one write transaction opened by Store.InTx.
type Tx interface {
	// PutStep records a step checkpoint, checked against the fence. A step
	// already recorded as completed or rejected with the same content is
	// accepted (our own earlier commit); different content is a
	// *StepConflictError.
	PutStep(s Step) error
	// ResetStep deletes a step's checkpoint (not its items), so the step
	// runs again: a batch step reopened to retry its skipped items.
	ResetStep(id string) error
	// PutItems records item checkpoints of batch steps, checked against the
	// fence once per transaction. Finished (completed, rejected) items are
	// never overwritten.
	PutItems(items []Item) error
	// AcceptItemChanges records an operator's acceptance of batch items
	// whose source changed since they were processed: each recorded item's
	// fingerprint becomes the one given (nothing else of it changes: its
	// outcome and effects stand), each change is recorded accepted by
	// a.Operator, and a is stored in the run's audit log. items may be
	// empty when nothing recorded changes (an item gone from the source,
	// extra items to process). An item not recorded is ErrNotFound.
	AcceptItemChanges(a Audit, items []Item, changes []ItemChange) error
	// RefuseItemChanges records the changes a rerun refused, and named to
	// the operator, in place of the step's earlier refused ones: the
	// changes an acceptance may accept.
	RefuseItemChanges(step string, at time.Time, changes []ItemChange) error
	// PutNewItems records items known to be new (none of them recorded
	// yet) more cheaply than PutItems may, which must look for a recorded
	// item under each key (on PostgreSQL an upsert: a conflict check per
	// row). A batch step's attempt that found none of its items recorded,
	// its keys ascending, knows every item of its chunks is new. It is
	// checked against the fence as PutItems is. It may skip looking for
	// recorded items; one recorded after all is never overwritten if it
	// is finished (the transaction fails with ErrItemFinished, as from
	// PutItems), and an unfinished one either fails the transaction or is
	// overwritten as PutItems would. An item given twice fails it. A
	// backend without a cheaper way records them as PutItems does.
	PutNewItems(items []Item) error
	// PutChunkPlan records a chunk's effect plan: planned (separate store,
	// before it applies) or applied (same store, in the transaction that
	// applies it).
	PutChunkPlan(p ChunkPlan) error
	// FinishChunk marks a chunk plan applied and its planned items
	// completed.
	FinishChunk(step, effectID string) error
	// Enqueue queues an outbox message with the transaction's checkpoint.
	Enqueue(m Message) error
	// Target is the view of a table of the checkpoint database in this
	// transaction, for same-store effects: its writes commit or roll back
	// with the checkpoint. A table opened with Store.OpenTarget is served
	// from prepared statements.
	Target(t Table) (Target, error)
}

// Run statuses.
const (
	RunRunning     = "running"
	RunSucceeded   = "succeeded"
	RunFailed      = "failed"
	RunInterrupted = "interrupted"
	RunAbandoned   = "abandoned"
)

// AttemptLost is the status given to an attempt whose runner died without
// recording its end; the next claim sets it.
const AttemptLost = "lost"

// Step statuses.
const (
	// StepCompleted: the step's function returned and its output is recorded.
	StepCompleted = "completed"
	// StepRejected: the step ended in a pinned business rejection; a rerun
	// returns the same rejection.
	StepRejected = "rejected"
	// StepFailed: the step's last try failed; a rerun runs it again.
	StepFailed = "failed"
	// StepPlanned: the step's effects on a separate store are planned and
	// recorded, not yet known to be applied. A rerun finishes the plan.
	StepPlanned = "planned"
	// StepCalling: an outside call's intent is recorded and its result
	// is not: its outcome is unknown until reconciled or resolved.
	StepCalling = "calling"
	// StepRunning: a batch step has started and its items are being
	// checkpointed; its output holds the item total when known.
	StepRunning = "running"
)

// ClaimRequest says who claims which run, with which parameters.
type ClaimRequest struct {
	RunID      string
	Job        string
	RunKey     string
	Params     []byte // canonical JSON
	ParamsHash string
	Owner      string // the claiming runner, "HOST:PID" plus details (see OwnerName)
	Now        time.Time
	LeaseFor   time.Duration
	// Force claims a succeeded or abandoned run again.
	Force bool
	// CreateOnly claims the run only if this claim creates it: an
	// existing run, whatever its state, is refused with a
	// *RunExistsError (or a *ParamsMismatchError for other parameters)
	// and nothing changes. An API start that must answer "created" or
	// "existed" exactly, and never resume a run, claims so.
	CreateOnly bool
	// Limit is the concurrency limit the run counts against: the claim is
	// refused with a *LimitReachedError when Limit.Max other runs under
	// Limit.Key hold live leases. The zero Limit is none.
	Limit Limit
	// OwnerGone reports whether the runner named by a lease owner is known
	// to be dead (its process is surely gone); its lease is then taken over
	// at once instead of waiting for it to expire. Nil means never.
	OwnerGone func(owner string) bool
	// Audits are operators' records of this claim (a resume or a rerun
	// they asked for: who, why), each of RunID. They are written in the
	// claim's transaction, after the run is taken, so a record and its
	// claim commit together, before any step runs: one that cannot be
	// written (Audit.Check refuses it, or the database does) fails the
	// claim, and nothing of it is kept (no fence raised, no attempt).
	Audits []Audit
}

// LeaseExpired is the ErrFenced error Heartbeat returns for a lease that
// is still the run's (its fence) but expired at until, judged at now. It
// is not renewed: once a lease expired, another runner may claim the run,
// or take the slot it held under a concurrency limit (a limit counts live
// leases only), at any moment; renewing it would let a paused runner come
// back past a limit another run now holds. The attempt stops; the run
// resumes when claimed again.
func LeaseExpired(l Lease, until, now time.Time) error {
	return fmt.Errorf("%w: the lease of run %s, attempt %d (fence %d), expired at %s (judged at %s); an expired lease is not renewed, "+
		"so this attempt stops and the run resumes when claimed again",
		ErrFenced, l.RunID, l.Attempt, l.Fence, until.UTC().Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano))
}

// OwnerName is the part of an owner string shown to operators: owners are
// "NAME" or "NAME DETAILS" (a runner records "HOST:PID" and then the
// kernel boot and PID namespace its PID belongs to), and messages name
// only NAME.
func OwnerName(owner string) string {
	name, _, _ := strings.Cut(owner, " ")
	return name
}

// Claim is the result of a successful Store.Claim.
type Claim struct {
	Lease Lease
	Run   Run
	// Created is true when this claim created the run.
	Created bool
	// PreviousStatus is the run's status before this claim (empty when
	// Created).
	PreviousStatus string
	// TookOverFrom names the owner whose unfinished attempt this claim
	// replaced (a crashed or stale runner), if any.
	TookOverFrom string
	// PreviousLeaseUntil is when the lease this claim took over would have
	// expired (zero when it took over none). It is in the future when the
	// old owner was found gone: an outside call that owner sent may still
	// land until then, so a call it left in flight is reconciled only
	// after it.
	PreviousLeaseUntil time.Time
}

// Lease identifies one attempt's right to write to a run. Writes carrying an
// older fence than the run's are refused with ErrFenced.
type Lease struct {
	RunID   string
	Fence   int64
	Attempt int
	Owner   string
}

// Ending says how an attempt ended.
type Ending struct {
	Status string // one of the Run* statuses
	Error  string
	At     time.Time
	// RetryAfter, when positive, makes a queued run ended interrupted
	// claimable by ClaimNext only that long after its end, on the store's
	// clock (the pool trying a run again after a store fault, with
	// backoff). Zero leaves it claimable at once.
	RetryAfter time.Duration
}

// Run is one row of the runs table.
type Run struct {
	ID         string
	Job        string
	RunKey     string
	Params     []byte
	ParamsHash string
	Status     string
	Fence      int64
	LeaseOwner string
	LeaseUntil time.Time // zero when no lease is held
	Error      string
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt time.Time // zero while unfinished
	PrunedAt   time.Time // set when prune removed its checkpoints
	// Queue is the queue the run was enqueued in; empty for a run never
	// enqueued (started by Claim), which ClaimNext never takes.
	Queue string
	// Priority orders the queue: higher first.
	Priority int
	// AvailableAt is when a queued run may be claimed (zero when never
	// enqueued).
	AvailableAt time.Time
	// Limit is the concurrency limit recorded with the run (the zero Limit
	// when none).
	Limit Limit
}

// Stale reports whether the run is marked running but its lease expired: its
// runner died or lost contact, and the next claim takes it over.
func (r Run) Stale(now time.Time) bool {
	return r.Status == RunRunning && !r.LeaseUntil.IsZero() && !now.Before(r.LeaseUntil)
}

// Attempt is one runner's pass over a run.
type Attempt struct {
	RunID      string
	Number     int
	Fence      int64
	Owner      string
	Status     string
	Error      string
	StartedAt  time.Time
	FinishedAt time.Time
}

// RunInfo is a run with its attempts, oldest first.
type RunInfo struct {
	Run      Run
	Attempts []Attempt
}

// RunFilter narrows Store.Runs; empty fields match everything.
type RunFilter struct {
	Job    string
	Status string
	Limit  int // 0 (or less) means 100
	// RunKeyPrefix keeps the runs whose run key starts with it (bytewise).
	RunKeyPrefix string
	// CreatedFrom and CreatedBefore keep the runs created at or after
	// CreatedFrom and before CreatedBefore (zero: unbounded).
	CreatedFrom, CreatedBefore time.Time
	// After, when set, is the last run of the previous page: the runs
	// listed are those after it in the listing's order (newest first, then
	// by ID).
	After *RunCursor
}

// RunCursor is a position in Store.Runs' order: a run's creation time and
// ID.
type RunCursor struct {
	CreatedAt time.Time
	ID        string
}

// PageLimit is how many runs f asks for: Limit, or 100 when it is not
// positive.
func (f RunFilter) PageLimit() int {
	if f.Limit <= 0 {
		return 100
	}
	return f.Limit
}

// Step is one step checkpoint.
type Step struct {
	RunID      string
	ID         string
	Status     string
	Output     []byte
	InputHash  string
	Error      string
	Tries      int
	Attempt    int
	StartedAt  time.Time
	FinishedAt time.Time
	// Plan is the step's effect plan (JSON), if it has effects.
	Plan []byte
	// Call is an outside call's record (JSON of a CallRecord), written
	// with its intent; nil for other steps.
	Call []byte
}

// Validate checks a claim request as every store does before touching the
// database: a run ID, an owner and a positive lease, and Now unless the
// store judges leases by its own clock (needNow false: a server's now()).
func (r ClaimRequest) Validate(needNow bool) error {
	if r.RunID == "" || r.Owner == "" || r.LeaseFor <= 0 || (needNow && r.Now.IsZero()) {
		return fmt.Errorf("checkpoint: a claim needs a RunID, an Owner, a positive LeaseFor and, on the caller's clock, Now (got %q, %q, %s, %v)",
			r.RunID, r.Owner, r.LeaseFor, r.Now)
	}
	for _, a := range r.Audits {
		if a.RunID != r.RunID {
			return fmt.Errorf("checkpoint: a claim of run %s carries an audit record of run %q (%s); a claim records only its own run's", r.RunID, a.RunID, a.Command)
		}
	}
	return r.Limit.validate()
}
