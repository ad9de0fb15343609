package checkpoint

import (
	"context"
	"time"
)

// Page selects one page of a run's rows in key order: those after the
// previous page's last row (AfterStep, AfterKey; both empty for the first
// page), at most Limit of them (0 or less: all).
type Page struct {
	AfterStep string
	AfterKey  string
	Limit     int
}

// Inspector lists what a run recorded across all its batch steps, a page
// at a time, for operators (show).
type Inspector interface {
	// RunItems calls fn for a run's item checkpoints with the given
	// status, of every batch step, in (step, key) order, one page of them.
	RunItems(ctx context.Context, runID, status string, p Page, fn func(Item) error) error
	// RunChunkPlans calls fn for a run's chunk plans of every status, one
	// page of them, by step and, within a step, in the order they were
	// made (effect IDs shortest first, then by text). The page's AfterKey
	// is an effect ID.
	RunChunkPlans(ctx context.Context, runID string, p Page, fn func(ChunkPlan) error) error
	// ChunkPlanCounts counts a run's chunk plans by step and status (the
	// Count of an ItemCount is then a number of plans).
	ChunkPlanCounts(ctx context.Context, runID string) ([]ItemCount, error)
	// StoreNow is the store's clock, for judging times as the store
	// judges leases (a run's staleness, how long ago it was updated):
	// PostgreSQL's now(). It is the zero time when the store keeps times
	// on the caller's clock (SQLite, whose clock is the local one; a
	// PostgreSQL store with Config.CallerClock): the caller uses its own.
	StoreNow(ctx context.Context) (time.Time, error)
	// RunCounts counts the runs f selects (its Job, RunKeyPrefix,
	// CreatedFrom and CreatedBefore; Status, After and Limit are ignored)
	// by job and status in one aggregate query (see RunCount): the
	// gauges an operator alerts on read every run with the zero filter,
	// the dashboard's counts above the runs list read its filters.
	RunCounts(ctx context.Context, f RunFilter, now time.Time) ([]RunCount, error)
}

// Backend is the one typed handle on a store: everything it offers the
// runner, steps, workers, runner/ops and the operator surfaces (the
// Store contract, the operator and inspection methods, the outbox,
// partitions, schedules, idempotency keys, the run queue and its
// maintenance check, the take-over of a gone runner's leases). Both
// stores implement all of it, and each asserts it at compile time:
// var _ checkpoint.Backend = (*Store)(nil). Code
// above checkpoint takes a Backend and never looks for a capability by
// type assertion. Its one optional part is QueueWaker, probed in one
// place: Waker.
type Backend interface {
	Store
	Operator
	Inspector
	OutboxStore
	PartitionStore
	ScheduleStore
	IdempotencyStore
	QueueStore
	MaintenanceChecker
	TakeoverStore
}
