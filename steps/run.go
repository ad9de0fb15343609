package steps

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/steps/internal/partition"
)

// Config says which run an attempt works on. The runner fills it in after
// claiming the run.
type Config struct {
	// Store holds the run's checkpoints. Required.
	Store checkpoint.Backend
	// Lease is the claimed attempt's lease; every checkpoint write carries
	// its fence. Required.
	Lease checkpoint.Lease
	// Logger receives step logs. Defaults to zerolog.Nop().
	Logger *zerolog.Logger
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// DryRun runs steps without writing anything: effects are planned
	// against current values and collected (see Run.DryPlans), outputs
	// are not checkpointed. Completed steps still return their recorded
	// outputs.
	DryRun bool
	// RetrySkipped makes batch steps process again the items an earlier
	// attempt skipped under SkipFailures.
	RetrySkipped bool
	// AcceptChanged, if set, lets batch steps go on past the items whose
	// source changed that the most recent refusal named (see
	// ItemChangedError and Acceptance), recording each acceptance in the
	// run's audit log under its operator and reason; any other change is
	// refused in its turn. Nil refuses them. Its Operator must be set.
	AcceptChanged *Acceptance
	// OnProgress, if set, is called by batch steps after each chunk.
	OnProgress func(Progress)
	// ProgressEvery is how often the run's owner sums a partitioned batch
	// step's progress over its partitions for OnProgress (chunks that
	// other workers commit report to nobody here): set it to what the
	// hook needs, the log's interval, say. Zero or less means
	// DefaultProgressEvery.
	ProgressEvery time.Duration
	// Retry is the retry policy of steps that set none. Defaults to no
	// retries.
	Retry RetryPolicy
	// Sleep waits between retries. Defaults to a real timer; tests inject
	// their clock's.
	Sleep func(ctx context.Context, d time.Duration) error
	// LeaseFor is the lease's length: how long a heartbeat extends it. An
	// outside call (Call) renews the lease right before calling, which
	// also checks the fence, and its context ends CallMargin before the
	// renewed lease would. Zero (a caller without heartbeats) renews
	// nothing: each call checks the fence and that the lease is still
	// live, refusing it with ErrLeaseExpired otherwise, and ends
	// CallMargin before the lease does. The runner sets it.
	LeaseFor time.Duration
	// CallMargin is how long before the lease's end an outside call's
	// context ends, and how long Call waits after a call whose outcome is
	// unknown before reconciling it: it covers clock skew between runners
	// and a request still on its way. Defaults to a fifth of LeaseFor.
	CallMargin time.Duration
	// PreviousLeaseUntil is when the lease of the attempt this one took
	// over would have expired (checkpoint.Claim.PreviousLeaseUntil). An
	// outside call that attempt left in flight is reconciled only after
	// it, so a request it sent has landed, or never will, before anyone
	// looks.
	PreviousLeaseUntil time.Time
	// Unclaimed says the run was never claimed before this attempt (its
	// claim found it queued, checkpoint.RunQueued): no attempt can have
	// recorded a step of it, so Begin reads no checkpoints. The runner
	// sets it from the claim.
	Unclaimed bool
	// Tracer makes the spans of the attempt's steps and batch chunks, each
	// the child of the span in the context the step is called with (the
	// runner's attempt span), and the parent of what the step's function
	// traces: its context carries the step's span. Defaults to the global
	// OpenTelemetry provider's tracer, a no-op unless the program set one.
	Tracer trace.Tracer
	// OnStepEnd, if set, is called as each step returns, replayed ones
	// included (the runner's duration histograms).
	OnStepEnd func(StepEnd)
	// Write, if set, makes each of the run's own writes: a transaction
	// fenced by the run's lease (a step's checkpoint, a batch chunk) and
	// the lease renewal before an outside call. It calls write at least
	// once and returns what its last call returned; what says what the
	// write is for, in its logs. The runner's lock waiting
	// (runner.Config.Wait) is one: it calls write again while it fails
	// with checkpoint.ErrLocked, which is safe because a store keeps
	// nothing of a write that failed. Nil calls write once.
	Write func(ctx context.Context, what string, write func() error) error
	// Partition, when set, makes this attempt a partition worker's replay
	// (see Partitions): it holds that partition of a running run, not the
	// run's lease. Every step before the partitioned batch step must be
	// recorded (it returns its recorded output; one that is not recorded,
	// or changed, stops the job with a *StepNotRecordedError or
	// *StepChangedError); at that batch step only the partition is
	// processed, and the step returns ErrPartitionWorked, which stops the
	// job function there.
	Partition *checkpoint.PartitionLease
	// PartitionClaimedAt is the time read just before Partition's claim
	// was sent: its lease lasts at least until then plus LeaseFor, which
	// the partition's self-fencing counts from. Zero means Begin's time.
	PartitionClaimedAt time.Time
	// OwnerGone reports whether the runner named by a partition's owner is
	// known to be dead, so the run's owner takes its partitions over at
	// once instead of waiting for their leases (checkpoint.ClaimRequest
	// has the same). Nil means never.
	OwnerGone func(owner string) bool
	// PartitionSlots is how many partitions of a partitioned batch step
	// the run's own attempt works at once, on goroutines; the rest wait
	// for a partition worker (runner.WorkPartition, `stepwise worker`) or
	// for one of those goroutines to be free. Zero means every partition
	// at once (a lone `stepwise run`); a worker sets 1, so a run it drives
	// takes one of its slots and its other slots, and other workers,
	// take the other partitions.
	PartitionSlots int
	// SelfFenceMargin is how long before a held partition's lease expires
	// its holder stops if no renewal succeeded since (the database
	// unreachable, the process paused): it cancels the partition's work
	// with a *PartitionLeaseLostError, calling no outside system after it,
	// before another runner may claim the partition. Defaults to a third
	// of LeaseFor (or of the 30s partition lease without it); at most
	// half of it.
	SelfFenceMargin time.Duration
}

// Run is one attempt's view of a run, passed to job code. It is safe for use
// by several goroutines.
type Run struct {
	// What the attempt's Config set, shared with the views of it that
	// work one partition each (partitionView).
	runSettings
	lease checkpoint.Lease
	log   zerolog.Logger

	mu       sync.Mutex
	seen     map[string]struct{} // step IDs used by this attempt
	stats    Stats
	targets  map[string]*openTarget
	progress func(Progress)
	// progressEvery is Config.ProgressEvery, defaulted.
	progressEvery time.Duration

	dryState map[string]checkpoint.State // values planned by earlier dry-run steps
	dryPlans []DryPlan

	// Partitions (partition.go), the attempt's own.
	worker    *checkpoint.PartitionLease // Config.Partition
	ownerGone func(string) bool
	partSlots int // Config.PartitionSlots
	// workerClaimedAt is Config.PartitionClaimedAt.
	workerClaimedAt time.Time
	// part, in a view of the run that works one partition (the
	// coordinator's goroutines and workers), fences its writes by the
	// partition; parent is the attempt's own Run, which counts.
	part   *partition.Hold
	parent *Run
}

// runSettings is what an attempt's Config set that every view of the run
// works with alike: set once by Begin, never changed after.
type runSettings struct {
	store    checkpoint.Backend
	now      func() time.Time
	recorded map[string]checkpoint.Step // checkpoints loaded at Begin
	dryRun   bool

	retrySkipped bool
	accept       *Acceptance
	retry        RetryPolicy
	sleepFn      func(context.Context, time.Duration) error

	leaseFor   time.Duration
	callMargin time.Duration
	prevUntil  time.Time
	fenceAhead time.Duration // Config.SelfFenceMargin

	tracer    trace.Tracer
	onStepEnd func(StepEnd)
	writeHook func(ctx context.Context, what string, write func() error) error
}

// Stats counts what an attempt did with its steps.
type Stats struct {
	Executed int // steps whose function ran and completed
	Skipped  int // steps returned from their checkpoint
	Failed   int // steps whose function returned an error
	// Effects counts compare-and-set writes applied (a batch chunk writes
	// each touched key once).
	Effects int
	// Conflicts counts compare-and-set writes that found another writer's
	// version; each led to a re-plan or, past MaxReplans, an error.
	Conflicts int
	// Replans counts plans made again after a conflict, or from a recorded
	// plan that had gone stale.
	Replans int
	// Accepted counts batch items whose source changed that went on under
	// Config.AcceptChanged.
	Accepted int
}

// Begin starts an attempt's view of the run: it loads every checkpoint of
// the run with one query, so skipping completed steps needs no further reads.
func Begin(ctx context.Context, cfg Config) (*Run, error) {
	if cfg.Store == nil {
		return nil, errors.New("steps: Config.Store is nil")
	}
	if cfg.Lease.RunID == "" {
		return nil, errors.New("steps: Config.Lease has no run ID; claim the run first")
	}
	if a := cfg.AcceptChanged; a != nil && (strings.TrimSpace(a.Operator) == "" || strings.TrimSpace(a.Reason) == "") {
		return nil, fmt.Errorf("%w: Config.AcceptChanged has operator %q and reason %q; an acceptance is audited and needs both",
			ErrNoOperator, a.Operator, a.Reason)
	}
	r := &Run{
		runSettings: runSettings{
			store:        cfg.Store,
			now:          cfg.Now,
			recorded:     make(map[string]checkpoint.Step),
			dryRun:       cfg.DryRun,
			retrySkipped: cfg.RetrySkipped,
			accept:       cfg.AcceptChanged,
			retry:        cfg.Retry,
			sleepFn:      cfg.Sleep,
			leaseFor:     cfg.LeaseFor,
			callMargin:   cfg.CallMargin,
			prevUntil:    cfg.PreviousLeaseUntil,
			fenceAhead:   cfg.SelfFenceMargin,
			tracer:       cfg.Tracer,
			onStepEnd:    cfg.OnStepEnd,
			writeHook:    cfg.Write,
		},
		lease:         cfg.Lease,
		log:           zerolog.Nop(),
		seen:          make(map[string]struct{}),
		progress:      cfg.OnProgress,
		progressEvery: cfg.ProgressEvery,
		dryState:      make(map[string]checkpoint.State),
		worker:        cfg.Partition,
		ownerGone:     cfg.OwnerGone,
		partSlots:     cfg.PartitionSlots,
	}
	if r.tracer == nil {
		r.tracer = defaultTracer()
	}
	if r.progressEvery <= 0 {
		r.progressEvery = DefaultProgressEvery
	}
	if cfg.LeaseFor < 0 || cfg.CallMargin < 0 || cfg.PartitionSlots < 0 || cfg.SelfFenceMargin < 0 {
		return nil, fmt.Errorf("steps: Config.LeaseFor (%s), CallMargin (%s), PartitionSlots (%d) and SelfFenceMargin (%s) cannot be negative",
			cfg.LeaseFor, cfg.CallMargin, cfg.PartitionSlots, cfg.SelfFenceMargin)
	}
	if r.fenceAhead == 0 {
		r.fenceAhead = r.partitionLease() / 3
	}
	if r.fenceAhead > r.partitionLease()/2 {
		return nil, fmt.Errorf("steps: Config.SelfFenceMargin is %s; use at most half of the %s lease, leaving time to retry a failed renewal",
			cfg.SelfFenceMargin, r.partitionLease())
	}
	if r.callMargin == 0 {
		r.callMargin = cfg.LeaseFor / 5
	}
	if cfg.LeaseFor > 0 && r.callMargin >= cfg.LeaseFor {
		return nil, fmt.Errorf("steps: Config.CallMargin (%s) leaves no time for an outside call in a %s lease; make it shorter than LeaseFor",
			cfg.CallMargin, cfg.LeaseFor)
	}
	if cfg.Logger != nil {
		r.log = cfg.Logger.With().Str(FieldRunID, cfg.Lease.RunID).Int(FieldAttempt, cfg.Lease.Attempt).Logger()
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.workerClaimedAt = cfg.PartitionClaimedAt; r.workerClaimedAt.IsZero() {
		r.workerClaimedAt = r.now()
	}
	if err := cfg.Retry.Validate(); err != nil {
		return nil, err
	}
	if cfg.Unclaimed {
		return r, nil
	}
	err := cfg.Store.Steps(ctx, cfg.Lease.RunID, func(s checkpoint.Step) error {
		r.recorded[s.ID] = s
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("steps: load checkpoints of %s: %w", cfg.Lease.RunID, err)
	}
	return r, nil
}

// ID returns the run's ID, e.g. "report/2026-11-28".
func (r *Run) ID() string { return r.lease.RunID }

// Attempt returns this attempt's number (1 for the first).
func (r *Run) Attempt() int { return r.lease.Attempt }

// Logger returns the run's logger, with run_id and attempt fields set.
func (r *Run) Logger() *zerolog.Logger { return &r.log }

// Stats returns what this attempt has done so far.
func (r *Run) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// sleep waits d or until ctx is done, through Config.Sleep if set.
func (r *Run) sleep(ctx context.Context, d time.Duration) error {
	if r.sleepFn != nil {
		return r.sleepFn(ctx, d)
	}
	return Sleep(ctx, d)
}

// Sleep waits d with a real timer, or until ctx is done (then it returns
// the context's cause). It is the default wait between retries.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// DryPlans returns what a dry run would have applied, step by step.
func (r *Run) DryPlans() []DryPlan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]DryPlan(nil), r.dryPlans...)
}

// use marks id as used by this attempt and returns its recorded checkpoint.
func (r *Run) use(id string) (checkpoint.Step, bool, error) {
	if err := ValidateID(id); err != nil {
		return checkpoint.Step{}, false, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.seen[id]; dup {
		return checkpoint.Step{}, false, fmt.Errorf("%w: %q in run %s; give each step a distinct name or business key",
			ErrDuplicateStep, id, r.lease.RunID)
	}
	r.seen[id] = struct{}{}
	rec, ok := r.recorded[id]
	return rec, ok, nil
}

func (r *Run) count(f func(*Stats)) {
	if r.parent != nil {
		r.parent.count(f)
		return
	}
	r.mu.Lock()
	f(&r.stats)
	r.mu.Unlock()
}

// inTx runs fn in one write transaction: fenced by the run's lease, or in
// a partition's view by the partition (recording its progress with it,
// and extending its lease).
func (r *Run) inTx(ctx context.Context, fn func(checkpoint.Tx) error) error {
	if h := r.part; h != nil {
		return h.InTx(ctx, r.now(), fn)
	}
	return r.runTx(ctx, fn)
}

// runTx runs fn in one write transaction fenced by the run's lease,
// through the Config.Write hook.
func (r *Run) runTx(ctx context.Context, fn func(checkpoint.Tx) error) error {
	return r.write(ctx, "write", func() error { return r.store.InTx(ctx, r.lease, fn) })
}

// write makes one of the run's writes through the Config.Write hook.
func (r *Run) write(ctx context.Context, what string, write func() error) error {
	if r.writeHook == nil {
		return write()
	}
	return r.writeHook(ctx, what, write)
}
