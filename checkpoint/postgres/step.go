package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stepwise-run/stepwise/checkpoint"
)

const (
	// sqlPutStep inserts or replaces a step checkpoint, never overwriting
	// a finished (completed or rejected) one. It checks the fence itself
	// too (it selects from the run row only at the lease's fence), besides
	// the fence check ahead of it.
	sqlPutStep = sqlPutStepInsert + `
` + sqlPutStepUpsert
	// sqlPutStepInsert and sqlPutStepUpsert are sqlPutStep's two halves,
	// around the run row's lock of sqlPutStepAlone.
	sqlPutStepInsert = `INSERT INTO steps (run_id, step_id, status, output, input_hash, error, tries, attempt, started_at, finished_at, plan, call_record)
SELECT $1, $2::text, $3::text, $4::bytea, $5::text, $6::text, $7::integer, $8::integer, $9::timestamptz, $10::timestamptz, $12::bytea, $13::bytea
FROM runs WHERE id = $1 AND fence = $11`
	sqlPutStepUpsert = `ON CONFLICT (run_id, step_id) DO UPDATE SET
    status = excluded.status, output = excluded.output, input_hash = excluded.input_hash,
    error = excluded.error, tries = excluded.tries, attempt = excluded.attempt,
    started_at = excluded.started_at, finished_at = excluded.finished_at, plan = excluded.plan,
    call_record = excluded.call_record
WHERE steps.status NOT IN ('completed', 'rejected')`
	// sqlPutStepLone is sqlPutStep in the one-round-trip batch: a refused
	// write raises, rolling back the batch, which InTx then makes again
	// statement by statement to tell our own earlier commit (accepted)
	// from a conflict.
	sqlPutStepLone = `WITH w AS (` + sqlPutStep + `
RETURNING 1) SELECT stepwise_expect_rows(count(*), 1, 'put step') FROM w`
	// sqlPutStepAlone is sqlPutStep sent by itself, a step's lone
	// checkpoint (one autocommit statement, one round trip): the fence
	// check is its own read of the run row, which it locks FOR KEY SHARE
	// as stepwise_fence does, so a claim (FOR UPDATE) waits for its commit
	// or, committed first, leaves the row at another fence and the
	// statement writes nothing. Under READ COMMITTED a locked row that a
	// claim changed since the statement's snapshot is read again at its
	// newest version, whose fence is compared. It changes one row, or none
	// (fenced, gone, or the step already finished: InTx then asks why).
	sqlPutStepAlone = sqlPutStepInsert + ` FOR KEY SHARE
` + sqlPutStepUpsert
	// sqlPutStepPiped is sqlPutStep in the open transaction, sent with
	// the next round trip: a refused write raises, aborting the
	// transaction, unless the step is recorded finished with the content
	// given (our own earlier commit whose acknowledgement was lost).
	sqlPutStepPiped = `WITH w AS (` + sqlPutStep + `
RETURNING 1) SELECT CASE WHEN (SELECT count(*) FROM w) = 1 OR EXISTS (
    SELECT 1 FROM steps AS s WHERE s.run_id = $1 AND s.step_id = $2 AND s.status = $3
    AND s.input_hash = $5 AND s.error = $6 AND coalesce(s.output, ''::bytea) = coalesce($4, ''::bytea))
THEN 1 ELSE stepwise_expect_rows(0, 1, 'put step') END`
	sqlGetStep    = `SELECT status, output, input_hash, error FROM steps WHERE run_id = $1 AND step_id = $2`
	sqlDeleteStep = `DELETE FROM steps WHERE run_id = $1 AND step_id = $2`
	sqlSteps      = `SELECT step_id, status, output, input_hash, error, tries, attempt, started_at, finished_at, plan, call_record
FROM steps WHERE run_id = $1 ORDER BY started_at NULLS FIRST, step_id`
)

// PutStep implements checkpoint.Tx: one statement. Made before anything
// else it is queued, sent when fn returns in InTx's one round trip, and a
// refusal is InTx's error; otherwise it is sent now (with BEGIN and the
// fence check ahead of it in the same round trip when it opens the
// transaction).
func (t *pgTx) PutStep(st checkpoint.Step) error {
	if t.part != nil {
		return t.fail(errPartitionStep(t.lease.RunID, st.ID))
	}
	if !t.deferring() && !t.pipelining() {
		return t.putStep(st)
	}
	st.Output, st.Plan, st.Call = bytes.Clone(st.Output), bytes.Clone(st.Plan), bytes.Clone(st.Call)
	if t.pipelining() {
		t.pend(&pgx.QueuedQuery{SQL: sqlPutStepPiped, Arguments: t.putStepArgs(st)}, func(err error) error {
			if !isRefusal(err) {
				return err
			}
			// Rolled back: the recorded step says why. None recorded: the
			// step was finished earlier in this (rolled-back) transaction
			// with other content, a conflict all the same.
			if err := t.explainRefusedPut(st); err != nil && !errors.Is(err, checkpoint.ErrNotFound) {
				return err
			}
			// It was not when refused: another writer is racing us.
			return &checkpoint.StepConflictError{RunID: t.lease.RunID, StepID: st.ID, Status: st.Status}
		})
		return nil
	}
	args := t.putStepArgs(st)
	t.queued = append(t.queued, deferredWrite{
		now:   func() error { return t.putStep(st) },
		lone:  []*pgx.QueuedQuery{{SQL: sqlPutStepLone, Arguments: args}},
		alone: &pgx.QueuedQuery{SQL: sqlPutStepAlone, Arguments: args},
	})
	return nil
}

// putStepArgs are sqlPutStep's (and sqlPutStepLone's) arguments.
func (t *pgTx) putStepArgs(st checkpoint.Step) []any {
	return []any{t.lease.RunID, st.ID, st.Status, st.Output, st.InputHash, st.Error,
		st.Tries, t.lease.Attempt, ts(st.StartedAt), ts(st.FinishedAt), t.lease.Fence, st.Plan, st.Call}
}

// putStep sends PutStep's statement through the explicit transaction and
// explains a refusal.
func (t *pgTx) putStep(st checkpoint.Step) error {
	b := &pgx.Batch{}
	b.Queue(sqlPutStep, t.putStepArgs(st)...)
	tags, err := t.exec(b)
	if err != nil {
		return err
	}
	if tags[0].RowsAffected() == 1 {
		return nil
	}
	return t.explainRefusedPut(st)
}

// explainRefusedPut decides why a checkpoint write changed nothing, the
// fence being held: the step is already finished. A finished step with
// identical content is our own earlier commit whose acknowledgement was
// lost, so it counts as success; different content is a conflict.
func (t *pgTx) explainRefusedPut(st checkpoint.Step) error {
	var rec checkpoint.Step
	err := t.conn.QueryRow(t.ctx, sqlGetStep, t.lease.RunID, st.ID).Scan(&rec.Status, &rec.Output, &rec.InputHash, &rec.Error)
	if errors.Is(err, pgx.ErrNoRows) {
		// Nothing recorded and nothing written: the run row is gone.
		return t.fail(fmt.Errorf("%w: run %s", checkpoint.ErrNotFound, t.lease.RunID))
	}
	if err != nil {
		return t.fail(err)
	}
	return checkpoint.RefusedPut(t.lease.RunID, rec, st)
}

// ResetStep implements checkpoint.Tx.
func (t *pgTx) ResetStep(id string) error {
	if t.part != nil {
		return t.fail(errPartitionStep(t.lease.RunID, id))
	}
	b := &pgx.Batch{}
	b.Queue(sqlDeleteStep, t.lease.RunID, id)
	return t.write(b, nil)
}

// Steps implements checkpoint.Store: one query, streamed.
func (s *Store) Steps(ctx context.Context, runID string, fn func(checkpoint.Step) error) error {
	rows, err := s.pool.Query(ctx, sqlSteps, runID)
	if err != nil {
		return s.wrap("read steps of "+runID, err)
	}
	defer rows.Close()
	for rows.Next() {
		st := checkpoint.Step{RunID: runID}
		var started, finished pgtype.Timestamptz
		if err := rows.Scan(&st.ID, &st.Status, &st.Output, &st.InputHash, &st.Error, &st.Tries, &st.Attempt,
			&started, &finished, &st.Plan, &st.Call); err != nil {
			return s.wrap("read steps of "+runID, err)
		}
		st.StartedAt = tm(started)
		st.FinishedAt = tm(finished)
		if err := fn(st); err != nil {
			return err
		}
	}
	return s.wrap("read steps of "+runID, rows.Err())
}
