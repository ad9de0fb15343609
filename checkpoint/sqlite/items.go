package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/stepwise-run/stepwise/checkpoint"
)

const (
	sqlPutItem = `INSERT INTO items (run_id, step_id, item_key, status, output, error, attempt, chunk, fingerprint)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
ON CONFLICT (run_id, step_id, item_key) DO UPDATE SET
    status = excluded.status, output = excluded.output, error = excluded.error,
    attempt = excluded.attempt, chunk = excluded.chunk, fingerprint = excluded.fingerprint
WHERE items.status NOT IN ('completed', 'rejected')`
	// sqlAcceptItem records an operator-accepted new fingerprint of an
	// item already recorded, whatever its status: nothing else of it moves.
	sqlAcceptItem   = `UPDATE items SET fingerprint = ? WHERE run_id = ? AND step_id = ? AND item_key = ?`
	sqlPutChunkPlan = `INSERT INTO chunk_plans (run_id, step_id, effect_id, status, plan) VALUES (?, ?, ?, ?, ?)`
	sqlFinishChunk  = `UPDATE items SET status = 'completed'
WHERE run_id = ? AND step_id = ? AND chunk = ? AND status = 'planned'`
	sqlSupersedeChunkPlan = `UPDATE chunk_plans SET status = 'superseded' WHERE run_id = ? AND step_id = ? AND effect_id = ? AND status = 'planned'`
	sqlMoveChunkItems     = `UPDATE items SET chunk = ? WHERE run_id = ? AND step_id = ? AND chunk = ? AND status = 'planned'`
	sqlFinishChunkPlan    = `UPDATE chunk_plans SET status = 'applied' WHERE run_id = ? AND step_id = ? AND effect_id = ?`
	sqlChunkPlans         = `SELECT effect_id, status, plan FROM chunk_plans
WHERE run_id = ? AND step_id = ? AND status = 'planned' ORDER BY effect_id`
	sqlItemsAll = `SELECT item_key, status, output, error, attempt, chunk, fingerprint FROM items
WHERE run_id = ? AND step_id = ? ORDER BY item_key`
	sqlItemsByStatus = `SELECT item_key, status, output, error, attempt, chunk, fingerprint FROM items
WHERE run_id = ? AND step_id = ? AND status = ? AND item_key > ? ORDER BY item_key LIMIT ?`
	sqlItemKeysAll  = `SELECT item_key, status, attempt, fingerprint FROM items WHERE run_id = ? AND step_id = ? ORDER BY item_key LIMIT ?`
	sqlItemKeysLast = `SELECT item_key, status, attempt, fingerprint FROM items WHERE run_id = ? AND step_id = ? ORDER BY item_key DESC LIMIT ?`
	// sqlItemKeysRange reads a key range without the attempt: a range comes
	// from a source whose keys ascend, which cannot repeat a key.
	sqlItemKeysRange = `SELECT item_key, status, fingerprint FROM items WHERE run_id = ? AND step_id = ? AND item_key BETWEEN ? AND ? ORDER BY item_key`
	sqlItemCounts    = `SELECT step_id, status, count(*) FROM items WHERE run_id = ? GROUP BY step_id, status ORDER BY step_id, status`
)

// checkFence fails with ErrFenced unless the run is still at the lease's
// fence. Batch writes check it once per chunk transaction.
func (t *sqliteTx) checkFence() error {
	if t.fenced {
		return nil
	}
	var fence int64
	err := t.tx.StmtContext(t.ctx, t.s.stmt.txFence).QueryRowContext(t.ctx, t.lease.RunID).Scan(&fence)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: run %s", checkpoint.ErrNotFound, t.lease.RunID)
	}
	if err != nil { // a failed read is not a missing run
		return fmt.Errorf("checkpoint: read the fence of run %s: %w", t.lease.RunID, err)
	}
	if fence != t.lease.Fence {
		return fmt.Errorf("%w: run %s is at fence %d, this attempt (%d) holds fence %d; it writes nothing more",
			checkpoint.ErrFenced, t.lease.RunID, fence, t.lease.Attempt, t.lease.Fence)
	}
	t.fenced = true
	return nil
}

// PutNewItems implements checkpoint.Tx. SQLite has no cheaper way to
// record new items than PutItems, whose upsert looks for a recorded one
// under each key in the same index probe that inserts it (and never
// overwrites a finished item), so it is PutItems once no item is given
// twice, which the contract refuses.
func (t *sqliteTx) PutNewItems(items []checkpoint.Item) error {
	seen := make(map[[2]string]bool, len(items))
	for _, it := range items {
		k := [2]string{it.Step, it.Key}
		if seen[k] {
			return fmt.Errorf("checkpoint: item %s/%s of run %s is given twice as new; record each item once", it.Step, it.Key, t.lease.RunID)
		}
		seen[k] = true
	}
	return t.PutItems(items)
}

// PutItems implements checkpoint.Tx: putItemsRows items to a statement
// (one prepared multi-row upsert), the rest in one more. Each row is the
// upsert of sqlPutItem, in order, so an item given twice is written as
// twice in a row; a statement that changed fewer rows than it was given
// met a finished item, which is named.
func (t *sqliteTx) PutItems(items []checkpoint.Item) error {
	if err := t.checkFence(); err != nil {
		return err
	}
	args := make([]any, 0, itemColumns*min(len(items), putItemsRows))
	for start := 0; start < len(items); start += putItemsRows {
		batch := items[start:min(start+putItemsRows, len(items))]
		args = args[:0]
		for _, it := range batch {
			args = append(args, t.lease.RunID, it.Step, it.Key, it.Status, it.Output, it.Error, t.lease.Attempt, it.Chunk, it.Fingerprint)
		}
		var res sql.Result
		var err error
		if len(batch) == putItemsRows {
			res, err = t.tx.StmtContext(t.ctx, t.s.stmt.putItems).ExecContext(t.ctx, args...)
		} else {
			res, err = t.tx.ExecContext(t.ctx, sqlPutItems(len(batch)), args...)
		}
		if err != nil {
			return fmt.Errorf("checkpoint: record %d items of run %s: %w", len(batch), t.lease.RunID, err)
		}
		// A finished item is never written twice: refusing here rolls back
		// the chunk's effects with it, whatever the caller believed.
		if n, err := res.RowsAffected(); err != nil || n != int64(len(batch)) {
			return t.finishedItem(batch)
		}
	}
	return nil
}

// itemColumns is how many values sqlPutItems binds per item;
// putItemsRows how many items one statement records (9,000 values, well
// inside SQLite's limit of 32,766).
const (
	itemColumns  = 9
	putItemsRows = 1000
)

// sqlPutItems is sqlPutItem for rows items. Its placeholders are plain ?:
// SQLite looks a numbered one up among those seen before, which for
// thousands of them is slow to prepare and to bind.
func sqlPutItems(rows int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO items (run_id, step_id, item_key, status, output, error, attempt, chunk, fingerprint) VALUES `)
	for i := 0; i < rows; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?,?,?,?,?,?,?,?)")
	}
	b.WriteString(sqlPutItem[strings.Index(sqlPutItem, "\nON CONFLICT"):])
	return b.String()
}

// finishedItem is the error of a PutItems statement that changed fewer
// rows than it was given. It names the first item whose row is not as
// given, so was refused: one finished before the statement (or earlier in
// it, an item given twice).
func (t *sqliteTx) finishedItem(items []checkpoint.Item) error {
	for _, it := range items {
		var got checkpoint.Item
		err := t.tx.QueryRowContext(t.ctx, `SELECT status, output, error, attempt, chunk, fingerprint FROM items
WHERE run_id = ? AND step_id = ? AND item_key = ?`, t.lease.RunID, it.Step, it.Key).
			Scan(&got.Status, &got.Output, &got.Error, &got.Attempt, &got.Chunk, &got.Fingerprint)
		if err != nil {
			return fmt.Errorf("checkpoint: name the finished item of run %s: %w", t.lease.RunID, err)
		}
		if got.Status != it.Status || !bytes.Equal(got.Output, it.Output) || got.Error != it.Error ||
			got.Attempt != t.lease.Attempt || got.Chunk != it.Chunk || !bytes.Equal(got.Fingerprint, it.Fingerprint) {
			return fmt.Errorf("%w: item %s/%s of run %s is already finished; the chunk is rolled back",
				checkpoint.ErrItemFinished, it.Step, it.Key, t.lease.RunID)
		}
	}
	return fmt.Errorf("%w: an item of the %d given for run %s is already finished, as given; the chunk is rolled back",
		checkpoint.ErrItemFinished, len(items), t.lease.RunID)
}

// AcceptItemChanges implements checkpoint.Tx.
func (t *sqliteTx) AcceptItemChanges(a checkpoint.Audit, items []checkpoint.Item, changes []checkpoint.ItemChange) error {
	if err := t.checkFence(); err != nil {
		return err
	}
	for _, it := range items {
		res, err := t.tx.ExecContext(t.ctx, sqlAcceptItem, it.Fingerprint, t.lease.RunID, it.Step, it.Key)
		if err != nil {
			return fmt.Errorf("checkpoint: accept changed item %s/%s: %w", it.Step, it.Key, err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("%w: item %s/%s of run %s is not recorded; there is no fingerprint to replace",
				checkpoint.ErrNotFound, it.Step, it.Key, t.lease.RunID)
		}
	}
	for _, c := range changes {
		if err := t.putChange(c.Step, c, checkpoint.ItemChangeAccepted, a.At, a.Operator); err != nil {
			return err
		}
	}
	if err := insertAudits(t.ctx, t.tx, a); err != nil {
		return fmt.Errorf("checkpoint: record audit of %s: %w", a.RunID, err)
	}
	return nil
}

// PutChunkPlan implements checkpoint.Tx.
func (t *sqliteTx) PutChunkPlan(p checkpoint.ChunkPlan) error {
	switch p.Status {
	case "":
		p.Status = checkpoint.StepPlanned
	case checkpoint.StepPlanned, checkpoint.ChunkApplied:
	default:
		return fmt.Errorf("checkpoint: chunk plan %s of %s has status %q; record it %q or %q",
			p.EffectID, p.Step, p.Status, checkpoint.StepPlanned, checkpoint.ChunkApplied)
	}
	if err := t.checkFence(); err != nil {
		return err
	}
	if _, err := t.tx.ExecContext(t.ctx, sqlPutChunkPlan, t.lease.RunID, p.Step, p.EffectID, p.Status, p.Plan); err != nil {
		return err
	}
	if p.Supersedes != "" {
		// Items of the old plan without effects of their own move to the
		// new plan, so finishing it completes them too.
		if _, err := t.tx.ExecContext(t.ctx, sqlMoveChunkItems, p.EffectID, t.lease.RunID, p.Step, p.Supersedes); err != nil {
			return err
		}
		_, err := t.tx.ExecContext(t.ctx, sqlSupersedeChunkPlan, t.lease.RunID, p.Step, p.Supersedes)
		return err
	}
	return nil
}

// FinishChunk implements checkpoint.Tx.
func (t *sqliteTx) FinishChunk(step, effectID string) error {
	if err := t.checkFence(); err != nil {
		return err
	}
	if _, err := t.tx.ExecContext(t.ctx, sqlFinishChunk, t.lease.RunID, step, effectID); err != nil {
		return err
	}
	_, err := t.tx.ExecContext(t.ctx, sqlFinishChunkPlan, t.lease.RunID, step, effectID)
	return err
}

// Items implements checkpoint.Store.
func (s *Store) Items(ctx context.Context, q checkpoint.ItemQuery, fn func(checkpoint.Item) error) error {
	var rows *sql.Rows
	var err error
	switch {
	case len(q.Keys) > 0:
		cols := "item_key, status, output, error, attempt, chunk, fingerprint"
		if q.KeysOnly {
			cols = "item_key, status, attempt, fingerprint"
		}
		// Only placeholders are added to the text; keys are bound values.
		query := "SELECT " + cols + " FROM items WHERE run_id = ? AND step_id = ? AND item_key IN (?" +
			strings.Repeat(", ?", len(q.Keys)-1) + ") ORDER BY item_key"
		args := make([]any, 0, len(q.Keys)+2)
		args = append(args, q.RunID, q.Step)
		for _, k := range q.Keys {
			args = append(args, k)
		}
		rows, err = s.rdb.QueryContext(ctx, query, args...)
	case q.From != "" || q.To != "":
		return s.itemRange(ctx, q, fn)
	case q.Status != "":
		rows, err = s.rdb.QueryContext(ctx, sqlItemsByStatus, q.RunID, q.Step, q.Status, q.After, sqlLimit(q.Limit))
		q.KeysOnly = false
	case q.KeysOnly:
		query := sqlItemKeysAll
		if q.Last {
			query = sqlItemKeysLast
		}
		rows, err = s.rdb.QueryContext(ctx, query, q.RunID, q.Step, sqlLimit(q.Limit))
	default:
		rows, err = s.rdb.QueryContext(ctx, sqlItemsAll, q.RunID, q.Step)
	}
	if err != nil {
		return s.wrap("read items of "+q.RunID+" "+q.Step, err)
	}
	defer rows.Close()
	for rows.Next() {
		it := checkpoint.Item{Step: q.Step}
		var attempt int64 // scanned as int64: database/sql converts to int through a string
		if q.KeysOnly {
			err = rows.Scan(&it.Key, &it.Status, &attempt, &it.Fingerprint)
		} else {
			err = rows.Scan(&it.Key, &it.Status, &it.Output, &it.Error, &attempt, &it.Chunk, &it.Fingerprint)
		}
		it.Attempt = int(attempt)
		if err != nil {
			return s.wrap("read items of "+q.RunID+" "+q.Step, err)
		}
		if err := fn(it); err != nil {
			return err
		}
	}
	return s.wrap("read items of "+q.RunID+" "+q.Step, rows.Err())
}

// itemRange streams the keys, statuses and fingerprints of a key range with
// a prepared statement: a resumed batch step reads one range per chunk.
func (s *Store) itemRange(ctx context.Context, q checkpoint.ItemQuery, fn func(checkpoint.Item) error) error {
	rows, err := s.stmt.itemRange.QueryContext(ctx, q.RunID, q.Step, q.From, q.To)
	if err != nil {
		return s.wrap("read items of "+q.RunID+" "+q.Step, err)
	}
	defer rows.Close()
	for rows.Next() {
		it := checkpoint.Item{Step: q.Step}
		if err := rows.Scan(&it.Key, &it.Status, &it.Fingerprint); err != nil {
			return s.wrap("read items of "+q.RunID+" "+q.Step, err)
		}
		if err := fn(it); err != nil {
			return err
		}
	}
	return s.wrap("read items of "+q.RunID+" "+q.Step, rows.Err())
}

// ChunkPlans implements checkpoint.Store: the chunk plans of a step still planned.
func (s *Store) ChunkPlans(ctx context.Context, runID, step string) ([]checkpoint.ChunkPlan, error) {
	rows, err := s.rdb.QueryContext(ctx, sqlChunkPlans, runID, step)
	if err != nil {
		return nil, s.wrap("read chunk plans of "+runID, err)
	}
	defer rows.Close()
	var out []checkpoint.ChunkPlan
	for rows.Next() {
		p := checkpoint.ChunkPlan{Step: step}
		if err := rows.Scan(&p.EffectID, &p.Status, &p.Plan); err != nil {
			return nil, s.wrap("read chunk plans of "+runID, err)
		}
		out = append(out, p)
	}
	return out, s.wrap("read chunk plans of "+runID, rows.Err())
}

// ItemCounts implements checkpoint.Store.
func (s *Store) ItemCounts(ctx context.Context, runID string) ([]checkpoint.ItemCount, error) {
	rows, err := s.rdb.QueryContext(ctx, sqlItemCounts, runID)
	if err != nil {
		return nil, s.wrap("count items of "+runID, err)
	}
	defer rows.Close()
	var out []checkpoint.ItemCount
	for rows.Next() {
		var c checkpoint.ItemCount
		if err := rows.Scan(&c.Step, &c.Status, &c.Count); err != nil {
			return nil, s.wrap("count items of "+runID, err)
		}
		out = append(out, c)
	}
	return out, s.wrap("count items of "+runID, rows.Err())
}
