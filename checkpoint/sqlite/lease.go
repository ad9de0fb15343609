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
	runCols = `id, job, run_key, params, params_hash, status, fence,
       lease_owner, lease_until, error, created_at, updated_at, finished_at, pruned_at,
       queue, priority, available_at, limit_key, limit_max`
	sqlSelectRun = `SELECT ` + runCols + ` FROM runs WHERE id = ?`
	sqlInsertRun = `INSERT INTO runs (id, job, run_key, params, params_hash, status, fence,
                  lease_owner, lease_until, created_at, updated_at, limit_key, limit_max)
VALUES (?, ?, ?, ?, ?, 'running', 1, ?, ?, ?, ?, NULLIF(?, ''), ?)`
	// sqlTakeRun raises the fence and takes the lease; a claim that names
	// a limit records it with the run (ClaimNext keeps the run's own).
	sqlTakeRun = `UPDATE runs SET status = 'running', fence = fence + 1, lease_owner = ?1, lease_until = ?2,
    error = '', updated_at = ?3, finished_at = NULL,
    limit_key = CASE WHEN ?6 = '' THEN limit_key ELSE ?6 END,
    limit_max = CASE WHEN ?6 = '' THEN limit_max ELSE ?7 END
WHERE id = ?4 AND fence = ?5`
	// sqlLimitHolders lists the runs other than ?3 holding limit ?1 with
	// a live lease at ?2.
	sqlLimitHolders = `SELECT id FROM runs
WHERE limit_key = ?1 AND status = 'running' AND lease_until > ?2 AND id <> ?3
ORDER BY id`
	sqlLoseAttempts = `UPDATE attempts SET status = 'lost', finished_at = ?,
    error = 'runner stopped without recording an end; taken over by ' || ?
WHERE run_id = ? AND finished_at IS NULL`
	sqlNextAttempt   = `SELECT COALESCE(MAX(number), 0) + 1 FROM attempts WHERE run_id = ?`
	sqlInsertAttempt = `INSERT INTO attempts (run_id, number, fence, owner, status, started_at)
VALUES (?, ?, ?, ?, 'running', ?)`
	// sqlHeartbeat extends a live lease: one still the holder's (fence),
	// running, and not expired at the caller's now (an expired one is not
	// renewed, see checkpoint.LeaseExpired).
	sqlHeartbeat = `UPDATE runs SET lease_until = ?1, updated_at = ?2
WHERE id = ?3 AND fence = ?4 AND status = 'running' AND lease_until > ?2`
	sqlFinishRun = `UPDATE runs SET status = ?, error = ?, lease_owner = NULL, lease_until = NULL,
    updated_at = ?, finished_at = CASE WHEN ? IN ('succeeded', 'abandoned') THEN ? ELSE NULL END,
    available_at = coalesce(?, available_at)
WHERE id = ? AND fence = ?`
	sqlFinishAttempt = `UPDATE attempts SET status = ?, error = ?, finished_at = ?
WHERE run_id = ? AND number = ?`
)

type rowScanner interface{ Scan(dest ...any) error }

func scanRun(row rowScanner) (checkpoint.Run, error) {
	var r checkpoint.Run
	var owner, until, created, updated, finished, pruned, queue, avail, limitKey sql.NullString
	var params string
	err := row.Scan(&r.ID, &r.Job, &r.RunKey, &params, &r.ParamsHash, &r.Status, &r.Fence,
		&owner, &until, &r.Error, &created, &updated, &finished, &pruned,
		&queue, &r.Priority, &avail, &limitKey, &r.Limit.Max)
	if err != nil {
		return checkpoint.Run{}, err
	}
	r.Queue = queue.String
	r.AvailableAt = parseTime(avail)
	r.Limit.Key = limitKey.String
	if r.Limit.Key == "" {
		r.Limit.Max = 0
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
		if err := checkLimit(ctx, tx, req.RunID, req.Limit, now); err != nil {
			return checkpoint.Claim{}, err
		}
		if _, err := tx.ExecContext(ctx, sqlInsertRun, req.RunID, req.Job, req.RunKey, string(req.Params),
			req.ParamsHash, req.Owner, until, now, now, req.Limit.Key, req.Limit.Max); err != nil {
			return checkpoint.Claim{}, err
		}
		if _, err := tx.ExecContext(ctx, sqlInsertAttempt, req.RunID, 1, 1, req.Owner, now); err != nil {
			return checkpoint.Claim{}, err
		}
		run, err = scanRun(tx.QueryRowContext(ctx, sqlSelectRun, req.RunID))
		if err != nil {
			return checkpoint.Claim{}, err
		}
		if err := insertAudits(ctx, tx, req.Audits...); err != nil {
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
	limit := req.Limit
	if limit.IsZero() {
		limit = run.Limit
	}
	if err := checkLimit(ctx, tx, run.ID, limit, now); err != nil {
		return checkpoint.Claim{}, err
	}
	c, err := takeTx(ctx, tx, run, take, req.Owner, req.Now, req.LeaseFor, req.Limit)
	if err != nil {
		return checkpoint.Claim{}, err
	}
	// After the take, in its transaction: a record refused undoes it.
	if err := insertAudits(ctx, tx, req.Audits...); err != nil {
		return checkpoint.Claim{}, err
	}
	return c, nil
}

// takeTx takes over run (as read in the transaction): raises its fence,
// takes the lease, marks unfinished attempts lost and records the new
// attempt. A non-zero limit is recorded with the run.
func takeTx(ctx context.Context, tx *sql.Tx, run checkpoint.Run, take checkpoint.Takeover, owner string,
	at time.Time, leaseFor time.Duration, limit checkpoint.Limit) (checkpoint.Claim, error) {
	now, until := fmtTime(at), fmtTime(at.Add(leaseFor))
	res, err := tx.ExecContext(ctx, sqlTakeRun, owner, until, now, run.ID, run.Fence, limit.Key, limit.Max)
	if err != nil {
		return checkpoint.Claim{}, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return checkpoint.Claim{}, fmt.Errorf("%w: run %s changed while being claimed", checkpoint.ErrFenced, run.ID)
	}
	if _, err := tx.ExecContext(ctx, sqlLoseAttempts, now, checkpoint.OwnerName(owner), run.ID); err != nil {
		return checkpoint.Claim{}, err
	}
	var number int
	if err := tx.QueryRowContext(ctx, sqlNextAttempt, run.ID).Scan(&number); err != nil {
		return checkpoint.Claim{}, err
	}
	fence := run.Fence + 1
	if _, err := tx.ExecContext(ctx, sqlInsertAttempt, run.ID, number, fence, owner, now); err != nil {
		return checkpoint.Claim{}, err
	}
	previous := run.Status
	run, err = scanRun(tx.QueryRowContext(ctx, sqlSelectRun, run.ID))
	if err != nil {
		return checkpoint.Claim{}, err
	}
	return checkpoint.Claim{
		Lease:              checkpoint.Lease{RunID: run.ID, Fence: fence, Attempt: number, Owner: owner},
		Run:                run,
		TookOverFrom:       take.From,
		PreviousStatus:     previous,
		PreviousLeaseUntil: take.LeaseUntil,
	}, nil
}

// checkLimit refuses to start runID when limit's holders other than it
// (live leases at now) already number limit.Max. The caller's BEGIN
// IMMEDIATE transaction keeps every other claim out until it commits.
func checkLimit(ctx context.Context, tx *sql.Tx, runID string, limit checkpoint.Limit, now string) error {
	if limit.IsZero() {
		return nil
	}
	holders, err := limitHolders(ctx, tx, limit.Key, now, runID)
	if err != nil {
		return err
	}
	if len(holders) >= limit.Max {
		return &checkpoint.LimitReachedError{RunID: runID, Limit: limit, Holders: holders}
	}
	return nil
}

// limitHolders lists the runs other than runID holding key with a live
// lease at now.
func limitHolders(ctx context.Context, tx *sql.Tx, key, now, runID string) ([]string, error) {
	rows, err := tx.QueryContext(ctx, sqlLimitHolders, key, now, runID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
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
		// Say why: an expired lease still the holder's, or fenced.
		if run, err := scanRun(s.db.QueryRowContext(ctx, sqlSelectRun, l.RunID)); err == nil &&
			run.Fence == l.Fence && run.Status == checkpoint.RunRunning && !now.Before(run.LeaseUntil) {
			return checkpoint.LeaseExpired(l, run.LeaseUntil, now)
		}
		return fmt.Errorf("%w: run %s, attempt %d (fence %d)", checkpoint.ErrFenced, l.RunID, l.Attempt, l.Fence)
	}
	return nil
}

// Finish implements checkpoint.Store.
func (s *Store) Finish(ctx context.Context, l checkpoint.Lease, e checkpoint.Ending) error {
	return s.tx(ctx, "finish run "+l.RunID, func(tx *sql.Tx) error { return finishTx(ctx, tx, l, e) })
}

// finishTx ends l's run and attempt in tx, checked against the fence.
func finishTx(ctx context.Context, tx *sql.Tx, l checkpoint.Lease, e checkpoint.Ending) error {
	at := fmtTime(e.At)
	var avail any // NULL keeps available_at
	if e.RetryAfter > 0 {
		avail = fmtTime(e.At.Add(e.RetryAfter))
	}
	res, err := tx.ExecContext(ctx, sqlFinishRun, e.Status, e.Error, at, e.Status, at, avail, l.RunID, l.Fence)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: run %s, attempt %d (fence %d)", checkpoint.ErrFenced, l.RunID, l.Attempt, l.Fence)
	}
	_, err = tx.ExecContext(ctx, sqlFinishAttempt, e.Status, e.Error, at, l.RunID, l.Attempt)
	return err
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
