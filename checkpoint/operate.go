package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Audit is one manual operation on a run: who, when, what and why.
type Audit struct {
	RunID    string    `json:"run_id"`
	At       time.Time `json:"at"`
	Operator string    `json:"operator"`
	Command  string    `json:"command"`
	Reason   string    `json:"reason"`
	Details  string    `json:"details,omitempty"`
}

// ErrBadAudit is returned (wrapped, naming the field) when an audit
// record holds text no store keeps: a NUL or bytes that are not UTF-8
// (PostgreSQL keeps neither in text, so no store does). The operation it
// records is refused with it.
var ErrBadAudit = errors.New("checkpoint: the audit record cannot be kept")

// Check returns an error wrapping ErrBadAudit if a cannot be stored. A
// store checks each record in the transaction that writes it, so a record
// refused there undoes the operation with it. Operator layers refuse such
// text earlier, when they read a request.
func (a Audit) Check() error {
	for _, f := range []struct{ name, value string }{
		{"run_id", a.RunID}, {"operator", a.Operator}, {"command", a.Command}, {"reason", a.Reason}, {"details", a.Details},
	} {
		switch {
		case !utf8.ValidString(f.value):
			return fmt.Errorf("%w: its %s is not valid UTF-8", ErrBadAudit, f.name)
		case strings.IndexByte(f.value, 0) >= 0:
			return fmt.Errorf("%w: its %s holds a NUL character", ErrBadAudit, f.name)
		}
	}
	return nil
}

// OperateOption changes how a manual operation (Recover, Abandon,
// ResetSteps, ResolveStep) judges the runner holding the run.
type OperateOption func(*OperateOptions)

// OperateOptions are a manual operation's options, gathered by
// NewOperateOptions for a store to read.
type OperateOptions struct {
	// OwnerGone reports whether a lease's owner is known to be dead (see
	// WithOwnerGone); nil means never.
	OwnerGone func(owner string) bool
	// Replace lets ResolveStep replace an earlier resolution that no
	// later checkpoint used (see WithReplace).
	Replace bool
	// Fence, if not 0, is the run's fence the operation was judged at
	// (see WithFence).
	Fence int64
}

// WithFence makes ResetSteps refuse with ErrRunChanged unless the run is
// still at fence, the fence its caller read before judging what the reset
// clears (the applied effects and outside calls it names): a claim or
// another operation since then grew it, and the judgement may be stale.
func WithFence(fence int64) OperateOption { return func(o *OperateOptions) { o.Fence = fence } }

// Unchanged applies the WithFence rule to run: ErrRunChanged when the
// operation was judged at another fence than the run's.
func (o OperateOptions) Unchanged(run Run) error {
	if o.Fence != 0 && run.Fence != o.Fence {
		return fmt.Errorf("%w: run %s is at fence %d, and what the operation would clear was judged at fence %d "+
			"(an attempt claimed it, or another operation changed it, since); check it again", ErrRunChanged, run.ID, run.Fence, o.Fence)
	}
	return nil
}

// WithOwnerGone gives a manual operation the dead-owner check a claim takes
// (ClaimRequest.OwnerGone): a run whose lease has not expired but whose
// owner fn reports gone is treated as stale, as a claim treats it, instead
// of being refused as held.
func WithOwnerGone(fn func(owner string) bool) OperateOption {
	return func(o *OperateOptions) { o.OwnerGone = fn }
}

// WithReplace makes ResolveStep replace the step's earlier resolution
// instead of settling an outside call of unknown outcome: refused with
// ErrNotResolved for a step that was not resolved, and with
// ErrResolutionUsed once a checkpoint recorded by a later attempt may
// have read it (CallResolution.AfterAttempt).
func WithReplace() OperateOption { return func(o *OperateOptions) { o.Replace = true } }

// Held reports whether run is held by a live runner at now: running, with
// an unexpired lease whose owner is not known to be gone.
func (o OperateOptions) Held(run Run, now time.Time) bool {
	if run.Status != RunRunning || !now.Before(run.LeaseUntil) {
		return false
	}
	return o.OwnerGone == nil || !o.OwnerGone(run.LeaseOwner)
}

// NewOperateOptions applies opts, for a store implementing an operation.
func NewOperateOptions(opts []OperateOption) OperateOptions {
	var o OperateOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// PruneResult says what Prune removed (or would remove, in a dry run).
type PruneResult struct {
	Runs  []string `json:"runs"`
	Steps int64    `json:"steps"` // step checkpoints whose payloads went
	Items int64    `json:"items"` // item checkpoints deleted
	Bytes int64    `json:"bytes"` // payload bytes freed
	// IdempotencyKeys counts the API's Idempotency-Keys that named the
	// runs pruned, deleted with them (accepting ones too): a start with
	// one of those keys afterwards is answered by its run key, as a start
	// without a key is.
	IdempotencyKeys int64 `json:"idempotency_keys"`
}

// PruneDetails is the details of a pruned run's audit record: what its
// prune removed. The Idempotency-Keys are named only when there were some.
func PruneDetails(steps, items, bytes, keys int64) string {
	d := fmt.Sprintf("%d steps, %d items, %d bytes", steps, items, bytes)
	if keys > 0 {
		d += fmt.Sprintf(", %d idempotency keys", keys)
	}
	return d
}

// JoinIDs is a short list of IDs for messages.
func JoinIDs(ids []string, max int) string {
	if len(ids) <= max {
		return strings.Join(ids, ", ")
	}
	return strings.Join(ids[:max], ", ") + fmt.Sprintf(" and %d more", len(ids)-max)
}

// Operator is a store's manual operations, each recorded in the run's
// audit log with who, when and why. Every operation that changes a run
// grows its fence in the same transaction, so a runner that still holds
// it writes nothing more; a run held by a live runner is refused (with a
// *LeaseHeldError, or ErrNotStale for Recover) unless the operation says
// otherwise.
type Operator interface {
	// Recover marks a stale run (running, lease expired or owner gone) as
	// failed, so it is resumable and no longer listed as running. A run
	// held by a live runner is refused with ErrNotStale unless force.
	Recover(ctx context.Context, a Audit, now time.Time, force bool, opts ...OperateOption) error
	// Abandon marks a run abandoned: claims refuse it unless forced.
	Abandon(ctx context.Context, a Audit, now time.Time, opts ...OperateOption) error
	// ResetSteps deletes the checkpoints (and batch items and chunk plans)
	// of the given steps so they run again, and reopens a succeeded run as
	// failed. It does not undo effects. It deletes the steps' partitions
	// too, raising the run's fence above every partition fence (see
	// PartitionStore), so the next split's effect IDs are new ones. With
	// WithFence it is refused (ErrRunChanged) if the run changed since
	// its caller judged what it clears.
	ResetSteps(ctx context.Context, a Audit, now time.Time, stepIDs []string, opts ...OperateOption) error
	// ResolveStep settles an outside call whose outcome is unknown: done
	// records it as completed with output (JSON), otherwise it is marked
	// failed so the next run calls again, and the step's call record
	// (Step.Call) keeps the decision. Only a step awaiting that decision
	// can be resolved (ErrNotUnknown otherwise); with WithReplace, only
	// one whose earlier resolution no later checkpoint used (see
	// Resolution).
	ResolveStep(ctx context.Context, a Audit, now time.Time, stepID string, done bool, output []byte, opts ...OperateOption) error
	// Audits returns a run's manual operations, oldest first.
	Audits(ctx context.Context, runID string) ([]Audit, error)
	// Prune deletes the payloads of succeeded and abandoned runs that
	// finished before cutoff: step outputs and plans, item checkpoints and
	// chunk plans; in the same transaction, the Idempotency-Keys that name
	// those runs (IdempotencyStore), accepting or done. Each run's row
	// stays as a tombstone, so a later start of its key is refused with
	// ErrPruned. With dryRun it only counts.
	Prune(ctx context.Context, a Audit, cutoff time.Time, dryRun bool) (PruneResult, error)
}

// Recovery applies the recover rule every store shares: only a running run
// can be recovered (ErrNotStale otherwise), and one whose lease is held
// (held: live at the store's now, its owner not known gone) only with
// force (ErrNotStale wrapping a *LeaseHeldError). It returns the ending
// recorded on the run and its unfinished attempt.
func Recovery(run Run, a Audit, held, force bool) (msg string, err error) {
	if run.Status != RunRunning {
		return "", fmt.Errorf("%w: %s is %s, not running; nothing to recover", ErrNotStale, run.ID, run.Status)
	}
	if held && !force {
		return "", fmt.Errorf("%w: %w", ErrNotStale, &LeaseHeldError{RunID: run.ID, Owner: run.LeaseOwner, Until: run.LeaseUntil})
	}
	return "recovered by " + a.Operator + ": " + a.Reason, nil
}

// Abandonment applies the abandon rule every store shares: an abandoned
// run is refused (ErrAbandoned), and so is a succeeded one
// (ErrAlreadySucceeded: its effects applied and stay, so marking it
// abandoned would misstate a finished day as given up). It returns the
// ending recorded on the run and its unfinished attempt.
func Abandonment(run Run, a Audit) (msg string, err error) {
	switch run.Status {
	case RunAbandoned:
		return "", fmt.Errorf("%w: %s is already abandoned", ErrAbandoned, run.ID)
	case RunSucceeded:
		return "", fmt.Errorf("%w: %s finished at %s; a succeeded run is not abandoned",
			ErrAlreadySucceeded, run.ID, run.FinishedAt.Format(time.RFC3339))
	}
	return "abandoned by " + a.Operator + ": " + a.Reason, nil
}

// Reopening applies the reset rule every store shares: a pruned run's
// steps cannot run again (ErrPruned). It returns the note recorded on the
// run, which a succeeded run reopens with as failed.
func Reopening(run Run, a Audit) (msg string, err error) {
	if !run.PrunedAt.IsZero() {
		return "", fmt.Errorf("%w: %s was pruned at %s; its checkpoints are gone, so its steps cannot run again",
			ErrPruned, run.ID, run.PrunedAt.Format(time.RFC3339))
	}
	return "reopened by " + a.Operator + " (" + a.Command + "): " + a.Reason, nil
}
