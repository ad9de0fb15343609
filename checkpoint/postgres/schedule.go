package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stepwise-run/stepwise/checkpoint"
)

// Schedule leases are fenced like runs' (lease.go): every claim raises the
// fence, every write is checked against it in the statement that makes
// it. Times are coalesce($now, now()), durations microseconds.
const (
	scheduleCols = `name, last_fire, fence, lease_owner, lease_until, created_at, updated_at,
    paused_at, paused_by, paused_reason, skip_from, skip_until`
	// sqlCreateSchedule creates the schedule's row, held by the claimer
	// with fence 1 and its settle mark at the claim's time, or does nothing
	// when it exists.
	sqlCreateSchedule = `INSERT INTO schedules (name, last_fire, fence, lease_owner, lease_until, created_at, updated_at)
VALUES ($1, coalesce($3::timestamptz, now()), 1, $2,
        coalesce($3::timestamptz, now()) + $4::bigint * interval '1 microsecond',
        coalesce($3::timestamptz, now()), coalesce($3::timestamptz, now()))
ON CONFLICT (name) DO NOTHING`
	// sqlLockSchedule reads the schedule to claim, locked until the claim
	// commits, with the time its lease is judged at.
	sqlLockSchedule = `SELECT ` + scheduleCols + `, coalesce($2::timestamptz, now()) FROM schedules WHERE name = $1 FOR UPDATE`
	// sqlTakeSchedule claims the row; the first claim of a row a pause
	// made (fence 0) starts its settle mark at the claim, as creating it
	// would: the fires before no scheduler ever fired are not missed.
	sqlTakeSchedule = `UPDATE schedules SET fence = fence + 1, lease_owner = $2,
    lease_until = coalesce($3::timestamptz, now()) + $4::bigint * interval '1 microsecond',
    updated_at = coalesce($3::timestamptz, now()),
    last_fire = CASE WHEN fence = 0 THEN coalesce($3::timestamptz, now()) ELSE last_fire END,
    created_at = CASE WHEN fence = 0 THEN coalesce($3::timestamptz, now()) ELSE created_at END
WHERE name = $1 AND fence = $5
RETURNING ` + scheduleCols
	sqlListSchedules = `SELECT ` + scheduleCols + ` FROM schedules ORDER BY name`
	// sqlRenewSchedule extends a held lease: to $3 on the caller's clock,
	// or by $4 from the server's now(). A released lease is not renewed.
	sqlRenewSchedule = `UPDATE schedules SET lease_until = coalesce($3::timestamptz, now() + $4::bigint * interval '1 microsecond'),
    updated_at = coalesce($5::timestamptz, now())
WHERE name = $1 AND fence = $2 AND lease_owner IS NOT NULL`
	// sqlSettleSchedule moves the settle mark forward only.
	sqlSettleSchedule = `UPDATE schedules SET last_fire = greatest(last_fire, $3::timestamptz), updated_at = coalesce($4::timestamptz, now())
WHERE name = $1 AND fence = $2`
	sqlReleaseSchedule = `UPDATE schedules SET lease_owner = NULL, lease_until = NULL, updated_at = coalesce($3::timestamptz, now())
WHERE name = $1 AND fence = $2`
)

var _ checkpoint.ScheduleStore = (*Store)(nil)

// scanSchedule reads the scheduleCols of one row, followed by extra
// destinations.
func scanSchedule(row pgx.Row, extra ...any) (checkpoint.ScheduleState, error) {
	var s checkpoint.ScheduleState
	var owner pgtype.Text
	var last, until, created, updated, pausedAt, skipFrom, skipUntil pgtype.Timestamptz
	dest := append([]any{&s.Name, &last, &s.Fence, &owner, &until, &created, &updated,
		&pausedAt, &s.Pause.By, &s.Pause.Reason, &skipFrom, &skipUntil}, extra...)
	if err := row.Scan(dest...); err != nil {
		return checkpoint.ScheduleState{}, err
	}
	s.Pause.At = tm(pausedAt)
	s.Skip = checkpoint.PauseSkip{From: tm(skipFrom), Until: tm(skipUntil)}
	s.LastFire = tm(last)
	s.LeaseOwner = owner.String
	s.LeaseUntil = tm(until)
	s.CreatedAt = tm(created)
	s.UpdatedAt = tm(updated)
	return s, nil
}

// ClaimSchedule implements checkpoint.ScheduleStore: the create-or-nothing
// insert and the locked read go in one round trip; a schedule that
// existed is then taken by one more statement (fence raised).
func (s *Store) ClaimSchedule(ctx context.Context, req checkpoint.ScheduleClaimRequest) (checkpoint.ScheduleClaim, error) {
	if err := req.Validate(); err != nil {
		return checkpoint.ScheduleClaim{}, err
	}
	var c checkpoint.ScheduleClaim
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		c, err = s.claimSchedule(ctx, tx, req)
		return err
	})
	if err != nil {
		return checkpoint.ScheduleClaim{}, s.wrap("claim schedule "+req.Name, err)
	}
	return c, nil
}

func (s *Store) claimSchedule(ctx context.Context, tx pgx.Tx, req checkpoint.ScheduleClaimRequest) (checkpoint.ScheduleClaim, error) {
	now, lease := s.clock(req.Now), req.LeaseFor.Microseconds()
	b := &pgx.Batch{}
	b.Queue(sqlCreateSchedule, req.Name, req.Owner, now, lease)
	b.Queue(sqlLockSchedule, req.Name, now)
	br := tx.SendBatch(ctx, b)
	tag, err := br.Exec()
	if err != nil {
		br.Close()
		return checkpoint.ScheduleClaim{}, err
	}
	var at time.Time
	st, err := scanSchedule(br.QueryRow(), &at)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return checkpoint.ScheduleClaim{}, err
	}
	c := checkpoint.ScheduleClaim{Lease: checkpoint.ScheduleLease{Name: req.Name, Owner: req.Owner, Fence: st.Fence}, State: st}
	if tag.RowsAffected() == 1 {
		c.Created = true
		return c, nil
	}
	// A released lease has no owner; our own is claimed again (with a new
	// fence, so writes of the earlier claim stop counting).
	if st.LeaseOwner != "" && st.LeaseOwner != req.Owner {
		if at.Before(st.LeaseUntil) && (req.OwnerGone == nil || !req.OwnerGone(st.LeaseOwner)) {
			return checkpoint.ScheduleClaim{}, &checkpoint.ScheduleHeldError{Name: st.Name, Owner: st.LeaseOwner, Until: st.LeaseUntil}
		}
		c.TookOverFrom = st.LeaseOwner
	}
	c.Created = st.Fence == 0 // a row a pause made, never claimed
	c.State, err = scanSchedule(tx.QueryRow(ctx, sqlTakeSchedule, req.Name, req.Owner, now, lease, st.Fence))
	if errors.Is(err, pgx.ErrNoRows) {
		// Unreachable while the row is locked FOR UPDATE; kept as a guard.
		return checkpoint.ScheduleClaim{}, fmt.Errorf("%w: schedule %s changed while being claimed", checkpoint.ErrFenced, req.Name)
	}
	if err != nil {
		return checkpoint.ScheduleClaim{}, err
	}
	c.Lease.Fence = c.State.Fence
	return c, nil
}

// RenewSchedule implements checkpoint.ScheduleStore. On the server's
// clock the lease is extended by until - now from the server's now().
func (s *Store) RenewSchedule(ctx context.Context, l checkpoint.ScheduleLease, now, until time.Time) error {
	ext := until.Sub(now)
	if ext <= 0 {
		return fmt.Errorf("postgres: renew lease of schedule %s: until (%v) is not after now (%v)", l.Name, until, now)
	}
	return s.fencedScheduleWrite(ctx, "renew lease of schedule", l, sqlRenewSchedule, l.Name, l.Fence, s.clock(until), ext.Microseconds(), s.clock(now))
}

// SettleSchedule implements checkpoint.ScheduleStore: fire is a fire time
// of the schedule, stored as given.
func (s *Store) SettleSchedule(ctx context.Context, l checkpoint.ScheduleLease, fire, now time.Time) error {
	if fire.IsZero() {
		return fmt.Errorf("postgres: settle schedule %s: the fire time is zero; give the fire being settled", l.Name)
	}
	return s.fencedScheduleWrite(ctx, "settle schedule", l, sqlSettleSchedule, l.Name, l.Fence, fire, s.clock(now))
}

// ReleaseSchedule implements checkpoint.ScheduleStore: a lease already
// lost is no error.
func (s *Store) ReleaseSchedule(ctx context.Context, l checkpoint.ScheduleLease, now time.Time) error {
	err := s.fencedScheduleWrite(ctx, "release schedule", l, sqlReleaseSchedule, l.Name, l.Fence, s.clock(now))
	if errors.Is(err, checkpoint.ErrFenced) {
		return nil
	}
	return err
}

// fencedScheduleWrite runs one fenced update of a schedule row; no row
// changed means the fence moved.
func (s *Store) fencedScheduleWrite(ctx context.Context, op string, l checkpoint.ScheduleLease, query string, args ...any) error {
	tag, err := s.pool.Exec(ctx, query, args...)
	if err != nil {
		return s.wrap(op+" "+l.Name, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: schedule %s, owner %s (fence %d)", checkpoint.ErrFenced, l.Name, checkpoint.OwnerName(l.Owner), l.Fence)
	}
	return nil
}

// Schedules implements checkpoint.ScheduleStore.
func (s *Store) Schedules(ctx context.Context) ([]checkpoint.ScheduleState, error) {
	rows, err := s.pool.Query(ctx, sqlListSchedules)
	if err != nil {
		return nil, s.wrap("list schedules", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (checkpoint.ScheduleState, error) { return scanSchedule(r) })
	if len(out) == 0 {
		out = nil // as from the SQLite store
	}
	return out, s.wrap("list schedules", err)
}
