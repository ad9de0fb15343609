package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"

	"github.com/stepwise-run/stepwise/checkpoint"
)

const (
	sqlEnqueueRun = `INSERT INTO runs (id, job, run_key, params, params_hash, status, fence,
                  created_at, updated_at, queue, priority, available_at, limit_key, limit_max)
VALUES (?, ?, ?, ?, ?, 'queued', 0, ?, ?, ?, ?, ?, NULLIF(?, ''), ?)`
	// sqlNextRun is the first run ClaimNext may take at ?1: due, of the
	// queues ?2 and jobs ?3 (JSON arrays; empty matches all), its limit
	// not full.
	sqlNextRun = `SELECT ` + runCols + ` FROM runs r
WHERE queue IS NOT NULL AND status IN ('queued', 'interrupted', 'running')
  AND ((status IN ('queued', 'interrupted') AND available_at <= ?1) OR (status = 'running' AND lease_until <= ?1))
  AND (?2 = '[]' OR queue IN (SELECT value FROM json_each(?2)))
  AND (?3 = '[]' OR job IN (SELECT value FROM json_each(?3)))
  AND (limit_key IS NULL OR limit_max > (SELECT count(*) FROM runs h
      WHERE h.limit_key = r.limit_key AND h.status = 'running' AND h.lease_until > ?1 AND h.id <> r.id))
ORDER BY priority DESC, available_at, id
LIMIT 1`
)

// Enqueue implements checkpoint.QueueStore.
func (s *Store) Enqueue(ctx context.Context, req checkpoint.EnqueueRequest) (checkpoint.EnqueueResult, error) {
	if err := req.Validate(true); err != nil {
		return checkpoint.EnqueueResult{}, err
	}
	var res checkpoint.EnqueueResult
	err := s.tx(ctx, "enqueue run "+req.RunID, func(tx *sql.Tx) error {
		run, err := scanRun(tx.QueryRowContext(ctx, sqlSelectRun, req.RunID))
		switch {
		case err == nil:
			res.Run = run
			return checkpoint.MayEnqueue(run, req)
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		now := fmtTime(req.Now)
		avail := req.Now
		if req.NotBefore.After(avail) {
			avail = req.NotBefore
		}
		if _, err := tx.ExecContext(ctx, sqlEnqueueRun, req.RunID, req.Job, req.RunKey, string(req.Params), req.ParamsHash,
			now, now, req.QueueName(), req.Priority, fmtTime(avail), req.Limit.Key, req.Limit.Max); err != nil {
			return err
		}
		res.Created = true
		res.Run, err = scanRun(tx.QueryRowContext(ctx, sqlSelectRun, req.RunID))
		return err
	})
	if err != nil {
		return checkpoint.EnqueueResult{}, err
	}
	return res, nil
}

// ClaimNext implements checkpoint.QueueStore: ClaimBatch of one run.
func (s *Store) ClaimNext(ctx context.Context, req checkpoint.ClaimNextRequest) (checkpoint.Claim, bool, error) {
	req.Max = 1
	cs, err := s.ClaimBatch(ctx, req)
	if err != nil || len(cs) == 0 {
		return checkpoint.Claim{}, false, err
	}
	return cs[0], true, nil
}

// ClaimBatch implements checkpoint.QueueStore: BEGIN IMMEDIATE keeps
// every other claim out, so the runs it picks, and the limits it counts,
// cannot change before it commits; the batch is one transaction.
func (s *Store) ClaimBatch(ctx context.Context, req checkpoint.ClaimNextRequest) ([]checkpoint.Claim, error) {
	if err := req.Validate(true); err != nil {
		return nil, err
	}
	var cs []checkpoint.Claim
	err := s.tx(ctx, "claim the next queued runs", func(tx *sql.Tx) (err error) {
		cs, err = claimQueuedTx(ctx, tx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	return cs, nil
}

// FinishAndClaim implements checkpoint.QueueStore: the ends and the
// claims in one transaction (one commit). A fenced end writes nothing.
func (s *Store) FinishAndClaim(ctx context.Context, ends []checkpoint.Finished, next checkpoint.ClaimNextRequest) ([]checkpoint.Claim, []error, error) {
	if err := next.Validate(true); err != nil {
		return nil, nil, err
	}
	var (
		cs      []checkpoint.Claim
		results []error
	)
	err := s.tx(ctx, "finish runs and claim the next", func(tx *sql.Tx) (err error) {
		results = make([]error, len(ends))
		for i, f := range ends {
			if err := finishTx(ctx, tx, f.Lease, f.Ending); errors.Is(err, checkpoint.ErrFenced) {
				results[i] = err
			} else if err != nil {
				return err
			}
		}
		cs, err = claimQueuedTx(ctx, tx, next)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return cs, results, nil
}

// claimQueuedTx claims up to req.Max runs in tx, one pick at a time: each pick
// sees the claims before it (a limit filled by the batch itself stops
// it).
func claimQueuedTx(ctx context.Context, tx *sql.Tx, req checkpoint.ClaimNextRequest) ([]checkpoint.Claim, error) {
	queues, _ := json.Marshal(nonNil(req.Queues))
	jobNames, _ := json.Marshal(nonNil(req.Jobs))
	now := fmtTime(req.Now)
	var cs []checkpoint.Claim
	for len(cs) < max(req.Max, 1) {
		run, err := scanRun(tx.QueryRowContext(ctx, sqlNextRun, now, string(queues), string(jobNames)))
		if errors.Is(err, sql.ErrNoRows) {
			break
		}
		if err != nil {
			return nil, err
		}
		var take checkpoint.Takeover
		if run.Status == checkpoint.RunRunning {
			take = checkpoint.Takeover{From: run.LeaseOwner, LeaseUntil: run.LeaseUntil}
		}
		c, err := takeTx(ctx, tx, run, take, req.Owner, req.Now, req.LeaseFor, checkpoint.Limit{})
		if err != nil {
			return nil, err
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// nonNil returns ss, or an empty slice for nil (JSON [] rather than null).
func nonNil(ss []string) []string {
	if ss == nil {
		return []string{}
	}
	return ss
}

// MaintenanceWarnings implements checkpoint.MaintenanceChecker: a SQLite
// database needs none of the housekeeping a queue in service suffers
// without (PostgreSQL's autovacuum), so it finds nothing.
func (s *Store) MaintenanceWarnings(context.Context) ([]string, error) { return nil, nil }
