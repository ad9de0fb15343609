package checkpoint

import (
	"context"
	"fmt"
	"time"
)

// ScheduleStore keeps what a scheduler must not lose across restarts: each
// schedule's settle mark (the latest fire up to which every fire has been
// decided) and the lease that lets one scheduler at a time fire it. Like
// runs, the lease carries a fence number that grows on every claim, and
// every write is checked against it, so a scheduler that lost its lease
// (paused, partitioned) writes nothing when it wakes.
//
// It is kept apart from Store: runners need none of it.
type ScheduleStore interface {
	// ClaimSchedule makes req.Owner the scheduler that fires the schedule.
	// It creates the schedule's row (settle mark req.Now) if there is none,
	// or takes the lease if it is free, expired, or held by an owner known
	// to be gone; every claim increments the fence. A live lease of
	// another owner is a *ScheduleHeldError.
	ClaimSchedule(ctx context.Context, req ScheduleClaimRequest) (ScheduleClaim, error)
	// RenewSchedule extends the lease until the given time. It returns
	// ErrFenced if another scheduler has claimed the schedule since.
	RenewSchedule(ctx context.Context, l ScheduleLease, now, until time.Time) error
	// SettleSchedule moves the schedule's settle mark forward to fire (never
	// back), checked against the fence: ErrFenced if the lease was lost.
	SettleSchedule(ctx context.Context, l ScheduleLease, fire, now time.Time) error
	// ReleaseSchedule gives the lease up, so another scheduler can claim it
	// at once. A lease already lost is no error.
	ReleaseSchedule(ctx context.Context, l ScheduleLease, now time.Time) error
	// Schedules lists the stored state of every schedule, by name.
	Schedules(ctx context.Context) ([]ScheduleState, error)
	// PauseSchedule pauses the schedule at a.At, with a (whose RunID is
	// ScheduleAuditID(name)) recorded in the same transaction: a record
	// that cannot be written pauses nothing. No scheduler sharing the
	// store fires it until UnpauseSchedule. A schedule never served gets
	// its row (fence 0, no lease); its first claim starts its settle mark
	// then, as creating the row would. A pause in force is refused
	// with ErrSchedulePaused.
	PauseSchedule(ctx context.Context, name string, a Audit) error
	// UnpauseSchedule ends the schedule's pause at a.At, recording a in
	// the same transaction. Without catchUp the fires since the pause
	// began are skipped for it (ScheduleState.Skip, see NextPauseSkip);
	// with catchUp they are left to the misfire policy, as fires missed
	// in downtime are. A schedule not paused is refused with
	// ErrScheduleNotPaused.
	UnpauseSchedule(ctx context.Context, name string, a Audit, catchUp bool) error
}

// ScheduleClaimRequest says which scheduler claims which schedule, when.
type ScheduleClaimRequest struct {
	Name     string // the schedule's name
	Owner    string // host:pid of the claiming scheduler
	Now      time.Time
	LeaseFor time.Duration
	// OwnerGone reports whether the scheduler named by a lease owner is
	// known to be dead (same host, process gone); its lease is then taken
	// over at once instead of waiting for it to expire. Nil means never.
	OwnerGone func(owner string) bool
}

// ScheduleLease identifies one claim of a schedule. Writes carrying an older
// fence than the schedule's are refused with ErrFenced.
type ScheduleLease struct {
	Name  string
	Owner string
	Fence int64
}

// ScheduleClaim is the result of a successful ClaimSchedule.
type ScheduleClaim struct {
	Lease ScheduleLease
	// State is the schedule's row after the claim; State.LastFire is
	// where firing resumes.
	State ScheduleState
	// Created is true when this claim created the schedule's row, or is
	// the first claim of the row a pause made (PauseSchedule).
	Created bool
	// TookOverFrom names the owner whose unreleased lease this claim
	// replaced (a crashed or stalled scheduler), if any.
	TookOverFrom string
}

// ScheduleState is one row of the schedules table.
type ScheduleState struct {
	Name string
	// LastFire is the settle mark: every fire up to it has been decided.
	LastFire   time.Time
	Fence      int64
	LeaseOwner string
	LeaseUntil time.Time // zero when no lease is held
	CreatedAt  time.Time
	UpdatedAt  time.Time
	// Pause is the pause in force; the zero value when not paused.
	Pause SchedulePause
	// Skip is the window of fires the last unpause without catch-up
	// skipped for its pause.
	Skip PauseSkip
}

// ScheduleHeldError is returned by ClaimSchedule while another scheduler
// holds a live lease on the schedule.
type ScheduleHeldError struct {
	Name  string
	Owner string
	Until time.Time
}

func (e *ScheduleHeldError) Error() string {
	return fmt.Sprintf("schedule %s is fired by %s until %s", e.Name, OwnerName(e.Owner), e.Until.UTC().Format(time.RFC3339))
}

// Validate checks a schedule claim request as every store does before
// touching the database: a name, an owner, the time and a positive lease.
func (r ScheduleClaimRequest) Validate() error {
	if r.Name == "" || r.Owner == "" || r.Now.IsZero() || r.LeaseFor <= 0 {
		return fmt.Errorf("checkpoint: a schedule claim needs a Name, an Owner, Now and a positive LeaseFor (got %q, %q, %v, %s)",
			r.Name, r.Owner, r.Now, r.LeaseFor)
	}
	return nil
}
