package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

const (
	sqlSelectRun = `SELECT id, job, run_key, params, params_hash, status, fence,
       lease_owner, lease_until, error, created_at, updated_at, finished_at, pruned_at
FROM runs WHERE id = ?`
	sqlInsertRun = `INSERT INTO runs (id, job, run_key, params, params_hash, status, fence,
                  lease_owner, lease_until, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, 'running', 1, ?, ?, ?, ?)`
	sqlTakeRun = `UPDATE runs SET status = 'running', fence = fence + 1, lease_owner = ?, lease_until = ?,
    error = '', updated_at = ?, finished_at = NULL
WHERE id = ? AND fence = ?`
	sqlLoseAttempts = `UPDATE attempts SET status = 'lost', finished_at = ?,
    error = 'runner stopped without recording an end; taken over by ' || ?
WHERE run_id = ? AND finished_at IS NULL`
	sqlNextAttempt   = `SELECT COALESCE(MAX(number), 0) + 1 FROM attempts WHERE run_id = ?`
	sqlInsertAttempt = `INSERT INTO attempts (run_id, number, fence, owner, status, started_at)
VALUES (?, ?, ?, ?, 'running', ?)`
	sqlHeartbeat = `UPDATE runs SET lease_until = ?, updated_at = ?
WHERE id = ? AND fence = ? AND status = 'running'`
	sqlFinishRun = `UPDATE runs SET status = ?, error = ?, lease_owner = NULL, lease_until = NULL,
    updated_at = ?, finished_at = CASE WHEN ? IN ('succeeded', 'abandoned') THEN ? ELSE NULL END
WHERE id = ? AND fence = ?`
	sqlFinishAttempt = `UPDATE attempts SET status = ?, error = ?, finished_at = ?
WHERE run_id = ? AND number = ?`
)

type rowScanner interface{ Scan(dest ...any) error }

func scanRun(row rowScanner) (checkpoint.Run, error) {
	var r checkpoint.Run
	var owner, until, created, updated, finished, pruned sql.NullString
	var params string
	err := row.Scan(&r.ID, &r.Job, &r.RunKey, &params, &r.ParamsHash, &r.Status, &r.Fence,
		&owner, &until, &r.Error, &created, &updated, &finished, &pruned)
	if err != nil {
		return checkpoint.Run{}, err
	}
	r.Params = []byte(params)
	r.LeaseOwner = owner.String
	r.LeaseUntil = parseTime(until)
	r.CreatedAt = parseTime(created)
	r.UpdatedAt = parseTime(updated)
	r.FinishedAt = parseTime(finished)
	r.PrunedAt = parseTime(pruned)
	return r, nil
}

// Claim implements checkpoint.Store.
func (s *Store) Claim(ctx context.Context, req checkpoint.ClaimRequest) (checkpoint.Claim, error) {
	if err := req.Validate(true); err != nil {
		return checkpoint.Claim{}, err
	}
	var c checkpoint.Claim
	err := s.tx(ctx, "claim run "+req.RunID, func(tx *sql.Tx) error {
		var err error
		c, err = claimTx(ctx, tx, req)
		return err
	})
	return c, err
}

func claimTx(ctx context.Context, tx *sql.Tx, req checkpoint.ClaimRequest) (checkpoint.Claim, error) {
	now := fmtTime(req.Now)
	until := fmtTime(req.Now.Add(req.LeaseFor))
	run, err := scanRun(tx.QueryRowContext(ctx, sqlSelectRun, req.RunID))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if _, err := tx.ExecContext(ctx, sqlInsertRun, req.RunID, req.Job, req.RunKey, string(req.Params),
			req.ParamsHash, req.Owner, until, now, now); err != nil {
			return checkpoint.Claim{}, err
		}
		if _, err := tx.ExecContext(ctx, sqlInsertAttempt, req.RunID, 1, 1, req.Owner, now); err != nil {
			return checkpoint.Claim{}, err
		}
		run, err = scanRun(tx.QueryRowContext(ctx, sqlSelectRun, req.RunID))
		if err != nil {
			return checkpoint.Claim{}, err
		}
		return checkpoint.Claim{Lease: checkpoint.Lease{RunID: req.RunID, Fence: 1, Attempt: 1, Owner: req.Owner}, Run: run, Created: true}, nil
	case err != nil:
		return checkpoint.Claim{}, err
	}
	take, err := checkpoint.MayClaim(run, req, req.Now)
	if err != nil {
		return checkpoint.Claim{}, err
	}
	tookOver, prevUntil := take.From, take.LeaseUntil
	res, err := tx.ExecContext(ctx, sqlTakeRun, req.Owner, until, now, run.ID, run.Fence)
	if err != nil {
		return checkpoint.Claim{}, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return checkpoint.Claim{}, fmt.Errorf("%w: run %s changed while being claimed", checkpoint.ErrFenced, run.ID)
	}
	if _, err := tx.ExecContext(ctx, sqlLoseAttempts, now, checkpoint.OwnerName(req.Owner), run.ID); err != nil {
		return checkpoint.Claim{}, err
	}
	var number int
	if err := tx.QueryRowContext(ctx, sqlNextAttempt, run.ID).Scan(&number); err != nil {
		return checkpoint.Claim{}, err
	}
	fence := run.Fence + 1
	if _, err := tx.ExecContext(ctx, sqlInsertAttempt, run.ID, number, fence, req.Owner, now); err != nil {
		return checkpoint.Claim{}, err
	}
	previous := run.Status
	run, err = scanRun(tx.QueryRowContext(ctx, sqlSelectRun, req.RunID))
	if err != nil {
		return checkpoint.Claim{}, err
	}
	return checkpoint.Claim{
		Lease:              checkpoint.Lease{RunID: run.ID, Fence: fence, Attempt: number, Owner: req.Owner},
		Run:                run,
		TookOverFrom:       tookOver,
		PreviousStatus:     previous,
		PreviousLeaseUntil: prevUntil,
	}, nil
}

// Heartbeat implements checkpoint.Store.
func (s *Store) Heartbeat(ctx context.Context, l checkpoint.Lease, now, until time.Time) error {
	if !until.After(now) {
		return fmt.Errorf("checkpoint: heartbeat of run %s: until (%v) is not after now (%v)", l.RunID, until, now)
	}
	res, err := s.db.ExecContext(ctx, sqlHeartbeat, fmtTime(until), fmtTime(now), l.RunID, l.Fence)
	if err != nil {
		return s.wrap("heartbeat run "+l.RunID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: run %s, attempt %d (fence %d)", checkpoint.ErrFenced, l.RunID, l.Attempt, l.Fence)
	}
	return nil
}

// Finish implements checkpoint.Store.
func (s *Store) Finish(ctx context.Context, l checkpoint.Lease, e checkpoint.Ending) error {
	return s.tx(ctx, "finish run "+l.RunID, func(tx *sql.Tx) error {
		at := fmtTime(e.At)
		res, err := tx.ExecContext(ctx, sqlFinishRun, e.Status, e.Error, at, e.Status, at, l.RunID, l.Fence)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("%w: run %s, attempt %d (fence %d)", checkpoint.ErrFenced, l.RunID, l.Attempt, l.Fence)
		}
		_, err = tx.ExecContext(ctx, sqlFinishAttempt, e.Status, e.Error, at, l.RunID, l.Attempt)
		return err
	})
}

// tx runs fn in one BEGIN IMMEDIATE transaction and maps driver errors.
// Errors fn returns from this package (fencing, conflicts, mismatches) are
// passed through unchanged. If fn panics the transaction is rolled back
// before the panic goes on: left open, it would hold the one writer
// connection (and SQLite's write lock) for good.
func (s *Store) tx(ctx context.Context, op string, fn func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return s.wrap(op, err)
	}
	defer tx.Rollback() // after a commit, a no-op (sql.ErrTxDone)
	if err := fn(tx); err != nil {
		return s.wrap(op, err)
	}
	if err := tx.Commit(); err != nil {
		return s.wrap(op, err)
	}
	return nil
}
