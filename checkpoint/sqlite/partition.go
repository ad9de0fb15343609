package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

const (
	partitionCols = `run_id, step_id, idx, count, rule, key_from, key_to, state, owner, fence, lease_until,
    high_water, done, rejected, skipped, executed, total, error, updated_at`
	sqlCountPartitions = `SELECT count(*) FROM partitions WHERE run_id = ? AND step_id = ?`
	// sqlInsertPartition records a partition at the run's fence - 1, so
	// its first claim gets the run's fence (see checkpoint.PartitionStore).
	sqlInsertPartition  = `INSERT INTO partitions (` + partitionCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', '', ?, NULL, '', 0, 0, 0, 0, ?, '', ?)`
	sqlReopenPartitions = `UPDATE partitions SET state = 'pending', fence = fence + 1, owner = '', lease_until = NULL, error = '', updated_at = ?
WHERE run_id = ? AND step_id = ? AND state = 'failed'`
	sqlPartitionsOfStep = `SELECT ` + partitionCols + ` FROM partitions WHERE run_id = ? AND step_id = ? ORDER BY idx`
	sqlPartitionsOfRun  = `SELECT ` + partitionCols + ` FROM partitions WHERE run_id = ? ORDER BY step_id, idx`
	sqlPartition        = `SELECT ` + partitionCols + ` FROM partitions WHERE run_id = ? AND step_id = ? AND idx = ?`
	// sqlClaimablePartition finds a pending partition, or a running one
	// whose lease passed, of a running run; pending ones first.
	sqlClaimablePartition = `SELECT p.run_id, p.step_id, p.idx, p.fence FROM partitions AS p JOIN runs AS r ON r.id = p.run_id
WHERE r.status = 'running' AND (?1 = '' OR p.run_id = ?1) AND (?2 = '' OR p.step_id = ?2)
  AND (?4 = '[]' OR r.job IN (SELECT value FROM json_each(?4)))
  AND (?5 = '[]' OR r.queue IN (SELECT value FROM json_each(?5)))
  AND (p.state = 'pending' OR (p.state = 'running' AND p.lease_until <= ?3))
ORDER BY p.state = 'running', p.run_id, p.step_id, p.idx LIMIT 1`
	// sqlGonePartition finds one partition still at a fence (its holder
	// known gone), of a running run.
	sqlGonePartition = `SELECT p.run_id, p.step_id, p.idx, p.fence FROM partitions AS p JOIN runs AS r ON r.id = p.run_id
WHERE r.status = 'running' AND p.run_id = ? AND p.step_id = ? AND p.idx = ? AND p.fence = ? AND p.state IN ('pending', 'running')`
	// sqlReleasePartition hands a running partition back (pending) where
	// it is still at the holder's fence, whatever its run's state.
	sqlReleasePartition = `UPDATE partitions SET state = 'pending', lease_until = NULL, high_water = ?, done = ?, rejected = ?,
    skipped = ?, executed = ?, error = '', updated_at = ?
WHERE run_id = ? AND step_id = ? AND idx = ? AND fence = ? AND state = 'running'`
	sqlTakePartition = `UPDATE partitions SET state = 'running', fence = fence + 1, owner = ?, lease_until = ?, updated_at = ?
WHERE run_id = ? AND step_id = ? AND idx = ? AND fence = ?`
	sqlRunAttempt = `SELECT COALESCE(MAX(number), 0) FROM attempts WHERE run_id = ?`
	// sqlPartitionFence is a partition write's first statement: it
	// extends the lease where the partition is still at the holder's
	// fence, running, of a running run.
	sqlPartitionFence = `UPDATE partitions SET lease_until = ?, updated_at = ?
WHERE run_id = ? AND step_id = ? AND idx = ? AND fence = ? AND state = 'running'
  AND EXISTS (SELECT 1 FROM runs WHERE id = ? AND status = 'running')`
	sqlPartitionProgress = `UPDATE partitions SET high_water = ?, done = ?, rejected = ?, skipped = ?, executed = ?,
    state = CASE WHEN ?6 = '' THEN state ELSE ?6 END, error = ?,
    lease_until = CASE WHEN ?6 = '' THEN lease_until END, updated_at = ?
WHERE run_id = ? AND step_id = ? AND idx = ? AND fence = ?`
)

func scanPartition(row rowScanner) (checkpoint.Partition, error) {
	var p checkpoint.Partition
	var until, updated sql.NullString
	err := row.Scan(&p.RunID, &p.Step, &p.Index, &p.Count, &p.Rule, &p.From, &p.To, &p.State, &p.Owner, &p.Fence, &until,
		&p.HighWater, &p.Done, &p.Rejected, &p.Skipped, &p.Executed, &p.Total, &p.Error, &updated)
	p.LeaseUntil, p.UpdatedAt = parseTime(until), parseTime(updated)
	return p, err
}

// errPartitionStep refuses a step checkpoint written in a partition's
// transaction: only the run's owner writes the run's steps.
func errPartitionStep(runID, step string) error {
	return fmt.Errorf("checkpoint: step %s of run %s cannot be written in a partition's transaction; only the run's owner records steps", step, runID)
}

// StartPartitioned implements checkpoint.PartitionStore.
func (s *Store) StartPartitioned(ctx context.Context, l checkpoint.Lease, head checkpoint.Step, ps []checkpoint.Partition) ([]checkpoint.Partition, error) {
	var out []checkpoint.Partition
	err := s.tx(ctx, "start partitioned step "+head.ID+" of "+l.RunID, func(tx *sql.Tx) error {
		t := &sqliteTx{ctx: ctx, s: s, tx: tx, lease: l, put: tx.StmtContext(ctx, s.stmt.putStep)}
		if err := t.PutStep(head); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRowContext(ctx, sqlCountPartitions, l.RunID, head.ID).Scan(&n); err != nil {
			return err
		}
		now := fmtTime(head.StartedAt)
		if n == 0 {
			for _, p := range ps {
				if _, err := tx.ExecContext(ctx, sqlInsertPartition, l.RunID, head.ID, p.Index, p.Count, p.Rule, p.From, p.To, l.Fence-1, p.Total, now); err != nil {
					return fmt.Errorf("checkpoint: record partition %d of %s: %w", p.Index, head.ID, err)
				}
			}
		} else if _, err := tx.ExecContext(ctx, sqlReopenPartitions, now, l.RunID, head.ID); err != nil {
			return err
		}
		var err error
		out, err = queryPartitions(ctx, tx, sqlPartitionsOfStep, l.RunID, head.ID)
		return err
	})
	return out, err
}

type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func queryPartitions(ctx context.Context, q queryer, query string, args ...any) ([]checkpoint.Partition, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []checkpoint.Partition
	for rows.Next() {
		p, err := scanPartition(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// Partitions implements checkpoint.PartitionStore.
func (s *Store) Partitions(ctx context.Context, runID, step string) ([]checkpoint.Partition, error) {
	var (
		ps  []checkpoint.Partition
		err error
	)
	if step == "" {
		ps, err = queryPartitions(ctx, s.rdb, sqlPartitionsOfRun, runID)
	} else {
		ps, err = queryPartitions(ctx, s.rdb, sqlPartitionsOfStep, runID, step)
	}
	return ps, s.wrap("read partitions of "+runID, err)
}

// ClaimPartition implements checkpoint.PartitionStore. The database's one
// write lock serialises claimers, so no two get one partition.
func (s *Store) ClaimPartition(ctx context.Context, req checkpoint.PartitionClaim) (checkpoint.Partition, checkpoint.PartitionLease, bool, error) {
	if err := req.Validate(true); err != nil {
		return checkpoint.Partition{}, checkpoint.PartitionLease{}, false, err
	}
	var (
		p  checkpoint.Partition
		l  checkpoint.PartitionLease
		ok bool
	)
	err := s.tx(ctx, "claim a partition", func(tx *sql.Tx) error {
		var row *sql.Row
		if req.AtFence > 0 {
			row = tx.QueryRowContext(ctx, sqlGonePartition, req.RunID, req.Step, req.Index, req.AtFence)
		} else {
			jobNames, err := json.Marshal(nonNil(req.Jobs))
			if err != nil {
				return err
			}
			queues, err := json.Marshal(nonNil(req.Queues))
			if err != nil {
				return err
			}
			row = tx.QueryRowContext(ctx, sqlClaimablePartition, req.RunID, req.Step, fmtTime(req.Now), string(jobNames), string(queues))
		}
		var run, step string
		var idx int
		var fence int64
		switch err := row.Scan(&run, &step, &idx, &fence); {
		case errors.Is(err, sql.ErrNoRows):
			return nil
		case err != nil:
			return err
		}
		now := fmtTime(req.Now)
		if _, err := tx.ExecContext(ctx, sqlTakePartition, req.Owner, fmtTime(req.Now.Add(req.LeaseFor)), now, run, step, idx, fence); err != nil {
			return err
		}
		var err error
		if p, err = scanPartition(tx.QueryRowContext(ctx, sqlPartition, run, step, idx)); err != nil {
			return err
		}
		var attempt int
		if err := tx.QueryRowContext(ctx, sqlRunAttempt, run).Scan(&attempt); err != nil {
			return err
		}
		l = checkpoint.PartitionLease{RunID: run, Step: step, Index: idx, Fence: p.Fence, Owner: req.Owner, Attempt: attempt}
		ok = true
		return nil
	})
	return p, l, ok, err
}

// InPartitionTx implements checkpoint.PartitionStore.
func (s *Store) InPartitionTx(ctx context.Context, w checkpoint.PartitionWrite, fn func(checkpoint.Tx) error) error {
	pl := w.Lease
	return s.tx(ctx, fmt.Sprintf("write partition %d of %s of run %s", pl.Index, pl.Step, pl.RunID), func(tx *sql.Tx) error {
		if err := s.partitionFence(ctx, tx, w); err != nil {
			return err
		}
		t := &sqliteTx{ctx: ctx, s: s, tx: tx, lease: checkpoint.Lease{RunID: pl.RunID, Attempt: pl.Attempt, Owner: pl.Owner},
			put: tx.StmtContext(ctx, s.stmt.putStep), fenced: true, part: true}
		if err := fn(t); err != nil {
			return err
		}
		if w.Progress == nil {
			return nil
		}
		return s.partitionProgress(ctx, tx, w, w.Progress())
	})
}

// partitionFence is a partition write's first statement (see
// sqlPartitionFence); when it changes nothing it says why.
func (s *Store) partitionFence(ctx context.Context, tx *sql.Tx, w checkpoint.PartitionWrite) error {
	pl := w.Lease
	res, err := tx.ExecContext(ctx, sqlPartitionFence, fmtTime(w.Now.Add(w.LeaseFor)), fmtTime(w.Now),
		pl.RunID, pl.Step, pl.Index, pl.Fence, pl.RunID)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	p, err := scanPartition(tx.QueryRowContext(ctx, sqlPartition, pl.RunID, pl.Step, pl.Index))
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: partition %d of %s of run %s is no longer recorded (the step was reset); this holder writes nothing more",
			checkpoint.ErrFenced, pl.Index, pl.Step, pl.RunID)
	}
	if err != nil {
		return err
	}
	return checkpoint.PartitionFenced(pl, p)
}

func (s *Store) partitionProgress(ctx context.Context, tx *sql.Tx, w checkpoint.PartitionWrite, p checkpoint.PartitionProgress) error {
	pl := w.Lease
	_, err := tx.ExecContext(ctx, sqlPartitionProgress, p.HighWater, p.Done, p.Rejected, p.Skipped, p.Executed, p.State, p.Error,
		fmtTime(w.Now), pl.RunID, pl.Step, pl.Index, pl.Fence)
	return err
}

// HeartbeatPartition implements checkpoint.PartitionStore.
func (s *Store) HeartbeatPartition(ctx context.Context, l checkpoint.PartitionLease, now time.Time, leaseFor time.Duration) error {
	return s.tx(ctx, fmt.Sprintf("extend the lease of partition %d of %s", l.Index, l.Step), func(tx *sql.Tx) error {
		return s.partitionFence(ctx, tx, checkpoint.PartitionWrite{Lease: l, Now: now, LeaseFor: leaseFor})
	})
}

// EndPartition implements checkpoint.PartitionStore.
// A release (PartitionPending) is fenced by the partition alone, not by
// its run's state: a worker stopping as its run's owner is interrupted
// still hands its partition back, rather than leaving it held until its
// lease passes.
func (s *Store) EndPartition(ctx context.Context, w checkpoint.PartitionWrite, p checkpoint.PartitionProgress) error {
	if p.State != checkpoint.PartitionPending {
		w.Progress = func() checkpoint.PartitionProgress { return p }
		return s.InPartitionTx(ctx, w, func(checkpoint.Tx) error { return nil })
	}
	pl := w.Lease
	return s.tx(ctx, fmt.Sprintf("release partition %d of %s of run %s", pl.Index, pl.Step, pl.RunID), func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, sqlReleasePartition, p.HighWater, p.Done, p.Rejected, p.Skipped, p.Executed, fmtTime(w.Now),
			pl.RunID, pl.Step, pl.Index, pl.Fence)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 1 {
			return err
		}
		cur, err := scanPartition(tx.QueryRowContext(ctx, sqlPartition, pl.RunID, pl.Step, pl.Index))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: partition %d of %s of run %s is no longer recorded (the step was reset); this holder writes nothing more",
				checkpoint.ErrFenced, pl.Index, pl.Step, pl.RunID)
		}
		if err != nil {
			return err
		}
		return checkpoint.PartitionFenced(pl, cur)
	})
}
