package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

const (
	sqlItemChanges = `SELECT item_key, change, fingerprint, items, status, attempt, at, operator FROM item_changes
WHERE run_id = ? AND step_id = ? ORDER BY item_key`
	sqlClearRefused = `DELETE FROM item_changes WHERE run_id = ? AND step_id = ? AND status = 'refused'`
	sqlPutChange    = `INSERT OR REPLACE INTO item_changes (run_id, step_id, item_key, change, fingerprint, items, status, attempt, at, operator)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	sqlDeleteChanges = `DELETE FROM item_changes WHERE run_id = ? AND step_id = ?`
	sqlPruneChanges  = `DELETE FROM item_changes WHERE run_id = ?`
)

// ItemChanges implements checkpoint.Store.
func (s *Store) ItemChanges(ctx context.Context, runID, step string) ([]checkpoint.ItemChange, error) {
	rows, err := s.rdb.QueryContext(ctx, sqlItemChanges, runID, step)
	if err != nil {
		return nil, s.wrap("read item changes of "+runID+" "+step, err)
	}
	defer rows.Close()
	var out []checkpoint.ItemChange
	for rows.Next() {
		c := checkpoint.ItemChange{Step: step}
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

// RefuseItemChanges implements checkpoint.Tx.
func (t *sqliteTx) RefuseItemChanges(step string, at time.Time, changes []checkpoint.ItemChange) error {
	if err := t.checkFence(); err != nil {
		return err
	}
	if _, err := t.tx.ExecContext(t.ctx, sqlClearRefused, t.lease.RunID, step); err != nil {
		return fmt.Errorf("checkpoint: clear refused changes of %s/%s: %w", t.lease.RunID, step, err)
	}
	for _, c := range changes {
		if err := t.putChange(step, c, checkpoint.ItemChangeRefused, at, ""); err != nil {
			return err
		}
	}
	return nil
}

func (t *sqliteTx) putChange(step string, c checkpoint.ItemChange, status string, at time.Time, operator string) error {
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
