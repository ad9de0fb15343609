package checkpoint

import (
	"context"
	"database/sql"
	"errors"
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
}

var _ ScheduleStore = (*SQLite)(nil)

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
	// Created is true when this claim created the schedule's row.
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

const (
	sqlSelectSchedule = `SELECT name, last_fire, fence, lease_owner, lease_until, created_at, updated_at
FROM schedules WHERE name = ?`
	sqlListSchedules = `SELECT name, last_fire, fence, lease_owner, lease_until, created_at, updated_at
FROM schedules ORDER BY name`
	sqlInsertSchedule = `INSERT INTO schedules (name, last_fire, fence, lease_owner, lease_until, created_at, updated_at)
VALUES (?1, ?2, 1, ?3, ?4, ?2, ?2)`
	sqlTakeSchedule = `UPDATE schedules SET fence = fence + 1, lease_owner = ?, lease_until = ?, updated_at = ?
WHERE name = ? AND fence = ?`
	sqlRenewSchedule = `UPDATE schedules SET lease_until = ?, updated_at = ?
WHERE name = ? AND fence = ? AND lease_owner IS NOT NULL`
	// The settle mark is fixed-width UTC text, so MAX compares times.
	sqlSettleSchedule = `UPDATE schedules SET last_fire = MAX(last_fire, ?), updated_at = ?
WHERE name = ? AND fence = ?`
	sqlReleaseSchedule = `UPDATE schedules SET lease_owner = NULL, lease_until = NULL, updated_at = ?
WHERE name = ? AND fence = ?`
)

func scanSchedule(row rowScanner) (ScheduleState, error) {
	var s ScheduleState
	var last, owner, until, created, updated sql.NullString
	if err := row.Scan(&s.Name, &last, &s.Fence, &owner, &until, &created, &updated); err != nil {
		return ScheduleState{}, err
	}
	s.LastFire = parseTime(last)
	s.LeaseOwner = owner.String
	s.LeaseUntil = parseTime(until)
	s.CreatedAt = parseTime(created)
	s.UpdatedAt = parseTime(updated)
	return s, nil
}

// ClaimSchedule implements ScheduleStore.
func (s *SQLite) ClaimSchedule(ctx context.Context, req ScheduleClaimRequest) (ScheduleClaim, error) {
	if req.Name == "" || req.Owner == "" || req.Now.IsZero() || req.LeaseFor <= 0 {
		return ScheduleClaim{}, fmt.Errorf("checkpoint: schedule claim needs Name, Owner, Now and a positive LeaseFor (got %q, %q, %v, %s)",
			req.Name, req.Owner, req.Now, req.LeaseFor)
	}
	var c ScheduleClaim
	err := s.tx(ctx, "claim schedule "+req.Name, func(tx *sql.Tx) error {
		var err error
		c, err = claimScheduleTx(ctx, tx, req)
		return err
	})
	return c, err
}

func claimScheduleTx(ctx context.Context, tx *sql.Tx, req ScheduleClaimRequest) (ScheduleClaim, error) {
	now, until := fmtTime(req.Now), fmtTime(req.Now.Add(req.LeaseFor))
	c := ScheduleClaim{Lease: ScheduleLease{Name: req.Name, Owner: req.Owner}}
	st, err := scanSchedule(tx.QueryRowContext(ctx, sqlSelectSchedule, req.Name))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if _, err := tx.ExecContext(ctx, sqlInsertSchedule, req.Name, now, req.Owner, until); err != nil {
			return ScheduleClaim{}, err
		}
		c.Created = true
	case err != nil:
		return ScheduleClaim{}, err
	default:
		// A released lease has no owner; our own is claimed again (with a
		// new fence, so writes of the earlier claim stop counting).
		if st.LeaseOwner != "" && st.LeaseOwner != req.Owner {
			live := req.Now.Before(st.LeaseUntil)
			if live && (req.OwnerGone == nil || !req.OwnerGone(st.LeaseOwner)) {
				return ScheduleClaim{}, &ScheduleHeldError{Name: st.Name, Owner: st.LeaseOwner, Until: st.LeaseUntil}
			}
			c.TookOverFrom = st.LeaseOwner
		}
		res, err := tx.ExecContext(ctx, sqlTakeSchedule, req.Owner, until, now, req.Name, st.Fence)
		if err != nil {
			return ScheduleClaim{}, err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return ScheduleClaim{}, fmt.Errorf("%w: schedule %s changed while being claimed", ErrFenced, req.Name)
		}
	}
	if c.State, err = scanSchedule(tx.QueryRowContext(ctx, sqlSelectSchedule, req.Name)); err != nil {
		return ScheduleClaim{}, err
	}
	c.Lease.Fence = c.State.Fence
	return c, nil
}

// RenewSchedule implements ScheduleStore.
func (s *SQLite) RenewSchedule(ctx context.Context, l ScheduleLease, now, until time.Time) error {
	return s.fencedScheduleWrite(ctx, "renew lease of schedule", l, sqlRenewSchedule, fmtTime(until), fmtTime(now), l.Name, l.Fence)
}

// SettleSchedule implements ScheduleStore.
func (s *SQLite) SettleSchedule(ctx context.Context, l ScheduleLease, fire, now time.Time) error {
	if fire.IsZero() {
		return fmt.Errorf("checkpoint: settle schedule %s: the fire time is zero", l.Name)
	}
	return s.fencedScheduleWrite(ctx, "settle schedule", l, sqlSettleSchedule, fmtTime(fire), fmtTime(now), l.Name, l.Fence)
}

// ReleaseSchedule implements ScheduleStore.
func (s *SQLite) ReleaseSchedule(ctx context.Context, l ScheduleLease, now time.Time) error {
	err := s.fencedScheduleWrite(ctx, "release schedule", l, sqlReleaseSchedule, fmtTime(now), l.Name, l.Fence)
	if errors.Is(err, ErrFenced) {
		return nil
	}
	return err
}

// fencedScheduleWrite runs one fenced update of a schedule row; no row
// changed means the fence moved.
func (s *SQLite) fencedScheduleWrite(ctx context.Context, op string, l ScheduleLease, query string, args ...any) error {
	res, err := s.db.ExecContext(ctx, query, args...)
	if err != nil {
		return s.wrap(op+" "+l.Name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: schedule %s, owner %s (fence %d)", ErrFenced, l.Name, l.Owner, l.Fence)
	}
	return nil
}

// Schedules implements ScheduleStore.
func (s *SQLite) Schedules(ctx context.Context) ([]ScheduleState, error) {
	rows, err := s.rdb.QueryContext(ctx, sqlListSchedules)
	if err != nil {
		return nil, s.wrap("list schedules", err)
	}
	defer rows.Close()
	var out []ScheduleState
	for rows.Next() {
		st, err := scanSchedule(rows)
		if err != nil {
			return nil, s.wrap("list schedules", err)
		}
		out = append(out, st)
	}
	return out, s.wrap("list schedules", rows.Err())
}
