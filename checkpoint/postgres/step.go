package postgres

import (
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
	// (it selects from the run row only at the lease's fence), because it
	// is pipelined behind the fence lock that opens the transaction.
	sqlPutStep = `INSERT INTO steps (run_id, step_id, status, output, input_hash, error, tries, attempt, started_at, finished_at, plan)
SELECT $1, $2::text, $3::text, $4::bytea, $5::text, $6::text, $7::integer, $8::integer, $9::timestamptz, $10::timestamptz, $12::bytea
FROM runs WHERE id = $1 AND fence = $11
ON CONFLICT (run_id, step_id) DO UPDATE SET
    status = excluded.status, output = excluded.output, input_hash = excluded.input_hash,
    error = excluded.error, tries = excluded.tries, attempt = excluded.attempt,
    started_at = excluded.started_at, finished_at = excluded.finished_at, plan = excluded.plan
WHERE steps.status NOT IN ('completed', 'rejected')`
	sqlGetStep    = `SELECT status, output, input_hash, error FROM steps WHERE run_id = $1 AND step_id = $2`
	sqlDeleteStep = `DELETE FROM steps WHERE run_id = $1 AND step_id = $2`
	sqlSteps      = `SELECT step_id, status, output, input_hash, error, tries, attempt, started_at, finished_at, plan
FROM steps WHERE run_id = $1 ORDER BY started_at NULLS FIRST, step_id`
)

// PutStep implements checkpoint.Tx: one statement (with BEGIN and the
// fence lock ahead of it in the same round trip when it opens the
// transaction).
func (t *pgTx) PutStep(st checkpoint.Step) error {
	b := t.batch()
	b.Queue(sqlPutStep, t.lease.RunID, st.ID, st.Status, st.Output, st.InputHash, st.Error,
		st.Tries, t.lease.Attempt, ts(st.StartedAt), ts(st.FinishedAt), t.lease.Fence, st.Plan)
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
	b := t.batch()
	b.Queue(sqlDeleteStep, t.lease.RunID, id)
	_, err := t.exec(b)
	return err
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
			&started, &finished, &st.Plan); err != nil {
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
