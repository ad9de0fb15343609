package postgres

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stepwise-run/stepwise/checkpoint"
)

const (
	sqlItemChanges = `SELECT item_key, change, fingerprint, items, status, attempt, at, operator FROM item_changes
WHERE run_id = $1 AND step_id = $2 ORDER BY item_key`
	sqlClearRefused = `DELETE FROM item_changes WHERE run_id = $1 AND step_id = $2 AND status = 'refused'`
	// sqlPutChanges records changes from arrays in one statement, a later
	// decision on an item replacing an earlier one.
	sqlPutChanges = `INSERT INTO item_changes (run_id, step_id, item_key, change, fingerprint, items, status, attempt, at, operator)
SELECT $1, u.step, u.key, u.change, u.fingerprint, u.items, $2, $3, $4, $5
FROM unnest($6::text[], $7::text[], $8::text[], $9::bytea[], $10::bigint[]) AS u(step, key, change, fingerprint, items)
ON CONFLICT (run_id, step_id, item_key) DO UPDATE SET
    change = excluded.change, fingerprint = excluded.fingerprint, items = excluded.items,
    status = excluded.status, attempt = excluded.attempt, at = excluded.at, operator = excluded.operator`
)

// ItemChanges implements checkpoint.Store.
func (s *Store) ItemChanges(ctx context.Context, runID, step string) ([]checkpoint.ItemChange, error) {
	rows, err := s.pool.Query(ctx, sqlItemChanges, runID, step)
	if err != nil {
		return nil, s.wrap("read item changes of "+runID+" "+step, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (checkpoint.ItemChange, error) {
		c := checkpoint.ItemChange{Step: step}
		err := r.Scan(&c.Key, &c.Change, &c.Fingerprint, &c.Items, &c.Status, &c.Attempt, &c.At, &c.Operator)
		return c, err
	})
	return out, s.wrap("read item changes of "+runID+" "+step, err)
}

// RefuseItemChanges implements checkpoint.Tx.
func (t *pgTx) RefuseItemChanges(step string, at time.Time, changes []checkpoint.ItemChange) error {
	b := &pgx.Batch{}
	b.Queue(sqlClearRefused, t.lease.RunID, step)
	changes = slices.Clone(changes)
	for i := range changes {
		changes[i].Step = step // the step named, as on SQLite
	}
	queueChanges(b, t.lease, changes, checkpoint.ItemChangeRefused, at, "")
	return t.write(b, func(err error) error {
		return fmt.Errorf("postgres: record refused item changes of %s/%s: %w", t.lease.RunID, step, err)
	})
}

// queueChanges queues the upsert of changes with one status and operator;
// nothing when there are none.
func queueChanges(b *pgx.Batch, l checkpoint.Lease, changes []checkpoint.ItemChange, status string, at time.Time, operator string) {
	if len(changes) == 0 {
		return
	}
	// One row per item: the last decision on an item given twice wins,
	// as SQLite's INSERT OR REPLACE does (an upsert may not touch a row
	// twice in one statement).
	last := map[[2]string]int{}
	for i, c := range changes {
		last[[2]string{c.Step, c.Key}] = i
	}
	kept := changes[:0:0]
	for i, c := range changes {
		if last[[2]string{c.Step, c.Key}] == i {
			kept = append(kept, c)
		}
	}
	changes = kept
	steps := make([]string, len(changes))
	keys := make([]string, len(changes))
	kinds := make([]string, len(changes))
	fps := make([][]byte, len(changes))
	counts := make([]int64, len(changes))
	for i, c := range changes {
		steps[i], keys[i], kinds[i], fps[i], counts[i] = c.Step, c.Key, c.Change, c.Fingerprint, max(c.Items, 1)
	}
	b.Queue(sqlPutChanges, l.RunID, status, l.Attempt, at, operator, steps, keys, kinds, fps, counts)
}
