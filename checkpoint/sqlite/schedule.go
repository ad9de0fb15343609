package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

var _ checkpoint.ScheduleStore = (*Store)(nil)

const (
	scheduleCols = `name, last_fire, fence, lease_owner, lease_until, created_at, updated_at,
    paused_at, paused_by, paused_reason, skip_from, skip_until`
	sqlSelectSchedule = `SELECT ` + scheduleCols + ` FROM schedules WHERE name = ?`
	sqlListSchedules  = `SELECT ` + scheduleCols + ` FROM schedules ORDER BY name`
	sqlInsertSchedule = `INSERT INTO schedules (name, last_fire, fence, lease_owner, lease_until, created_at, updated_at)
VALUES (?1, ?2, 1, ?3, ?4, ?2, ?2)`
	// sqlTakeSchedule claims the row; the first claim of a row a pause
	// made (fence 0) starts its settle mark at the claim, as creating it
	// would: the fires before no scheduler ever fired are not missed.
	sqlTakeSchedule = `UPDATE schedules SET fence = fence + 1, lease_owner = ?1, lease_until = ?2, updated_at = ?3,
    last_fire = CASE WHEN fence = 0 THEN ?3 ELSE last_fire END, created_at = CASE WHEN fence = 0 THEN ?3 ELSE created_at END
WHERE name = ?4 AND fence = ?5`
	sqlRenewSchedule = `UPDATE schedules SET lease_until = ?, updated_at = ?
WHERE name = ? AND fence = ? AND lease_owner IS NOT NULL`
	// The settle mark is fixed-width UTC text, so MAX compares times.
	sqlSettleSchedule = `UPDATE schedules SET last_fire = MAX(last_fire, ?), updated_at = ?
WHERE name = ? AND fence = ?`
	sqlReleaseSchedule = `UPDATE schedules SET lease_owner = NULL, lease_until = NULL, updated_at = ?
WHERE name = ? AND fence = ?`
)

func scanSchedule(row rowScanner) (checkpoint.ScheduleState, error) {
	var s checkpoint.ScheduleState
	var last, owner, until, created, updated, pausedAt, skipFrom, skipUntil sql.NullString
	if err := row.Scan(&s.Name, &last, &s.Fence, &owner, &until, &created, &updated,
		&pausedAt, &s.Pause.By, &s.Pause.Reason, &skipFrom, &skipUntil); err != nil {
		return checkpoint.ScheduleState{}, err
	}
	s.Pause.At = parseTime(pausedAt)
	s.Skip = checkpoint.PauseSkip{From: parseTime(skipFrom), Until: parseTime(skipUntil)}
	s.LastFire = parseTime(last)
	s.LeaseOwner = owner.String
	s.LeaseUntil = parseTime(until)
	s.CreatedAt = parseTime(created)
	s.UpdatedAt = parseTime(updated)
	return s, nil
}

// ClaimSchedule implements checkpoint.ScheduleStore.
func (s *Store) ClaimSchedule(ctx context.Context, req checkpoint.ScheduleClaimRequest) (checkpoint.ScheduleClaim, error) {
	if err := req.Validate(); err != nil {
		return checkpoint.ScheduleClaim{}, err
	}
	var c checkpoint.ScheduleClaim
	err := s.tx(ctx, "claim schedule "+req.Name, func(tx *sql.Tx) error {
		var err error
		c, err = claimScheduleTx(ctx, tx, req)
		return err
	})
	return c, err
}

func claimScheduleTx(ctx context.Context, tx *sql.Tx, req checkpoint.ScheduleClaimRequest) (checkpoint.ScheduleClaim, error) {
	now, until := fmtTime(req.Now), fmtTime(req.Now.Add(req.LeaseFor))
	c := checkpoint.ScheduleClaim{Lease: checkpoint.ScheduleLease{Name: req.Name, Owner: req.Owner}}
	st, err := scanSchedule(tx.QueryRowContext(ctx, sqlSelectSchedule, req.Name))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if _, err := tx.ExecContext(ctx, sqlInsertSchedule, req.Name, now, req.Owner, until); err != nil {
			return checkpoint.ScheduleClaim{}, err
		}
		c.Created = true
	case err != nil:
		return checkpoint.ScheduleClaim{}, err
	default:
		// A released lease has no owner; our own is claimed again (with a
		// new fence, so writes of the earlier claim stop counting).
		if st.LeaseOwner != "" && st.LeaseOwner != req.Owner {
			live := req.Now.Before(st.LeaseUntil)
			if live && (req.OwnerGone == nil || !req.OwnerGone(st.LeaseOwner)) {
				return checkpoint.ScheduleClaim{}, &checkpoint.ScheduleHeldError{Name: st.Name, Owner: st.LeaseOwner, Until: st.LeaseUntil}
			}
			c.TookOverFrom = st.LeaseOwner
		}
		res, err := tx.ExecContext(ctx, sqlTakeSchedule, req.Owner, until, now, req.Name, st.Fence)
		if err != nil {
			return checkpoint.ScheduleClaim{}, err
		}
		c.Created = st.Fence == 0
		if n, _ := res.RowsAffected(); n != 1 {
			return checkpoint.ScheduleClaim{}, fmt.Errorf("%w: schedule %s changed while being claimed", checkpoint.ErrFenced, req.Name)
		}
	}
	if c.State, err = scanSchedule(tx.QueryRowContext(ctx, sqlSelectSchedule, req.Name)); err != nil {
		return checkpoint.ScheduleClaim{}, err
	}
	c.Lease.Fence = c.State.Fence
	return c, nil
}

// RenewSchedule implements checkpoint.ScheduleStore.
func (s *Store) RenewSchedule(ctx context.Context, l checkpoint.ScheduleLease, now, until time.Time) error {
	return s.fencedScheduleWrite(ctx, "renew lease of schedule", l, sqlRenewSchedule, fmtTime(until), fmtTime(now), l.Name, l.Fence)
}

// SettleSchedule implements checkpoint.ScheduleStore.
func (s *Store) SettleSchedule(ctx context.Context, l checkpoint.ScheduleLease, fire, now time.Time) error {
	if fire.IsZero() {
		return fmt.Errorf("checkpoint: settle schedule %s: the fire time is zero", l.Name)
	}
	return s.fencedScheduleWrite(ctx, "settle schedule", l, sqlSettleSchedule, fmtTime(fire), fmtTime(now), l.Name, l.Fence)
}

// ReleaseSchedule implements checkpoint.ScheduleStore.
func (s *Store) ReleaseSchedule(ctx context.Context, l checkpoint.ScheduleLease, now time.Time) error {
	err := s.fencedScheduleWrite(ctx, "release schedule", l, sqlReleaseSchedule, fmtTime(now), l.Name, l.Fence)
	if errors.Is(err, checkpoint.ErrFenced) {
		return nil
	}
	return err
}

// fencedScheduleWrite runs one fenced update of a schedule row; no row
// changed means the fence moved.
func (s *Store) fencedScheduleWrite(ctx context.Context, op string, l checkpoint.ScheduleLease, query string, args ...any) error {
	res, err := s.db.ExecContext(ctx, query, args...)
	if err != nil {
		return s.wrap(op+" "+l.Name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: schedule %s, owner %s (fence %d)", checkpoint.ErrFenced, l.Name, l.Owner, l.Fence)
	}
	return nil
}

// Schedules implements checkpoint.ScheduleStore.
func (s *Store) Schedules(ctx context.Context) ([]checkpoint.ScheduleState, error) {
	rows, err := s.rdb.QueryContext(ctx, sqlListSchedules)
	if err != nil {
		return nil, s.wrap("list schedules", err)
	}
	defer rows.Close()
	var out []checkpoint.ScheduleState
	for rows.Next() {
		st, err := scanSchedule(rows)
		if err != nil {
			return nil, s.wrap("list schedules", err)
		}
		out = append(out, st)
	}
	return out, s.wrap("list schedules", rows.Err())
}
