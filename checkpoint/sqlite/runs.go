package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/internal/rowscan"
)

const (
	sqlListRuns = `SELECT ` + runCols + `
FROM runs
WHERE (?1 = '' OR job = ?1) AND (?2 = '' OR status = ?2)
  AND (?4 = '' OR substr(run_key, 1, length(?4)) = ?4)
  AND (?5 = '' OR created_at >= ?5) AND (?6 = '' OR created_at < ?6)
  AND (?7 = '' OR created_at < ?7 OR (created_at = ?7 AND id > ?8))
ORDER BY created_at DESC, id
LIMIT ?3`
	sqlAttempts = `SELECT number, fence, owner, status, error, started_at, finished_at
FROM attempts WHERE run_id = ? ORDER BY number`
)

// Runs implements checkpoint.Store.
func (s *Store) Runs(ctx context.Context, f checkpoint.RunFilter) ([]checkpoint.Run, error) {
	limit := f.PageLimit()
	var afterAt, afterID string
	if f.After != nil {
		afterAt, afterID = fmtTime(f.After.CreatedAt), f.After.ID
	}
	rows, err := s.rdb.QueryContext(ctx, sqlListRuns, f.Job, f.Status, limit, f.RunKeyPrefix,
		fmtTime(f.CreatedFrom), fmtTime(f.CreatedBefore), afterAt, afterID)
	if err != nil {
		return nil, s.wrap("list runs", err)
	}
	defer rows.Close()
	runs, err := rowscan.Collect(rows, func(r rowscan.Rows) (checkpoint.Run, error) { return scanRun(r) })
	return runs, s.wrap("list runs", err)
}

// Run implements checkpoint.Store.
func (s *Store) Run(ctx context.Context, runID string) (checkpoint.RunInfo, error) {
	run, err := scanRun(s.rdb.QueryRowContext(ctx, sqlSelectRun, runID))
	if errors.Is(err, sql.ErrNoRows) {
		return checkpoint.RunInfo{}, fmt.Errorf("%w: no run %q in %s", checkpoint.ErrNotFound, runID, s.path)
	}
	if err != nil {
		return checkpoint.RunInfo{}, s.wrap("read run "+runID, err)
	}
	info := checkpoint.RunInfo{Run: run}
	rows, err := s.rdb.QueryContext(ctx, sqlAttempts, runID)
	if err != nil {
		return checkpoint.RunInfo{}, s.wrap("read attempts of "+runID, err)
	}
	defer rows.Close()
	info.Attempts, err = rowscan.Collect(rows, func(r rowscan.Rows) (checkpoint.Attempt, error) {
		a := checkpoint.Attempt{RunID: runID}
		var started, finished sql.NullString
		err := r.Scan(&a.Number, &a.Fence, &a.Owner, &a.Status, &a.Error, &started, &finished)
		a.StartedAt, a.FinishedAt = parseTime(started), parseTime(finished)
		return a, err
	})
	if err != nil {
		return checkpoint.RunInfo{}, s.wrap("read attempts of "+runID, err)
	}
	return info, nil
}

// Fence implements checkpoint.Store.
func (s *Store) Fence(ctx context.Context, runID string) (int64, error) {
	var fence int64
	err := s.stmt.fence.QueryRowContext(ctx, runID).Scan(&fence)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("%w: no run %q in %s", checkpoint.ErrNotFound, runID, s.path)
	}
	return fence, s.wrap("read fence of "+runID, err)
}
