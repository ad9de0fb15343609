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

const (
	partitionCols = `p.run_id, p.step_id, p.idx, p.count, p.rule, p.key_from, p.key_to, p.state, p.owner, p.fence, p.lease_until,
    p.high_water, p.done, p.rejected, p.skipped, p.executed, p.total, p.error, p.updated_at`
	// sqlInsertPartitions records a step's split unless one is recorded:
	// a step is never split twice. Its partitions start at fence $10, the
	// run's fence - 1, so a first claim gets the run's fence (see
	// checkpoint.PartitionStore).
	sqlInsertPartitions = `INSERT INTO partitions (run_id, step_id, idx, count, rule, key_from, key_to, state, fence, total, updated_at)
SELECT $1, $2, u.idx, u.count, u.rule, u.key_from, u.key_to, 'pending', $10::bigint, u.total, coalesce($3::timestamptz, now())
FROM unnest($4::integer[], $5::integer[], $6::text[], $7::text[], $8::text[], $9::bigint[]) AS u(idx, count, rule, key_from, key_to, total)
WHERE NOT EXISTS (SELECT 1 FROM partitions WHERE run_id = $1 AND step_id = $2)`
	sqlReopenPartitions = `UPDATE partitions SET state = 'pending', fence = fence + 1, owner = '', lease_until = NULL, error = '',
    updated_at = coalesce($3::timestamptz, now())
WHERE run_id = $1 AND step_id = $2 AND state = 'failed'`
	sqlPartitionsOfStep = `SELECT ` + partitionCols + ` FROM partitions AS p WHERE p.run_id = $1 AND p.step_id = $2 ORDER BY p.idx`
	sqlPartitionsOfRun  = `SELECT ` + partitionCols + ` FROM partitions AS p WHERE p.run_id = $1 ORDER BY p.step_id, p.idx`
	// sqlClaimPartition takes a pending partition, or a running one whose
	// lease passed on the server's clock, of a running run, raising its
	// fence, in one statement: rows another claimer or a committing chunk
	// holds are skipped, so no two claimers get one partition.
	sqlClaimPartition = `WITH c AS (
    SELECT p.run_id, p.step_id, p.idx FROM partitions AS p JOIN runs AS r ON r.id = p.run_id
    WHERE r.status = 'running' AND ($1 = '' OR p.run_id = $1) AND ($2 = '' OR p.step_id = $2)
      AND (cardinality($6::text[]) = 0 OR r.job = ANY($6::text[]))
      AND (cardinality($7::text[]) = 0 OR r.queue = ANY($7::text[]))
      AND (p.state = 'pending' OR (p.state = 'running' AND p.lease_until <= coalesce($3::timestamptz, now())))
    ORDER BY p.state = 'running', p.run_id, p.step_id, p.idx
    LIMIT 1 FOR UPDATE OF p SKIP LOCKED
)
UPDATE partitions AS p SET state = 'running', fence = p.fence + 1, owner = $4,
    lease_until = coalesce($3::timestamptz, now()) + $5::bigint * interval '1 microsecond', updated_at = coalesce($3::timestamptz, now())
FROM c WHERE p.run_id = c.run_id AND p.step_id = c.step_id AND p.idx = c.idx
RETURNING ` + partitionCols + `, (SELECT coalesce(max(number), 0) FROM attempts WHERE run_id = p.run_id)`
	// sqlClaimGonePartition takes one partition still at a given fence
	// (its holder known gone), whatever its lease.
	sqlClaimGonePartition = `UPDATE partitions AS p SET state = 'running', fence = p.fence + 1, owner = $4,
    lease_until = coalesce($3::timestamptz, now()) + $5::bigint * interval '1 microsecond', updated_at = coalesce($3::timestamptz, now())
WHERE p.run_id = $1 AND p.step_id = $2 AND p.idx = $6 AND p.fence = $7 AND p.state IN ('pending', 'running')
  AND EXISTS (SELECT 1 FROM runs WHERE id = $1 AND status = 'running')
RETURNING ` + partitionCols + `, (SELECT coalesce(max(number), 0) FROM attempts WHERE run_id = p.run_id)`
	// sqlNotifyPartitions wakes the workers listening on the queue's
	// channel (WakeOnEnqueue) when the transaction commits: partitions
	// became claimable.
	sqlNotifyPartitions = `SELECT pg_notify('` + queueChannel + `', '')`
	// sqlReleasePartition hands a running partition back (pending) where
	// it is still at the holder's fence, whatever its run's state, and
	// wakes the workers when it did.
	sqlReleasePartition = `WITH u AS (
    UPDATE partitions SET state = 'pending', lease_until = NULL, high_water = $5, done = $6, rejected = $7, skipped = $8,
        executed = $9, error = '', updated_at = coalesce($10::timestamptz, now())
    WHERE run_id = $1 AND step_id = $2 AND idx = $3 AND fence = $4 AND state = 'running'
    RETURNING 1
)
SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM (SELECT pg_notify('` + queueChannel + `', '') FROM u) n)`
	sqlPartitionFence    = `SELECT stepwise_partition_fence($1, $2, $3, $4, $5, $6)`
	sqlPartitionProgress = `UPDATE partitions SET high_water = $5, done = $6, rejected = $7, skipped = $8, executed = $9,
    state = CASE WHEN $10::text = '' THEN state ELSE $10::text END, error = $11,
    lease_until = CASE WHEN $10::text = '' THEN lease_until END, updated_at = coalesce($12::timestamptz, now())
WHERE run_id = $1 AND step_id = $2 AND idx = $3 AND fence = $4`
)

func scanPartition(row pgx.Row, extra ...any) (checkpoint.Partition, error) {
	var p checkpoint.Partition
	var until pgtype.Timestamptz
	dest := []any{&p.RunID, &p.Step, &p.Index, &p.Count, &p.Rule, &p.From, &p.To, &p.State, &p.Owner, &p.Fence, &until,
		&p.HighWater, &p.Done, &p.Rejected, &p.Skipped, &p.Executed, &p.Total, &p.Error, &p.UpdatedAt}
	err := row.Scan(append(dest, extra...)...)
	if until.Valid {
		p.LeaseUntil = until.Time
	}
	return p, err
}

// errPartitionStep refuses a step checkpoint written in a partition's
// transaction: only the run's owner writes the run's steps.
func errPartitionStep(runID, step string) error {
	return fmt.Errorf("checkpoint: step %s of run %s cannot be written in a partition's transaction; only the run's owner records steps", step, runID)
}

// queueFence queues the transaction's fence check: the run's, or in a
// partition's transaction the partition's (which extends its lease).
func (t *pgTx) queueFence(b *pgx.Batch) {
	if w := t.part; w != nil {
		b.Queue(sqlPartitionFence, w.Lease.RunID, w.Lease.Step, w.Lease.Index, w.Lease.Fence, w.LeaseFor.Microseconds(), t.s.clock(w.Now))
		return
	}
	b.Queue(sqlFence, t.lease.RunID, t.lease.Fence)
}

// partitionProgress records a partition's progress as the transaction's
// last write.
func (t *pgTx) partitionProgress(p checkpoint.PartitionProgress) error {
	w := t.part
	b := &pgx.Batch{}
	b.Queue(sqlPartitionProgress, w.Lease.RunID, w.Lease.Step, w.Lease.Index, w.Lease.Fence, p.HighWater,
		p.Done, p.Rejected, p.Skipped, p.Executed, p.State, p.Error, t.s.clock(w.Now))
	// Queued (nothing sent yet: it goes behind the fence check in InTx's
	// one round trip) or pending (with COMMIT).
	return t.write(b, nil)
}

// StartPartitioned implements checkpoint.PartitionStore.
func (s *Store) StartPartitioned(ctx context.Context, l checkpoint.Lease, head checkpoint.Step, ps []checkpoint.Partition) ([]checkpoint.Partition, error) {
	var out []checkpoint.Partition
	err := s.InTx(ctx, l, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(head); err != nil {
			return err
		}
		conn, err := Conn(tx)
		if err != nil {
			return err
		}
		n := len(ps)
		idx, count, totals := make([]int32, n), make([]int32, n), make([]int64, n)
		rules, froms, tos := make([]string, n), make([]string, n), make([]string, n)
		for i, p := range ps {
			idx[i], count[i], rules[i], froms[i], tos[i], totals[i] = int32(p.Index), int32(p.Count), p.Rule, p.From, p.To, p.Total
		}
		b := &pgx.Batch{}
		b.Queue(sqlInsertPartitions, l.RunID, head.ID, s.clock(head.StartedAt), idx, count, rules, froms, tos, totals, l.Fence-1)
		b.Queue(sqlReopenPartitions, l.RunID, head.ID, s.clock(head.StartedAt))
		br := conn.SendBatch(ctx, b)
		tag, err := br.Exec()
		claimable := tag.RowsAffected()
		if err == nil && claimable == 0 {
			tag, err = br.Exec()
			claimable = tag.RowsAffected()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err == nil && claimable > 0 {
			// Wake the workers (at commit): there are partitions to claim.
			_, err = conn.Exec(ctx, sqlNotifyPartitions)
		}
		if err != nil {
			return fmt.Errorf("postgres: record partitions of %s: %w", head.ID, err)
		}
		out, err = queryPartitions(ctx, conn, sqlPartitionsOfStep, l.RunID, head.ID)
		return err
	})
	return out, err
}

func queryPartitions(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, query string, args ...any) ([]checkpoint.Partition, error) {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (checkpoint.Partition, error) { return scanPartition(r) })
}

// Partitions implements checkpoint.PartitionStore.
func (s *Store) Partitions(ctx context.Context, runID, step string) ([]checkpoint.Partition, error) {
	var (
		ps  []checkpoint.Partition
		err error
	)
	if step == "" {
		ps, err = queryPartitions(ctx, s.pool, sqlPartitionsOfRun, runID)
	} else {
		ps, err = queryPartitions(ctx, s.pool, sqlPartitionsOfStep, runID, step)
	}
	return ps, s.wrap("read partitions of "+runID, err)
}

// ClaimPartition implements checkpoint.PartitionStore: one statement,
// FOR UPDATE SKIP LOCKED.
func (s *Store) ClaimPartition(ctx context.Context, req checkpoint.PartitionClaim) (checkpoint.Partition, checkpoint.PartitionLease, bool, error) {
	if err := req.Validate(s.cfg.CallerClock); err != nil {
		return checkpoint.Partition{}, checkpoint.PartitionLease{}, false, err
	}
	var row pgx.Row
	if req.AtFence > 0 {
		row = s.pool.QueryRow(ctx, sqlClaimGonePartition, req.RunID, req.Step, s.clock(req.Now), req.Owner, req.LeaseFor.Microseconds(), req.Index, req.AtFence)
	} else {
		row = s.pool.QueryRow(ctx, sqlClaimPartition, req.RunID, req.Step, s.clock(req.Now), req.Owner, req.LeaseFor.Microseconds(),
			nonNil(req.Jobs), nonNil(req.Queues))
	}
	var attempt int
	p, err := scanPartition(row, &attempt)
	if errors.Is(err, pgx.ErrNoRows) {
		return checkpoint.Partition{}, checkpoint.PartitionLease{}, false, nil
	}
	if err != nil {
		return checkpoint.Partition{}, checkpoint.PartitionLease{}, false, s.wrap("claim a partition", err)
	}
	return p, checkpoint.PartitionLease{RunID: p.RunID, Step: p.Step, Index: p.Index, Fence: p.Fence, Owner: req.Owner, Attempt: attempt}, true, nil
}

// InPartitionTx implements checkpoint.PartitionStore: a write
// transaction like InTx's, its first statement stepwise_partition_fence
// in place of the run's fence check.
func (s *Store) InPartitionTx(ctx context.Context, w checkpoint.PartitionWrite, fn func(checkpoint.Tx) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return s.wrap("write partition of run "+w.Lease.RunID, err)
	}
	defer conn.Release()
	l := checkpoint.Lease{RunID: w.Lease.RunID, Attempt: w.Lease.Attempt, Owner: w.Lease.Owner}
	return s.runTx(&pgTx{ctx: ctx, s: s, conn: conn.Conn(), lease: l, part: &w}, fn)
}

// HeartbeatPartition implements checkpoint.PartitionStore.
func (s *Store) HeartbeatPartition(ctx context.Context, l checkpoint.PartitionLease, now time.Time, leaseFor time.Duration) error {
	_, err := s.pool.Exec(ctx, sqlPartitionFence, l.RunID, l.Step, l.Index, l.Fence, leaseFor.Microseconds(), s.clock(now))
	if err != nil {
		t := &pgTx{s: s, lease: checkpoint.Lease{RunID: l.RunID}}
		return s.wrap("extend the lease of a partition", t.fenceError(err))
	}
	return nil
}

// EndPartition implements checkpoint.PartitionStore.
// A release (PartitionPending) is fenced by the partition alone, not by
// its run's state: a worker stopping as its run's owner is interrupted
// still hands its partition back, rather than leaving it held until its
// lease passes. It wakes the workers listening (WakeOnEnqueue).
func (s *Store) EndPartition(ctx context.Context, w checkpoint.PartitionWrite, p checkpoint.PartitionProgress) error {
	if p.State != checkpoint.PartitionPending {
		w.Progress = func() checkpoint.PartitionProgress { return p }
		return s.InPartitionTx(ctx, w, func(checkpoint.Tx) error { return nil })
	}
	pl := w.Lease
	var n, notified int64
	err := s.pool.QueryRow(ctx, sqlReleasePartition, pl.RunID, pl.Step, pl.Index, pl.Fence,
		p.HighWater, p.Done, p.Rejected, p.Skipped, p.Executed, s.clock(w.Now)).Scan(&n, &notified)
	if err != nil {
		return s.wrap("release a partition", err)
	}
	if n == 1 {
		return nil
	}
	ps, err := s.Partitions(ctx, pl.RunID, pl.Step)
	if err != nil {
		return err
	}
	for _, cur := range ps {
		if cur.Index == pl.Index {
			return checkpoint.PartitionFenced(pl, cur)
		}
	}
	return fmt.Errorf("%w: partition %d of %s of run %s is no longer recorded (the step was reset); this holder writes nothing more",
		checkpoint.ErrFenced, pl.Index, pl.Step, pl.RunID)
}
