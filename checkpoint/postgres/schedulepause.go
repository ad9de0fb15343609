package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// A pause is judged on the schedule's row locked FOR UPDATE, so a pause
// and an unpause of one schedule never interleave; its times are the
// audit record's.
const (
	// sqlCreatePausedSchedule gives a schedule never served its row, with
	// no lease and its settle mark at the pause: fires before it were
	// never the store's to decide.
	sqlCreatePausedSchedule = `INSERT INTO schedules (name, last_fire, fence, created_at, updated_at)
VALUES ($1, $2, 0, $2, $2) ON CONFLICT (name) DO NOTHING`
	sqlLockPauseSchedule = `SELECT ` + scheduleCols + ` FROM schedules WHERE name = $1 FOR UPDATE`
	sqlPauseSchedule     = `UPDATE schedules SET paused_at = $2, paused_by = $3, paused_reason = $4, updated_at = $2
WHERE name = $1 AND paused_at IS NULL`
	sqlUnpauseSchedule = `UPDATE schedules SET paused_at = NULL, paused_by = '', paused_reason = '',
    skip_from = $2, skip_until = $3, updated_at = $4 WHERE name = $1 AND paused_at IS NOT NULL`
)

// PauseSchedule implements checkpoint.ScheduleStore.
func (s *Store) PauseSchedule(ctx context.Context, name string, a checkpoint.Audit) error {
	if err := checkpoint.CheckScheduleAudit(name, a); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlCreatePausedSchedule, name, a.At); err != nil {
			return err
		}
		st, err := scanSchedule(tx.QueryRow(ctx, sqlLockPauseSchedule, name))
		if err != nil {
			return err
		}
		if st.Pause.Paused() {
			return checkpoint.PausedError(name, st.Pause)
		}
		if _, err := tx.Exec(ctx, sqlPauseSchedule, name, a.At, a.Operator, a.Reason); err != nil {
			return err
		}
		return insertAudits(ctx, tx, a)
	})
	return s.wrap("pause schedule "+name, err)
}

// UnpauseSchedule implements checkpoint.ScheduleStore.
func (s *Store) UnpauseSchedule(ctx context.Context, name string, a checkpoint.Audit, catchUp bool) error {
	if err := checkpoint.CheckScheduleAudit(name, a); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		st, err := scanSchedule(tx.QueryRow(ctx, sqlLockPauseSchedule, name))
		if errors.Is(err, pgx.ErrNoRows) || err == nil && !st.Pause.Paused() {
			return fmt.Errorf("%w: %s is not paused", checkpoint.ErrScheduleNotPaused, name)
		}
		if err != nil {
			return err
		}
		skip := st.Skip
		if !catchUp {
			skip = checkpoint.NextPauseSkip(st.Skip, st.Pause, st.LastFire, a.At)
		}
		if _, err := tx.Exec(ctx, sqlUnpauseSchedule, name, ts(skip.From), ts(skip.Until), a.At); err != nil {
			return err
		}
		return insertAudits(ctx, tx, a)
	})
	return s.wrap("unpause schedule "+name, err)
}
