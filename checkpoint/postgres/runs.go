package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/internal/rowscan"
)

const (
	runCols = `id, job, run_key, params, params_hash, status, fence,
       lease_owner, lease_until, error, created_at, updated_at, finished_at, pruned_at,
       queue, priority, available_at, limit_key, limit_max`
	sqlSelectRun = `SELECT ` + runCols + ` FROM runs WHERE id = $1`
	sqlListRuns  = `SELECT ` + runCols + ` FROM runs
WHERE ($1::text = '' OR job = $1) AND ($2::text = '' OR status = $2)
  AND ($4::text = '' OR left(run_key, length($4)) = $4)
  AND ($5::timestamptz IS NULL OR created_at >= $5) AND ($6::timestamptz IS NULL OR created_at < $6)
  AND ($7::timestamptz IS NULL OR created_at < $7 OR (created_at = $7 AND id > $8))
ORDER BY created_at DESC, id
LIMIT $3`
	sqlAttempts = `SELECT number, fence, owner, status, error, started_at, finished_at
FROM attempts WHERE run_id = $1 ORDER BY number`
	sqlRunFence = `SELECT fence FROM runs WHERE id = $1`
)

// scanRun reads the runCols of one row, followed by extra destinations.
func scanRun(row pgx.Row, extra ...any) (checkpoint.Run, error) {
	var r checkpoint.Run
	var owner, queue, limitKey pgtype.Text
	var params string
	var until, created, updated, finished, pruned, avail pgtype.Timestamptz
	dest := append([]any{&r.ID, &r.Job, &r.RunKey, &params, &r.ParamsHash, &r.Status, &r.Fence,
		&owner, &until, &r.Error, &created, &updated, &finished, &pruned,
		&queue, &r.Priority, &avail, &limitKey, &r.Limit.Max}, extra...)
	if err := row.Scan(dest...); err != nil {
		return checkpoint.Run{}, err
	}
	r.Queue = queue.String
	r.AvailableAt = tm(avail)
	r.Limit.Key = limitKey.String
	if r.Limit.Key == "" {
		r.Limit.Max = 0
	}
	r.Params = []byte(params)
	r.LeaseOwner = owner.String
	r.LeaseUntil = tm(until)
	r.CreatedAt = tm(created)
	r.UpdatedAt = tm(updated)
	r.FinishedAt = tm(finished)
	r.PrunedAt = tm(pruned)
	return r, nil
}

// tm returns a scanned timestamptz in UTC, the zero time for NULL.
func tm(t pgtype.Timestamptz) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time.UTC()
}

// Runs implements checkpoint.Store.
func (s *Store) Runs(ctx context.Context, f checkpoint.RunFilter) ([]checkpoint.Run, error) {
	limit := f.PageLimit()
	var afterAt *time.Time
	var afterID string
	if f.After != nil {
		afterAt, afterID = &f.After.CreatedAt, f.After.ID
	}
	rows, err := s.pool.Query(ctx, sqlListRuns, f.Job, f.Status, limit, f.RunKeyPrefix,
		ts(f.CreatedFrom), ts(f.CreatedBefore), afterAt, afterID)
	if err != nil {
		return nil, s.wrap("list runs", err)
	}
	defer rows.Close()
	runs, err := rowscan.Collect(rows, func(r rowscan.Rows) (checkpoint.Run, error) { return scanRun(r) })
	return runs, s.wrap("list runs", err)
}

// Run implements checkpoint.Store.
func (s *Store) Run(ctx context.Context, runID string) (checkpoint.RunInfo, error) {
	run, err := scanRun(s.pool.QueryRow(ctx, sqlSelectRun, runID))
	if errors.Is(err, pgx.ErrNoRows) {
		return checkpoint.RunInfo{}, fmt.Errorf("%w: no run %q in %s", checkpoint.ErrNotFound, runID, s.where)
	}
	if err != nil {
		return checkpoint.RunInfo{}, s.wrap("read run "+runID, err)
	}
	info := checkpoint.RunInfo{Run: run}
	rows, err := s.pool.Query(ctx, sqlAttempts, runID)
	if err != nil {
		return checkpoint.RunInfo{}, s.wrap("read attempts of "+runID, err)
	}
	defer rows.Close()
	info.Attempts, err = rowscan.Collect(rows, func(r rowscan.Rows) (checkpoint.Attempt, error) {
		a := checkpoint.Attempt{RunID: runID}
		var started, finished pgtype.Timestamptz
		err := r.Scan(&a.Number, &a.Fence, &a.Owner, &a.Status, &a.Error, &started, &finished)
		a.StartedAt, a.FinishedAt = tm(started), tm(finished)
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
	err := s.pool.QueryRow(ctx, sqlRunFence, runID).Scan(&fence)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("%w: no run %q in %s", checkpoint.ErrNotFound, runID, s.where)
	}
	return fence, s.wrap("read fence of "+runID, err)
}
