package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/stepwise-run/stepwise/checkpoint"
)

const (
	// sqlCreatePausedSchedule gives a schedule never served its row, with
	// no lease and its settle mark at the pause: fires before it were
	// never the store's to decide.
	sqlCreatePausedSchedule = `INSERT INTO schedules (name, last_fire, fence, created_at, updated_at)
VALUES (?1, ?2, 0, ?2, ?2) ON CONFLICT (name) DO NOTHING`
	sqlPauseSchedule = `UPDATE schedules SET paused_at = ?, paused_by = ?, paused_reason = ?, updated_at = ?
WHERE name = ? AND paused_at IS NULL`
	sqlUnpauseSchedule = `UPDATE schedules SET paused_at = NULL, paused_by = '', paused_reason = '',
    skip_from = NULLIF(?, ''), skip_until = NULLIF(?, ''), updated_at = ? WHERE name = ? AND paused_at IS NOT NULL`
)

// PauseSchedule implements checkpoint.ScheduleStore.
func (s *Store) PauseSchedule(ctx context.Context, name string, a checkpoint.Audit) error {
	if err := checkpoint.CheckScheduleAudit(name, a); err != nil {
		return err
	}
	return s.tx(ctx, "pause schedule "+name, func(tx *sql.Tx) error {
		at := fmtTime(a.At)
		if _, err := tx.ExecContext(ctx, sqlCreatePausedSchedule, name, at); err != nil {
			return err
		}
		st, err := scanSchedule(tx.QueryRowContext(ctx, sqlSelectSchedule, name))
		if err != nil {
			return err
		}
		if st.Pause.Paused() {
			return checkpoint.PausedError(name, st.Pause)
		}
		if _, err := tx.ExecContext(ctx, sqlPauseSchedule, at, a.Operator, a.Reason, at, name); err != nil {
			return err
		}
		return insertAudits(ctx, tx, a)
	})
}

// UnpauseSchedule implements checkpoint.ScheduleStore.
func (s *Store) UnpauseSchedule(ctx context.Context, name string, a checkpoint.Audit, catchUp bool) error {
	if err := checkpoint.CheckScheduleAudit(name, a); err != nil {
		return err
	}
	return s.tx(ctx, "unpause schedule "+name, func(tx *sql.Tx) error {
		st, err := scanSchedule(tx.QueryRowContext(ctx, sqlSelectSchedule, name))
		if errors.Is(err, sql.ErrNoRows) || err == nil && !st.Pause.Paused() {
			return fmt.Errorf("%w: %s is not paused", checkpoint.ErrScheduleNotPaused, name)
		}
		if err != nil {
			return err
		}
		skip := st.Skip
		if !catchUp {
			skip = checkpoint.NextPauseSkip(st.Skip, st.Pause, st.LastFire, a.At)
		}
		if _, err := tx.ExecContext(ctx, sqlUnpauseSchedule, fmtTime(skip.From), fmtTime(skip.Until), fmtTime(a.At), name); err != nil {
			return err
		}
		return insertAudits(ctx, tx, a)
	})
}
