package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stepwise-run/stepwise/checkpoint"
)

// Every operation runs in one transaction that first locks the run row
// FOR UPDATE: a runner's write transaction holds it FOR KEY SHARE, so the
// operation waits for a write in flight to commit, then raises the fence
// and the runner writes nothing more. Times are coalesce($now, now()) as
// in lease.go; the audit row keeps the time the operator's record gives.
const (
	// sqlLockRunOp reads the run to operate on, locked, with the time the
	// lease is judged at.
	sqlLockRunOp = `SELECT ` + runCols + `, coalesce($2::timestamptz, now()) FROM runs WHERE id = $1 FOR UPDATE`
	sqlAudit     = `INSERT INTO audit (run_id, at, operator, command, reason, details)
VALUES ($1, coalesce($2::timestamptz, now()), $3, $4, $5, $6)`
	sqlAudits     = `SELECT at, operator, command, reason, details FROM audit WHERE run_id = $1 ORDER BY id`
	sqlRecoverRun = `UPDATE runs SET status = 'failed', fence = fence + 1, lease_owner = NULL, lease_until = NULL,
    error = $3, updated_at = coalesce($4::timestamptz, now()) WHERE id = $1 AND fence = $2`
	sqlAbandonRun = `UPDATE runs SET status = 'abandoned', fence = fence + 1, lease_owner = NULL, lease_until = NULL,
    error = $3, updated_at = coalesce($4::timestamptz, now()), finished_at = coalesce($4::timestamptz, now())
WHERE id = $1 AND fence = $2`
	// sqlResetRun reopens a run for a reset, a succeeded one as failed. It
	// raises the fence above every fence the run's partitions reached as
	// well (it runs before they are deleted), so the steps' next split
	// never repeats a partition fence (see checkpoint.PartitionStore).
	sqlResetRun = `UPDATE runs SET status = CASE WHEN status = 'succeeded' THEN 'failed' ELSE status END,
    error = CASE WHEN status = 'succeeded' THEN $3 ELSE error END,
    fence = greatest(fence, (SELECT coalesce(max(p.fence), 0) FROM partitions AS p WHERE p.run_id = $1)) + 1,
    updated_at = coalesce($4::timestamptz, now()), finished_at = NULL
WHERE id = $1 AND fence = $2`
	// sqlFenceRun raises the fence of a run whose other columns an
	// operation leaves alone (resolve), so its runner writes nothing more.
	sqlFenceRun = `UPDATE runs SET fence = fence + 1, updated_at = coalesce($3::timestamptz, now())
WHERE id = $1 AND fence = $2`
	sqlEndAttempts = `UPDATE attempts SET status = 'lost', finished_at = coalesce($2::timestamptz, now()), error = $3
WHERE run_id = $1 AND finished_at IS NULL`
	sqlResetSteps      = `DELETE FROM steps WHERE run_id = $1 AND step_id = ANY($2::text[])`
	sqlResetItems      = `DELETE FROM items WHERE run_id = $1 AND step_id = ANY($2::text[])`
	sqlResetChunkPlans = `DELETE FROM chunk_plans WHERE run_id = $1 AND step_id = ANY($2::text[])`
	sqlResetChanges    = `DELETE FROM item_changes WHERE run_id = $1 AND step_id = ANY($2::text[])`
	sqlResetPartitions = `DELETE FROM partitions WHERE run_id = $1 AND step_id = ANY($2::text[])`
	sqlStepStatus      = `SELECT status, call_record, (SELECT coalesce(max(number), 0) FROM attempts WHERE run_id = $1)
FROM steps WHERE run_id = $1 AND step_id = $2 FOR UPDATE`
	sqlResolveStep = `UPDATE steps SET status = $3, output = $4, error = $5, finished_at = coalesce($6::timestamptz, now()),
    call_record = $7 WHERE run_id = $1 AND step_id = $2`
	// sqlRecordedAfter names a step or batch item recorded by an attempt
	// after the given one: what used a resolution made then.
	sqlRecordedAfter = `SELECT step_id FROM steps WHERE run_id = $1 AND attempt > $2
UNION ALL SELECT step_id || '/' || item_key FROM items WHERE run_id = $1 AND attempt > $2 LIMIT 1`

	// prunable selects the runs Prune removes the payloads of, oldest
	// finish first.
	prunable = `status IN ('succeeded', 'abandoned') AND pruned_at IS NULL
    AND finished_at IS NOT NULL AND finished_at < $1`
	sqlPrunable     = `SELECT id FROM runs WHERE ` + prunable + ` ORDER BY finished_at, id`
	sqlLockPrunable = `SELECT id FROM runs WHERE ` + prunable + ` ORDER BY finished_at, id FOR UPDATE`
	// sqlPayloadSizes measures the given runs' payloads, in their order.
	sqlPayloadSizes = `SELECT r.id,
    (SELECT count(*) FROM steps WHERE run_id = r.id),
    (SELECT coalesce(sum(coalesce(octet_length(output), 0) + coalesce(octet_length(plan), 0)), 0)::bigint
       FROM steps WHERE run_id = r.id),
    (SELECT count(*) FROM items WHERE run_id = r.id),
    (SELECT coalesce(sum(coalesce(octet_length(output), 0) + octet_length(error) + octet_length(item_key)), 0)::bigint
       FROM items WHERE run_id = r.id),
    (SELECT count(*) FROM idempotency_keys WHERE run_id = r.id)
FROM unnest($1::text[]) WITH ORDINALITY AS r(id, n) ORDER BY r.n`
	// sqlPruneIdempotency deletes the Idempotency-Keys naming the pruned
	// runs, accepting ones too (the runs are finished, and their
	// tombstones answer a later start with the key), and counts them per
	// run: what went, whatever was recorded since the runs were measured.
	sqlPruneIdempotency = `WITH gone AS (DELETE FROM idempotency_keys WHERE run_id = ANY($1::text[]) RETURNING run_id)
SELECT run_id, count(*) FROM gone GROUP BY run_id`
	sqlPruneSteps      = `UPDATE steps SET output = NULL, plan = NULL WHERE run_id = ANY($1::text[])`
	sqlPruneItems      = `DELETE FROM items WHERE run_id = ANY($1::text[])`
	sqlPruneChunkPlans = `DELETE FROM chunk_plans WHERE run_id = ANY($1::text[])`
	sqlPruneChanges    = `DELETE FROM item_changes WHERE run_id = ANY($1::text[])`
	sqlPrunePartitions = `DELETE FROM partitions WHERE run_id = ANY($1::text[])`
	sqlMarkPruned      = `UPDATE runs SET pruned_at = coalesce($2::timestamptz, now()), updated_at = coalesce($2::timestamptz, now()),
    fence = fence + 1 WHERE id = ANY($1::text[])`
	sqlPruneAudits = `INSERT INTO audit (run_id, at, operator, command, reason, details)
SELECT u.id, coalesce($3::timestamptz, now()), $4, $5, $6, u.details
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(id, details, n) ORDER BY u.n`
)

var _ checkpoint.Operator = (*Store)(nil)

// operate runs fn on the run a names in one transaction, with the run row
// locked, and records the audit row with it. Unless allowLive, a run held
// by a live runner (judged at now, or the server's now()) is refused with
// a *LeaseHeldError. fn gets the run and the time its lease was judged at.
func (s *Store) operate(ctx context.Context, a checkpoint.Audit, now time.Time, o checkpoint.OperateOptions, allowLive bool,
	fn func(tx pgx.Tx, run checkpoint.Run, at time.Time) error) error {
	if err := a.Check(); err != nil { // its text goes into the run's error too
		return fmt.Errorf("%s of %s: %w", a.Command, a.RunID, err)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var at time.Time
		run, err := scanRun(tx.QueryRow(ctx, sqlLockRunOp, a.RunID, s.clock(now)), &at)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: no run %q in %s", checkpoint.ErrNotFound, a.RunID, s.where)
		}
		if err != nil {
			return err
		}
		at = at.UTC()
		if !allowLive && o.Held(run, at) {
			return &checkpoint.LeaseHeldError{RunID: run.ID, Owner: run.LeaseOwner, Until: run.LeaseUntil}
		}
		if err := fn(tx, run, at); err != nil {
			return err
		}
		return insertAudits(ctx, tx, a)
	})
	return s.wrap(a.Command+" "+a.RunID, err)
}

// execer is what an audit record is written through: a transaction, or a
// connection inside one.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// insertAudits writes audit records through q, each checked first
// (checkpoint.Audit.Check, which refuses what the server would: a NUL,
// bytes that are not UTF-8): one refused fails the transaction, and the
// operation it records with it.
func insertAudits(ctx context.Context, q execer, audits ...checkpoint.Audit) error {
	for _, a := range audits {
		if err := a.Check(); err != nil {
			return fmt.Errorf("%s of %s: %w", a.Command, a.RunID, err)
		}
		if _, err := q.Exec(ctx, sqlAudit, a.RunID, ts(a.At), a.Operator, a.Command, a.Reason, a.Details); err != nil {
			return err
		}
	}
	return nil
}

// Recover implements checkpoint.Operator: a stale run (running, lease
// expired or owner gone) is marked failed, its fence raised and its
// unfinished attempt marked lost. A run held by a live runner is refused
// with ErrNotStale wrapping a *LeaseHeldError unless force.
func (s *Store) Recover(ctx context.Context, a checkpoint.Audit, now time.Time, force bool, opts ...checkpoint.OperateOption) error {
	o := checkpoint.NewOperateOptions(opts)
	return s.operate(ctx, a, now, o, true, func(tx pgx.Tx, run checkpoint.Run, at time.Time) error {
		msg, err := checkpoint.Recovery(run, a, o.Held(run, at), force)
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(sqlRecoverRun, run.ID, run.Fence, msg, s.clock(now))
		b.Queue(sqlEndAttempts, run.ID, s.clock(now), msg)
		return tx.SendBatch(ctx, b).Close()
	})
}

// Abandon implements checkpoint.Operator: claims refuse the run unless
// forced. A run held by a live runner is refused with a *LeaseHeldError,
// an abandoned one with ErrAbandoned, a succeeded one with
// ErrAlreadySucceeded.
func (s *Store) Abandon(ctx context.Context, a checkpoint.Audit, now time.Time, opts ...checkpoint.OperateOption) error {
	return s.operate(ctx, a, now, checkpoint.NewOperateOptions(opts), false, func(tx pgx.Tx, run checkpoint.Run, _ time.Time) error {
		msg, err := checkpoint.Abandonment(run, a)
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(sqlAbandonRun, run.ID, run.Fence, msg, s.clock(now))
		b.Queue(sqlEndAttempts, run.ID, s.clock(now), msg)
		return tx.SendBatch(ctx, b).Close()
	})
}

// ResetSteps implements checkpoint.Operator: the steps' checkpoints, items,
// chunk plans and recorded source changes go in one statement each, the
// fence grows and a succeeded run reopens as failed. A pruned run is
// refused with ErrPruned, a run held by a live runner with a
// *LeaseHeldError.
func (s *Store) ResetSteps(ctx context.Context, a checkpoint.Audit, now time.Time, stepIDs []string, opts ...checkpoint.OperateOption) error {
	o := checkpoint.NewOperateOptions(opts)
	return s.operate(ctx, a, now, o, false, func(tx pgx.Tx, run checkpoint.Run, _ time.Time) error {
		if err := o.Unchanged(run); err != nil {
			return err
		}
		msg, err := checkpoint.Reopening(run, a)
		if err != nil {
			return err
		}
		ids := stepIDs
		if ids == nil {
			ids = []string{}
		}
		b := &pgx.Batch{}
		b.Queue(sqlResetRun, run.ID, run.Fence, msg, s.clock(now))
		for _, q := range []string{sqlResetSteps, sqlResetItems, sqlResetChunkPlans, sqlResetChanges, sqlResetPartitions} {
			b.Queue(q, run.ID, ids)
		}
		return tx.SendBatch(ctx, b).Close()
	})
}

// ResolveStep implements checkpoint.Operator: done records the outside
// call as completed with output, otherwise it is marked failed so the
// next run calls again; the fence grows. A step not recorded is
// ErrNotFound, one not awaiting a decision ErrNotUnknown, a run held by a
// live runner a *LeaseHeldError.
func (s *Store) ResolveStep(ctx context.Context, a checkpoint.Audit, now time.Time, stepID string, done bool, output []byte, opts ...checkpoint.OperateOption) error {
	return s.operate(ctx, a, now, checkpoint.NewOperateOptions(opts), false, func(tx pgx.Tx, run checkpoint.Run, _ time.Time) error {
		rs := checkpoint.ResolveState{Run: run, StepID: stepID}
		err := tx.QueryRow(ctx, sqlStepStatus, run.ID, stepID).Scan(&rs.Status, &rs.Call, &rs.LastAttempt)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: run %s has no step %q", checkpoint.ErrNotFound, run.ID, stepID)
		}
		if err != nil {
			return err
		}
		o := checkpoint.NewOperateOptions(opts)
		if after, ok := checkpoint.ResolveStepAfter(rs.Call); ok && o.Replace {
			err := tx.QueryRow(ctx, sqlRecordedAfter, run.ID, after).Scan(&rs.UsedBy)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
		}
		newStatus, errText, call, err := checkpoint.Resolution(rs, a, done, o.Replace)
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(sqlResolveStep, run.ID, stepID, newStatus, output, errText, s.clock(now), call)
		b.Queue(sqlFenceRun, run.ID, run.Fence, s.clock(now))
		return tx.SendBatch(ctx, b).Close()
	})
}

// Audits implements checkpoint.Operator: in the order recorded.
func (s *Store) Audits(ctx context.Context, runID string) ([]checkpoint.Audit, error) {
	rows, err := s.pool.Query(ctx, sqlAudits, runID)
	if err != nil {
		return nil, s.wrap("read audit of "+runID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (checkpoint.Audit, error) {
		a := checkpoint.Audit{RunID: runID}
		var at pgtype.Timestamptz
		err := r.Scan(&at, &a.Operator, &a.Command, &a.Reason, &a.Details)
		a.At = tm(at)
		return a, err
	})
	if len(out) == 0 {
		out = nil // as from the SQLite store
	}
	return out, s.wrap("read audit of "+runID, err)
}

// runSize is what pruning one run frees.
type runSize struct {
	id                                    string
	steps, stepBytes, items, itemBy, keys int64
}

// payloadSizes measures the payloads of the runs ids, in their order.
func payloadSizes(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, ids []string) ([]runSize, error) {
	rows, err := q.Query(ctx, sqlPayloadSizes, ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (runSize, error) {
		var z runSize
		return z, r.Scan(&z.id, &z.steps, &z.stepBytes, &z.items, &z.itemBy, &z.keys)
	})
}

// Prune implements checkpoint.Operator, set-based in one transaction: the
// runs due are locked (a claim of one in flight is waited for, and a run
// it reopened no longer qualifies), measured, stripped of their payloads
// and of the Idempotency-Keys naming them with one statement per table,
// marked pruned (their fences raised) and each audited. The runs come
// oldest finish first.
func (s *Store) Prune(ctx context.Context, a checkpoint.Audit, cutoff time.Time, dryRun bool) (checkpoint.PruneResult, error) {
	var res checkpoint.PruneResult
	add := func(sizes []runSize) {
		for _, z := range sizes {
			res.Runs = append(res.Runs, z.id)
			res.Steps += z.steps
			res.Items += z.items
			res.Bytes += z.stepBytes + z.itemBy
			res.IdempotencyKeys += z.keys
		}
	}
	if dryRun {
		rows, err := s.pool.Query(ctx, sqlPrunable, cutoff)
		if err != nil {
			return res, s.wrap("find runs to prune", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return res, s.wrap("find runs to prune", err)
		}
		sizes, err := payloadSizes(ctx, s.pool, ids)
		if err != nil {
			return res, s.wrap("measure runs to prune", err)
		}
		add(sizes)
		return res, nil
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlLockPrunable, cutoff)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(ids) == 0 {
			return err
		}
		// A statement of its own, after the lock: it sees what a claim
		// waited for committed.
		sizes, err := payloadSizes(ctx, tx, ids)
		if err != nil {
			return err
		}
		rows, err = tx.Query(ctx, sqlPruneIdempotency, ids)
		if err != nil {
			return err
		}
		keys := map[string]int64{}
		var runID string
		var n int64
		if _, err := pgx.ForEachRow(rows, []any{&runID, &n}, func() error { keys[runID] = n; return nil }); err != nil {
			return err
		}
		details := make([]string, len(sizes))
		for i := range sizes {
			z := &sizes[i]
			z.keys = keys[z.id]
			details[i] = checkpoint.PruneDetails(z.steps, z.items, z.stepBytes+z.itemBy, z.keys)
		}
		b := &pgx.Batch{}
		for _, q := range []string{sqlPruneSteps, sqlPruneItems, sqlPruneChunkPlans, sqlPruneChanges, sqlPrunePartitions} {
			b.Queue(q, ids)
		}
		b.Queue(sqlMarkPruned, ids, ts(a.At))
		b.Queue(sqlPruneAudits, ids, details, ts(a.At), a.Operator, a.Command, a.Reason)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		add(sizes)
		return nil
	})
	if err != nil {
		return checkpoint.PruneResult{}, s.wrap("prune runs finished before "+cutoff.UTC().Format(time.RFC3339), err)
	}
	return res, nil
}
