package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stepwise-run/stepwise/checkpoint"
)

const (
	// sqlPutItems records a chunk's items in one statement from arrays,
	// never overwriting a finished (completed or rejected) item; its row
	// count says whether one was refused.
	sqlPutItems = `INSERT INTO items (run_id, step_id, item_key, status, output, error, attempt, chunk, fingerprint)
SELECT $1, u.step, u.key, u.status, u.output, u.error, $2, u.chunk, u.fingerprint
FROM unnest($3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[], $8::text[], $9::bytea[])
    AS u(step, key, status, output, error, chunk, fingerprint)
ON CONFLICT (run_id, step_id, item_key) DO UPDATE SET
    status = excluded.status, output = excluded.output, error = excluded.error,
    attempt = excluded.attempt, chunk = excluded.chunk, fingerprint = excluded.fingerprint
WHERE items.status NOT IN ('completed', 'rejected')`
	// sqlRefusedItems names the items of a chunk sqlPutItems refused:
	// those it did not write in this transaction, whose row version was
	// made by an earlier one (xmin is not this transaction's ID).
	sqlRefusedItems = `SELECT i.step_id, i.item_key FROM items AS i
JOIN unnest($2::text[], $3::text[]) AS u(step, key) ON i.step_id = u.step AND i.item_key = u.key
WHERE i.run_id = $1 AND i.status IN ('completed', 'rejected')
  AND i.xmin::text <> (pg_current_xact_id()::text::bigint % 4294967296)::text
ORDER BY i.step_id, i.item_key LIMIT 1`
	// sqlAcceptItems replaces recorded items' fingerprints (whatever their
	// status: nothing else of them moves) and returns the keys it found.
	// sqlPutItemsLone is sqlPutItems for a batch sent without waiting
	// for its result (InTx's one round trip, or with COMMIT): a finished
	// item raises codeRefused where sqlPutItems would skip it, aborting
	// the batch, whose caller then says which. Raising in the conflict
	// arm, not counting rows, keeps it a plain INSERT (no RETURNING, no
	// CTE): new items, the usual case, never reach that arm.
	sqlPutItemsLone = `INSERT INTO items (run_id, step_id, item_key, status, output, error, attempt, chunk, fingerprint)
SELECT $1, u.step, u.key, u.status, u.output, u.error, $2, u.chunk, u.fingerprint
FROM unnest($3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[], $8::text[], $9::bytea[])
    AS u(step, key, status, output, error, chunk, fingerprint)
ON CONFLICT (run_id, step_id, item_key) DO UPDATE SET
    status = CASE WHEN items.status IN ('completed', 'rejected')
        THEN stepwise_expect_rows(0, 1, 'put items: item ' || items.step_id || '/' || items.item_key || ' is finished')::text
        ELSE excluded.status END,
    output = excluded.output, error = excluded.error,
    attempt = excluded.attempt, chunk = excluded.chunk, fingerprint = excluded.fingerprint`
	// sqlPutNewItems records items known to be new (PutNewItems) with a
	// plain INSERT: no conflict arm, so none of the per-row conflict check
	// and confirmation of an upsert's speculative insertion, which costs a
	// chunk of 1000 items about as much as its accounts' compare-and-set.
	// A recorded item raises a unique violation, aborting the transaction.
	sqlPutNewItems = `INSERT INTO items (run_id, step_id, item_key, status, output, error, attempt, chunk, fingerprint)
SELECT $1, u.step, u.key, u.status, u.output, u.error, $2, u.chunk, u.fingerprint
FROM unnest($3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[], $8::text[], $9::bytea[])
    AS u(step, key, status, output, error, chunk, fingerprint)`
	// sqlRecordedItem names an item of a refused PutNewItems that is
	// recorded, a finished one first.
	sqlRecordedItem = `SELECT i.step_id, i.item_key, i.status FROM items AS i
JOIN unnest($2::text[], $3::text[]) AS u(step, key) ON i.step_id = u.step AND i.item_key = u.key
WHERE i.run_id = $1
ORDER BY i.status IN ('completed', 'rejected') DESC, i.step_id, i.item_key LIMIT 1`
	sqlAcceptItems = `UPDATE items SET fingerprint = u.fingerprint
FROM unnest($2::text[], $3::text[], $4::bytea[]) AS u(step, key, fingerprint)
WHERE items.run_id = $1 AND items.step_id = u.step AND items.item_key = u.key
RETURNING items.step_id, items.item_key`
	sqlPutChunkPlan       = `INSERT INTO chunk_plans (run_id, step_id, effect_id, status, plan) VALUES ($1, $2, $3, $4, $5)`
	sqlMoveChunkItems     = `UPDATE items SET chunk = $1 WHERE run_id = $2 AND step_id = $3 AND chunk = $4 AND status = 'planned'`
	sqlSupersedeChunkPlan = `UPDATE chunk_plans SET status = 'superseded' WHERE run_id = $1 AND step_id = $2 AND effect_id = $3 AND status = 'planned'`
	sqlFinishChunk        = `UPDATE items SET status = 'completed'
WHERE run_id = $1 AND step_id = $2 AND chunk = $3 AND status = 'planned'`
	sqlFinishChunkPlan = `UPDATE chunk_plans SET status = 'applied' WHERE run_id = $1 AND step_id = $2 AND effect_id = $3`
	sqlChunkPlans      = `SELECT effect_id, status, plan FROM chunk_plans
WHERE run_id = $1 AND step_id = $2 AND status = 'planned' ORDER BY effect_id`
	itemCols         = `item_key, status, output, error, attempt, chunk, fingerprint`
	itemKeyCols      = `item_key, status, attempt, fingerprint`
	sqlItemsAll      = `SELECT ` + itemCols + ` FROM items WHERE run_id = $1 AND step_id = $2 ORDER BY item_key`
	sqlItemsByKeys   = `SELECT ` + itemCols + ` FROM items WHERE run_id = $1 AND step_id = $2 AND item_key = ANY($3::text[]) ORDER BY item_key`
	sqlItemKeysByKey = `SELECT ` + itemKeyCols + ` FROM items WHERE run_id = $1 AND step_id = $2 AND item_key = ANY($3::text[]) ORDER BY item_key`
	sqlItemsByStatus = `SELECT ` + itemCols + ` FROM items
WHERE run_id = $1 AND step_id = $2 AND status = $3 AND item_key > $4 ORDER BY item_key LIMIT $5`
	sqlItemKeysAll  = `SELECT ` + itemKeyCols + ` FROM items WHERE run_id = $1 AND step_id = $2 ORDER BY item_key LIMIT $3`
	sqlItemKeysLast = `SELECT ` + itemKeyCols + ` FROM items WHERE run_id = $1 AND step_id = $2 ORDER BY item_key DESC LIMIT $3`
	// sqlItemKeysRange reads a key range without the attempt: a range comes
	// from a source whose keys ascend, which cannot repeat a key. item_key
	// is COLLATE "C", so the range is bytewise, as on SQLite.
	sqlItemKeysRange = `SELECT item_key, status, fingerprint FROM items
WHERE run_id = $1 AND step_id = $2 AND item_key BETWEEN $3 AND $4 ORDER BY item_key`
	sqlItemCounts = `SELECT step_id, status, count(*) FROM items WHERE run_id = $1 GROUP BY step_id, status ORDER BY step_id, status`
)

func isFinished(status string) bool {
	return status == checkpoint.StepCompleted || status == checkpoint.StepRejected
}

// PutItems implements checkpoint.Tx: one statement for the whole chunk.
// An item given twice is written once with its last content, as
// sequential writes would leave it; a finished item given again is
// refused like a finished recorded one.
func (t *pgTx) PutItems(items []checkpoint.Item) error {
	type itemID struct{ step, key string }
	at := make(map[itemID]int, len(items))
	var steps, keys, statuses, errs, chunks []string
	var outputs, fps [][]byte
	for _, it := range items {
		id := itemID{it.Step, it.Key}
		if i, dup := at[id]; dup {
			if isFinished(statuses[i]) {
				return fmt.Errorf("%w: item %s/%s of run %s is given twice in one chunk, finished the first time; the chunk is rolled back",
					checkpoint.ErrItemFinished, it.Step, it.Key, t.lease.RunID)
			}
			statuses[i], outputs[i], errs[i], chunks[i], fps[i] = it.Status, it.Output, it.Error, it.Chunk, it.Fingerprint
			continue
		}
		at[id] = len(keys)
		steps, keys, statuses = append(steps, it.Step), append(keys, it.Key), append(statuses, it.Status)
		outputs, errs, chunks, fps = append(outputs, it.Output), append(errs, it.Error), append(chunks, it.Chunk), append(fps, it.Fingerprint)
	}
	args := []any{t.lease.RunID, t.lease.Attempt, steps, keys, statuses, outputs, errs, chunks, fps}
	if !t.deferring() && !t.pipelining() {
		return t.putItems(args, steps, keys)
	}
	for i := range outputs {
		outputs[i], fps[i] = bytes.Clone(outputs[i]), bytes.Clone(fps[i])
	}
	if t.pipelining() {
		t.pend(&pgx.QueuedQuery{SQL: sqlPutItemsLone, Arguments: args}, func(err error) error {
			if !isRefusal(err) {
				return fmt.Errorf("postgres: record %d items of run %s: %w", len(keys), t.lease.RunID, err)
			}
			return t.explainRefusedItems(steps, keys)
		})
		return nil
	}
	return t.later(func() error { return t.putItems(args, steps, keys) },
		&pgx.QueuedQuery{SQL: sqlPutItemsLone, Arguments: args})
}

// PutNewItems implements checkpoint.Tx: in the open transaction,
// one plain INSERT sent with the next round trip; before it opens, the
// same INSERT in InTx's one round trip, where a recorded item makes the
// store write the items again as PutItems does (never overwriting a
// finished one). Once job code holds the connection (Conn), it is
// PutItems.
func (t *pgTx) PutNewItems(items []checkpoint.Item) error {
	if !t.pipelining() && !t.deferring() {
		return t.PutItems(items)
	}
	n := len(items)
	steps, keys, statuses, errs, chunks := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	outputs, fps := make([][]byte, n), make([][]byte, n)
	type itemID struct{ step, key string }
	seen := make(map[itemID]struct{}, n)
	for i, it := range items {
		id := itemID{it.Step, it.Key}
		if _, dup := seen[id]; dup {
			return fmt.Errorf("postgres: item %s/%s of run %s is given twice as new in one chunk; the chunk is rolled back",
				it.Step, it.Key, t.lease.RunID)
		}
		seen[id] = struct{}{}
		steps[i], keys[i], statuses[i], errs[i], chunks[i] = it.Step, it.Key, it.Status, it.Error, it.Chunk
		outputs[i], fps[i] = bytes.Clone(it.Output), bytes.Clone(it.Fingerprint)
	}
	args := []any{t.lease.RunID, t.lease.Attempt, steps, keys, statuses, outputs, errs, chunks, fps}
	if t.pipelining() {
		t.pend(&pgx.QueuedQuery{SQL: sqlPutNewItems, Arguments: args}, func(err error) error {
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != codeUniqueViolation {
				return fmt.Errorf("postgres: record %d items of run %s: %w", n, t.lease.RunID, err)
			}
			return t.explainRecordedItems(steps, keys, err)
		})
		return nil
	}
	return t.later(func() error { return t.putItems(args, steps, keys) },
		&pgx.QueuedQuery{SQL: sqlPutNewItems, Arguments: args})
}

// explainRecordedItems names an item of a refused PutNewItems, after its
// transaction rolled back: one recorded, a finished one first.
func (t *pgTx) explainRecordedItems(steps, keys []string, refused error) error {
	var step, key, status string
	err := t.conn.QueryRow(t.ctx, sqlRecordedItem, t.lease.RunID, steps, keys).Scan(&step, &key, &status)
	switch {
	case err == nil && isFinished(status):
		return fmt.Errorf("%w: item %s/%s of run %s is already finished; the chunk is rolled back",
			checkpoint.ErrItemFinished, step, key, t.lease.RunID)
	case err == nil:
		return fmt.Errorf("postgres: item %s/%s of run %s is already recorded (%s), though it was given as new; the chunk is rolled back",
			step, key, t.lease.RunID, status)
	case errors.Is(err, pgx.ErrNoRows):
		// Recorded earlier in the rolled-back transaction.
		return fmt.Errorf("postgres: some of the %d new items given for run %s were recorded earlier in the transaction; the chunk is rolled back: %w",
			len(keys), t.lease.RunID, refused)
	default:
		return fmt.Errorf("postgres: name the recorded items of run %s: %w", t.lease.RunID, err)
	}
}

// putItems sends PutItems's statement through the explicit transaction
// and names a refused item.
func (t *pgTx) putItems(args []any, steps, keys []string) error {
	b := &pgx.Batch{}
	b.Queue(sqlPutItems, args...)
	br, err := t.send(b)
	if err != nil {
		return err
	}
	tag, err := br.Exec()
	if err := t.fail(br.Close()); err != nil {
		return err
	}
	if err != nil {
		return t.fail(fmt.Errorf("postgres: record %d items of run %s: %w", len(keys), t.lease.RunID, err))
	}
	if tag.RowsAffected() == int64(len(keys)) {
		return nil
	}
	// A finished item is never written twice: refusing here rolls back
	// the chunk's effects with it, whatever the caller believed. The
	// refused one is looked up only now, so a chunk that records its
	// items costs one round trip and returns no keys.
	var step, key string
	err = t.conn.QueryRow(t.ctx, sqlRefusedItems, t.lease.RunID, steps, keys).Scan(&step, &key)
	switch {
	case err == nil:
		return t.fail(fmt.Errorf("%w: item %s/%s of run %s is already finished; the chunk is rolled back",
			checkpoint.ErrItemFinished, step, key, t.lease.RunID))
	case errors.Is(err, pgx.ErrNoRows):
		// Finished earlier in this very transaction.
		return t.fail(fmt.Errorf("%w: %d of the %d items given for run %s are already finished; the chunk is rolled back",
			checkpoint.ErrItemFinished, int64(len(keys))-tag.RowsAffected(), len(keys), t.lease.RunID))
	default:
		return t.fail(fmt.Errorf("postgres: name the finished items of run %s: %w", t.lease.RunID, err))
	}
}

// explainRefusedItems names an item of a refused PutItems, after its
// transaction rolled back: one recorded finished.
func (t *pgTx) explainRefusedItems(steps, keys []string) error {
	var step, key string
	err := t.conn.QueryRow(t.ctx, sqlRefusedItems, t.lease.RunID, steps, keys).Scan(&step, &key)
	switch {
	case err == nil:
		return fmt.Errorf("%w: item %s/%s of run %s is already finished; the chunk is rolled back",
			checkpoint.ErrItemFinished, step, key, t.lease.RunID)
	case errors.Is(err, pgx.ErrNoRows):
		// Finished earlier in the rolled-back transaction.
		return fmt.Errorf("%w: some of the %d items given for run %s were finished earlier in the transaction; the chunk is rolled back",
			checkpoint.ErrItemFinished, len(keys), t.lease.RunID)
	default:
		return fmt.Errorf("postgres: name the finished items of run %s: %w", t.lease.RunID, err)
	}
}

// AcceptItemChanges implements checkpoint.Tx.
func (t *pgTx) AcceptItemChanges(a checkpoint.Audit, items []checkpoint.Item, changes []checkpoint.ItemChange) error {
	if err := a.Check(); err != nil {
		return fmt.Errorf("%s of %s: %w", a.Command, a.RunID, err)
	}
	steps := make([]string, len(items))
	keys := make([]string, len(items))
	fps := make([][]byte, len(items))
	for i, it := range items {
		steps[i], keys[i], fps[i] = it.Step, it.Key, it.Fingerprint
	}
	b := &pgx.Batch{}
	b.Queue(sqlAcceptItems, t.lease.RunID, steps, keys, fps)
	b.Queue(sqlAudit, a.RunID, ts(a.At), a.Operator, a.Command, a.Reason, a.Details)
	queueChanges(b, t.lease, changes, checkpoint.ItemChangeAccepted, a.At, a.Operator)
	br, err := t.send(b)
	if err != nil {
		return err
	}
	found := map[[2]string]bool{}
	rows, err := br.Query()
	if err == nil {
		for rows.Next() {
			var s, k string
			if err = rows.Scan(&s, &k); err != nil {
				break
			}
			found[[2]string{s, k}] = true
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil && len(changes) > 0 {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return t.fail(fmt.Errorf("postgres: accept changed items of run %s: %w", t.lease.RunID, err))
	}
	for i := range keys {
		if !found[[2]string{steps[i], keys[i]}] {
			return t.fail(fmt.Errorf("%w: item %s/%s of run %s is not recorded; there is no fingerprint to replace",
				checkpoint.ErrNotFound, steps[i], keys[i], t.lease.RunID))
		}
	}
	return nil
}

// PutChunkPlan implements checkpoint.Tx.
func (t *pgTx) PutChunkPlan(p checkpoint.ChunkPlan) error {
	switch p.Status {
	case "":
		p.Status = checkpoint.StepPlanned
	case checkpoint.StepPlanned, checkpoint.ChunkApplied:
	default:
		return fmt.Errorf("postgres: chunk plan %s of %s has status %q; record it %q or %q",
			p.EffectID, p.Step, p.Status, checkpoint.StepPlanned, checkpoint.ChunkApplied)
	}
	b := &pgx.Batch{}
	b.Queue(sqlPutChunkPlan, t.lease.RunID, p.Step, p.EffectID, p.Status, p.Plan)
	if p.Supersedes != "" {
		// Items of the old plan without effects of their own move to the
		// new plan, so finishing it completes them too.
		b.Queue(sqlMoveChunkItems, p.EffectID, t.lease.RunID, p.Step, p.Supersedes)
		b.Queue(sqlSupersedeChunkPlan, t.lease.RunID, p.Step, p.Supersedes)
	}
	return t.write(b, nil)
}

// FinishChunk implements checkpoint.Tx.
func (t *pgTx) FinishChunk(step, effectID string) error {
	b := &pgx.Batch{}
	b.Queue(sqlFinishChunk, t.lease.RunID, step, effectID)
	b.Queue(sqlFinishChunkPlan, t.lease.RunID, step, effectID)
	return t.write(b, nil)
}

// limit turns a limit of 0 or less into PostgreSQL's "no limit" (NULL).
func limit(n int) any {
	if n <= 0 {
		return nil
	}
	return n
}

// Items implements checkpoint.Store: one query, streamed in key order.
func (s *Store) Items(ctx context.Context, q checkpoint.ItemQuery, fn func(checkpoint.Item) error) error {
	var query string
	var args []any
	keysOnly := q.KeysOnly
	rangeCols := false
	switch {
	case len(q.Keys) > 0:
		query, args = sqlItemsByKeys, []any{q.RunID, q.Step, q.Keys}
		if keysOnly {
			query = sqlItemKeysByKey
		}
	case q.From != "" || q.To != "":
		query, args, rangeCols = sqlItemKeysRange, []any{q.RunID, q.Step, q.From, q.To}, true
	case q.Status != "":
		query, args, keysOnly = sqlItemsByStatus, []any{q.RunID, q.Step, q.Status, q.After, limit(q.Limit)}, false
	case keysOnly:
		query = sqlItemKeysAll
		if q.Last {
			query = sqlItemKeysLast
		}
		args = []any{q.RunID, q.Step, limit(q.Limit)}
	default:
		query, args = sqlItemsAll, []any{q.RunID, q.Step}
	}
	op := "read items of " + q.RunID + " " + q.Step
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return s.wrap(op, err)
	}
	defer rows.Close()
	for rows.Next() {
		it := checkpoint.Item{Step: q.Step}
		switch {
		case rangeCols:
			err = rows.Scan(&it.Key, &it.Status, &it.Fingerprint)
		case keysOnly:
			err = rows.Scan(&it.Key, &it.Status, &it.Attempt, &it.Fingerprint)
		default:
			err = rows.Scan(&it.Key, &it.Status, &it.Output, &it.Error, &it.Attempt, &it.Chunk, &it.Fingerprint)
		}
		if err != nil {
			return s.wrap(op, err)
		}
		if err := fn(it); err != nil {
			return err
		}
	}
	return s.wrap(op, rows.Err())
}

// ChunkPlans implements checkpoint.Store: the chunk plans of a step still
// planned.
func (s *Store) ChunkPlans(ctx context.Context, runID, step string) ([]checkpoint.ChunkPlan, error) {
	rows, err := s.pool.Query(ctx, sqlChunkPlans, runID, step)
	if err != nil {
		return nil, s.wrap("read chunk plans of "+runID, err)
	}
	plans, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (checkpoint.ChunkPlan, error) {
		p := checkpoint.ChunkPlan{Step: step}
		return p, r.Scan(&p.EffectID, &p.Status, &p.Plan)
	})
	if len(plans) == 0 {
		plans = nil // as from the SQLite store
	}
	return plans, s.wrap("read chunk plans of "+runID, err)
}

// ItemCounts implements checkpoint.Store.
func (s *Store) ItemCounts(ctx context.Context, runID string) ([]checkpoint.ItemCount, error) {
	rows, err := s.pool.Query(ctx, sqlItemCounts, runID)
	if err != nil {
		return nil, s.wrap("count items of "+runID, err)
	}
	counts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (checkpoint.ItemCount, error) {
		var c checkpoint.ItemCount
		return c, r.Scan(&c.Step, &c.Status, &c.Count)
	})
	return counts, s.wrap("count items of "+runID, err)
}
