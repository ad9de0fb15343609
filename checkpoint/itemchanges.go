package checkpoint

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// Statuses of an ItemChange.
const (
	// ItemChangeRefused: a rerun found the change and refused to go on;
	// the refusal named it to the operator, who may accept it.
	ItemChangeRefused = "refused"
	// ItemChangeAccepted: an operator accepted the change (audited).
	ItemChangeAccepted = "accepted"
)

// ItemChange is a change to a batch step's source that a rerun found (a
// finished item whose content changed, one no longer yielded, a new item
// beyond the declared total or among finished ones) and what was decided:
// refused, and named to the operator, or accepted by one. An acceptance
// covers only changes a refusal recorded, matched by key, kind and
// fingerprint, so an operator accepts exactly what was shown.
type ItemChange struct {
	Step string
	// Key is the item's key; "" stands for finished items that could not
	// be named (Items counts them).
	Key    string
	Change string // the kind of change, as the batch step names it
	// Fingerprint is the item's fingerprint as the refusal found it (nil
	// for an item no longer yielded).
	Fingerprint []byte
	Items       int64 // 1, or the count of unnamed items for Key ""
	Status      string
	Attempt     int       // the attempt that recorded the row
	At          time.Time // when it was refused or accepted
	Operator    string    // who accepted it; "" while refused
}

const (
	sqlItemChanges = `SELECT item_key, change, fingerprint, items, status, attempt, at, operator FROM item_changes
WHERE run_id = ? AND step_id = ? ORDER BY item_key`
	sqlClearRefused = `DELETE FROM item_changes WHERE run_id = ? AND step_id = ? AND status = 'refused'`
	sqlPutChange    = `INSERT OR REPLACE INTO item_changes (run_id, step_id, item_key, change, fingerprint, items, status, attempt, at, operator)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	sqlDeleteChanges = `DELETE FROM item_changes WHERE run_id = ? AND step_id = ?`
	sqlPruneChanges  = `DELETE FROM item_changes WHERE run_id = ?`
)

// ItemChanges implements Store.
func (s *SQLite) ItemChanges(ctx context.Context, runID, step string) ([]ItemChange, error) {
	rows, err := s.rdb.QueryContext(ctx, sqlItemChanges, runID, step)
	if err != nil {
		return nil, s.wrap("read item changes of "+runID+" "+step, err)
	}
	defer rows.Close()
	var out []ItemChange
	for rows.Next() {
		c := ItemChange{Step: step}
		var at sql.NullString
		var attempt int64
		if err := rows.Scan(&c.Key, &c.Change, &c.Fingerprint, &c.Items, &c.Status, &attempt, &at, &c.Operator); err != nil {
			return nil, s.wrap("read item changes of "+runID+" "+step, err)
		}
		c.Attempt, c.At = int(attempt), parseTime(at)
		out = append(out, c)
	}
	return out, s.wrap("read item changes of "+runID+" "+step, rows.Err())
}

// RefuseItemChanges implements Tx.
func (t *sqliteTx) RefuseItemChanges(step string, at time.Time, changes []ItemChange) error {
	if err := t.checkFence(); err != nil {
		return err
	}
	if _, err := t.tx.ExecContext(t.ctx, sqlClearRefused, t.lease.RunID, step); err != nil {
		return fmt.Errorf("checkpoint: clear refused changes of %s/%s: %w", t.lease.RunID, step, err)
	}
	for _, c := range changes {
		if err := t.putChange(step, c, ItemChangeRefused, at, ""); err != nil {
			return err
		}
	}
	return nil
}

func (t *sqliteTx) putChange(step string, c ItemChange, status string, at time.Time, operator string) error {
	n := c.Items
	if n <= 0 {
		n = 1
	}
	_, err := t.tx.ExecContext(t.ctx, sqlPutChange, t.lease.RunID, step, c.Key, c.Change, c.Fingerprint, n, status,
		t.lease.Attempt, fmtTime(at), operator)
	if err != nil {
		return fmt.Errorf("checkpoint: record %s change of item %s/%s: %w", status, step, c.Key, err)
	}
	return nil
}
