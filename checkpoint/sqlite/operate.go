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
	sqlInsertAudit = `INSERT INTO audit (run_id, at, operator, command, reason, details) VALUES (?, ?, ?, ?, ?, ?)`
	sqlAudits      = `SELECT at, operator, command, reason, details FROM audit WHERE run_id = ? ORDER BY id`
	// sqlFenceRun raises the fence of a run whose other columns an
	// operation leaves alone (resolve), so its runner writes nothing more.
	sqlFenceRun   = `UPDATE runs SET fence = fence + 1, updated_at = ? WHERE id = ? AND fence = ?`
	sqlRecoverRun = `UPDATE runs SET status = 'failed', fence = fence + 1, lease_owner = NULL, lease_until = NULL,
    error = ?, updated_at = ? WHERE id = ? AND fence = ?`
	sqlAbandonRun = `UPDATE runs SET status = 'abandoned', fence = fence + 1, lease_owner = NULL, lease_until = NULL,
    error = ?, updated_at = ?, finished_at = ? WHERE id = ? AND fence = ?`
	// sqlResetRun reopens a run for a reset, a succeeded one as failed. It
	// raises the fence above every fence the run's partitions reached as
	// well (it runs before they are deleted), so the steps' next split
	// never repeats a partition fence (see checkpoint.PartitionStore).
	sqlResetRun = `UPDATE runs SET status = CASE WHEN status = 'succeeded' THEN 'failed' ELSE status END,
    error = CASE WHEN status = 'succeeded' THEN ?1 ELSE error END,
    fence = max(fence, COALESCE((SELECT max(fence) FROM partitions WHERE run_id = ?3), 0)) + 1,
    updated_at = ?2, finished_at = NULL WHERE id = ?3 AND fence = ?4`
	sqlEndAttempts = `UPDATE attempts SET status = 'lost', finished_at = ?, error = ?
WHERE run_id = ? AND finished_at IS NULL`
	sqlDeleteItems      = `DELETE FROM items WHERE run_id = ? AND step_id = ?`
	sqlDeleteChunkPlans = `DELETE FROM chunk_plans WHERE run_id = ? AND step_id = ?`
	sqlDeletePartitions = `DELETE FROM partitions WHERE run_id = ? AND step_id = ?`
	sqlPrunable         = `SELECT id FROM runs
WHERE status IN ('succeeded', 'abandoned') AND pruned_at IS NULL AND finished_at IS NOT NULL AND finished_at < ?
ORDER BY finished_at`
	sqlPayloadSize = `SELECT
    (SELECT count(*) FROM steps WHERE run_id = ?1),
    (SELECT COALESCE(sum(length(output) + COALESCE(length(plan), 0)), 0) FROM steps WHERE run_id = ?1),
    (SELECT count(*) FROM items WHERE run_id = ?1),
    (SELECT COALESCE(sum(COALESCE(length(output), 0) + length(error) + length(item_key)), 0) FROM items WHERE run_id = ?1),
    (SELECT count(*) FROM idempotency_keys WHERE run_id = ?1)`
	// sqlPruneIdempotency deletes the Idempotency-Keys naming a pruned
	// run, accepting ones too: the run is finished, and its tombstone
	// answers a later start with the key.
	sqlPruneIdempotency = `DELETE FROM idempotency_keys WHERE run_id = ?`
	sqlPruneSteps       = `UPDATE steps SET output = NULL, plan = NULL WHERE run_id = ?`
	sqlPruneItems       = `DELETE FROM items WHERE run_id = ?`
	sqlPruneChunkPlans  = `DELETE FROM chunk_plans WHERE run_id = ?`
	sqlPrunePartitions  = `DELETE FROM partitions WHERE run_id = ?`
	sqlMarkPruned       = `UPDATE runs SET pruned_at = ?, updated_at = ? WHERE id = ?`
)

// operate runs fn on the run in one write transaction and records the audit
// row with it. Unless allowLive, it refuses a run held by a live runner.
func (s *Store) operate(ctx context.Context, a checkpoint.Audit, now time.Time, o checkpoint.OperateOptions, allowLive bool, fn func(tx *sql.Tx, run checkpoint.Run) error) error {
	if err := a.Check(); err != nil { // its text goes into the run's error too
		return fmt.Errorf("%s of %s: %w", a.Command, a.RunID, err)
	}
	return s.tx(ctx, a.Command+" "+a.RunID, func(tx *sql.Tx) error {
		run, err := scanRun(tx.QueryRowContext(ctx, sqlSelectRun, a.RunID))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: no run %q in %s", checkpoint.ErrNotFound, a.RunID, s.path)
		}
		if err != nil {
			return err
		}
		if !allowLive && o.Held(run, now) {
			return &checkpoint.LeaseHeldError{RunID: run.ID, Owner: run.LeaseOwner, Until: run.LeaseUntil}
		}
		if err := fn(tx, run); err != nil {
			return err
		}
		return insertAudits(ctx, tx, a)
	})
}

// insertAudits writes audit records in tx, each checked first
// (checkpoint.Audit.Check): one refused fails the transaction, and the
// operation it records with it.
func insertAudits(ctx context.Context, tx *sql.Tx, audits ...checkpoint.Audit) error {
	for _, a := range audits {
		if err := a.Check(); err != nil {
			return fmt.Errorf("%s of %s: %w", a.Command, a.RunID, err)
		}
		if _, err := tx.ExecContext(ctx, sqlInsertAudit, a.RunID, fmtTime(a.At), a.Operator, a.Command, a.Reason, a.Details); err != nil {
			return err
		}
	}
	return nil
}

// Recover marks a stale run (running, lease expired or owner gone: its
// runner died) as failed, so it is resumable and no longer listed as
// running. The fence grows, so the old runner, should it wake, writes
// nothing. A run held by a live runner is refused with ErrNotStale unless
// force.
func (s *Store) Recover(ctx context.Context, a checkpoint.Audit, now time.Time, force bool, opts ...checkpoint.OperateOption) error {
	o := checkpoint.NewOperateOptions(opts)
	return s.operate(ctx, a, now, o, true, func(tx *sql.Tx, run checkpoint.Run) error {
		msg, err := checkpoint.Recovery(run, a, o.Held(run, now), force)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, sqlRecoverRun, msg, fmtTime(now), run.ID, run.Fence); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, sqlEndAttempts, fmtTime(now), msg, run.ID)
		return err
	})
}

// Abandon marks a run abandoned: run and resume refuse it unless forced.
// A run held by a live runner is refused with a *LeaseHeldError, a
// succeeded one with ErrAlreadySucceeded.
func (s *Store) Abandon(ctx context.Context, a checkpoint.Audit, now time.Time, opts ...checkpoint.OperateOption) error {
	return s.operate(ctx, a, now, checkpoint.NewOperateOptions(opts), false, func(tx *sql.Tx, run checkpoint.Run) error {
		msg, err := checkpoint.Abandonment(run, a)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, sqlAbandonRun, msg, fmtTime(now), fmtTime(now), run.ID, run.Fence); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, sqlEndAttempts, fmtTime(now), msg, run.ID)
		return err
	})
}

// ResetSteps deletes the checkpoints (and batch items and chunk plans) of
// the given steps so they run again, grows the fence, and reopens a
// succeeded run as failed. It does not undo effects. A run held by a live
// runner is refused with a *LeaseHeldError.
func (s *Store) ResetSteps(ctx context.Context, a checkpoint.Audit, now time.Time, stepIDs []string, opts ...checkpoint.OperateOption) error {
	o := checkpoint.NewOperateOptions(opts)
	return s.operate(ctx, a, now, o, false, func(tx *sql.Tx, run checkpoint.Run) error {
		if err := o.Unchanged(run); err != nil {
			return err
		}
		msg, err := checkpoint.Reopening(run, a)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, sqlResetRun, msg, fmtTime(now), run.ID, run.Fence); err != nil {
			return err
		}
		for _, id := range stepIDs {
			for _, q := range []string{sqlDeleteStep, sqlDeleteItems, sqlDeleteChunkPlans, sqlDeleteChanges, sqlDeletePartitions} {
				if _, err := tx.ExecContext(ctx, q, run.ID, id); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// Audits returns a run's manual operations, oldest first.
func (s *Store) Audits(ctx context.Context, runID string) ([]checkpoint.Audit, error) {
	rows, err := s.rdb.QueryContext(ctx, sqlAudits, runID)
	if err != nil {
		return nil, s.wrap("read audit of "+runID, err)
	}
	defer rows.Close()
	var out []checkpoint.Audit
	for rows.Next() {
		a := checkpoint.Audit{RunID: runID}
		var at sql.NullString
		if err := rows.Scan(&at, &a.Operator, &a.Command, &a.Reason, &a.Details); err != nil {
			return nil, s.wrap("read audit of "+runID, err)
		}
		a.At = parseTime(at)
		out = append(out, a)
	}
	return out, s.wrap("read audit of "+runID, rows.Err())
}

// Prune deletes the payloads of succeeded and abandoned runs that finished
// before cutoff: step outputs and plans, item checkpoints and chunk plans,
// and the Idempotency-Keys naming them. Each run's row stays as a
// tombstone, so a later start of its key is refused with ErrPruned instead
// of silently running again. With dryRun it only counts. Each run is
// pruned, measured and audited in a transaction of its own.
func (s *Store) Prune(ctx context.Context, a checkpoint.Audit, cutoff time.Time, dryRun bool) (checkpoint.PruneResult, error) {
	var res checkpoint.PruneResult
	rows, err := s.rdb.QueryContext(ctx, sqlPrunable, fmtTime(cutoff))
	if err != nil {
		return res, s.wrap("find runs to prune", err)
	}
	var candidates []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return res, s.wrap("find runs to prune", err)
		}
		candidates = append(candidates, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return res, s.wrap("find runs to prune", err)
	}
	add := func(id string, z payloadSize) {
		res.Runs = append(res.Runs, id)
		res.Steps += z.steps
		res.Items += z.items
		res.Bytes += z.stepBytes + z.itemBytes
		res.IdempotencyKeys += z.keys
	}
	for _, id := range candidates {
		if dryRun {
			z, err := measure(ctx, s.rdb, id)
			if err != nil {
				return res, s.wrap("measure run "+id, err)
			}
			add(id, z)
			continue
		}
		var z payloadSize
		err := s.tx(ctx, a.Command+" "+id, func(tx *sql.Tx) error {
			run, err := scanRun(tx.QueryRowContext(ctx, sqlSelectRun, id))
			if err != nil {
				return err
			}
			// Re-checked inside the transaction: the run may have been
			// rerun since it was listed.
			if (run.Status != checkpoint.RunSucceeded && run.Status != checkpoint.RunAbandoned) || !run.PrunedAt.IsZero() ||
				run.FinishedAt.IsZero() || !run.FinishedAt.Before(cutoff) {
				return errSkipPrune
			}
			// Measured in the transaction (the one writer), so the audit
			// says exactly what went.
			if z, err = measure(ctx, tx, id); err != nil {
				return err
			}
			for _, q := range []string{sqlPruneSteps, sqlPruneItems, sqlPruneChunkPlans, sqlPruneChanges, sqlPrunePartitions} {
				if _, err := tx.ExecContext(ctx, q, id); err != nil {
					return err
				}
			}
			if _, err := tx.ExecContext(ctx, sqlPruneIdempotency, id); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, sqlMarkPruned, fmtTime(a.At), fmtTime(a.At), id); err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, sqlInsertAudit, id, fmtTime(a.At), a.Operator, a.Command, a.Reason, z.details())
			return err
		})
		if errors.Is(err, errSkipPrune) {
			continue
		}
		if err != nil {
			return res, err
		}
		add(id, z)
	}
	return res, nil
}

// payloadSize is what Prune removes of one run.
type payloadSize struct {
	steps, stepBytes, items, itemBytes, keys int64
}

// measure reads the size of run id's payloads.
func measure(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, id string) (payloadSize, error) {
	var z payloadSize
	err := q.QueryRowContext(ctx, sqlPayloadSize, id).Scan(&z.steps, &z.stepBytes, &z.items, &z.itemBytes, &z.keys)
	return z, err
}

// details is the audit record's account of a pruned run's payloads; the
// Idempotency-Keys are named only when there were some.
func (z payloadSize) details() string {
	return checkpoint.PruneDetails(z.steps, z.items, z.stepBytes+z.itemBytes, z.keys)
}

// errSkipPrune rolls back the pruning of a run that no longer qualifies.
var errSkipPrune = errors.New("run no longer qualifies for pruning")

const (
	sqlStepStatus = `SELECT status, call_record, (SELECT COALESCE(max(number), 0) FROM attempts WHERE run_id = ?1)
FROM steps WHERE run_id = ?1 AND step_id = ?2`
	sqlResolveStep = `UPDATE steps SET status = ?, output = ?, error = ?, finished_at = ?, call_record = ? WHERE run_id = ? AND step_id = ?`
	// sqlRecordedAfter names a step or batch item recorded by an attempt
	// after the given one: what used a resolution made then.
	sqlRecordedAfter = `SELECT step_id FROM steps WHERE run_id = ?1 AND attempt > ?2
UNION ALL SELECT step_id || '/' || item_key FROM items WHERE run_id = ?1 AND attempt > ?2 LIMIT 1`
)

// ResolveStep settles an outside call whose outcome is unknown: done
// records it as completed with output (JSON), otherwise it is marked failed
// so the next run calls again. Only a step awaiting that decision can be
// resolved; a run held by a live runner is refused with a *LeaseHeldError.
func (s *Store) ResolveStep(ctx context.Context, a checkpoint.Audit, now time.Time, stepID string, done bool, output []byte, opts ...checkpoint.OperateOption) error {
	return s.operate(ctx, a, now, checkpoint.NewOperateOptions(opts), false, func(tx *sql.Tx, run checkpoint.Run) error {
		rs := checkpoint.ResolveState{Run: run, StepID: stepID}
		err := tx.QueryRowContext(ctx, sqlStepStatus, run.ID, stepID).Scan(&rs.Status, &rs.Call, &rs.LastAttempt)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: run %s has no step %q", checkpoint.ErrNotFound, run.ID, stepID)
		}
		if err != nil {
			return err
		}
		o := checkpoint.NewOperateOptions(opts)
		if after, ok := checkpoint.ResolveStepAfter(rs.Call); ok && o.Replace {
			err := tx.QueryRowContext(ctx, sqlRecordedAfter, run.ID, after).Scan(&rs.UsedBy)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return err
			}
		}
		newStatus, errText, call, err := checkpoint.Resolution(rs, a, done, o.Replace)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, sqlResolveStep, newStatus, output, errText, fmtTime(now), call, run.ID, stepID); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, sqlFenceRun, fmtTime(now), run.ID, run.Fence)
		return err
	})
}
