package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stepwise-run/stepwise/checkpoint"
)

const (
	// sqlRunItemsByStatus pages through a run's items of one status in
	// (step, key) order, after the previous page's last item. The keys
	// are COLLATE "C": the order, and so the pages, are bytewise, as on
	// SQLite.
	sqlRunItemsByStatus = `SELECT step_id, ` + itemCols + ` FROM items
WHERE run_id = $1 AND status = $2 AND (step_id, item_key) > ($3, $4)
ORDER BY step_id, item_key LIMIT $5`
	// sqlRunChunkPlans pages through a run's chunk plans of every status
	// by step, then effect IDs shortest first: IDs of one step differ in
	// their numbers (fence, chunk), so this lists them in the order they
	// were made (c2 before c10). The keys are sorted alone, then the plans
	// read by key, so the sort never holds the plans themselves.
	sqlRunChunkPlans = `SELECT c.step_id, c.effect_id, c.status, c.plan FROM (
    SELECT step_id, effect_id FROM chunk_plans
    WHERE run_id = $1 AND (step_id, length(effect_id), effect_id) > ($2, length($3), $3)
    ORDER BY step_id, length(effect_id), effect_id LIMIT $4
) AS k JOIN chunk_plans AS c ON c.run_id = $1 AND c.step_id = k.step_id AND c.effect_id = k.effect_id
ORDER BY k.step_id, length(k.effect_id), k.effect_id`
	sqlChunkPlanCounts = `SELECT step_id, status, count(*) FROM chunk_plans WHERE run_id = $1
GROUP BY step_id, status ORDER BY step_id, status`
)

var _ checkpoint.Inspector = (*Store)(nil)

// RunItems implements checkpoint.Inspector: one query, streamed.
func (s *Store) RunItems(ctx context.Context, runID, status string, p checkpoint.Page, fn func(checkpoint.Item) error) error {
	op := "read " + status + " items of " + runID
	rows, err := s.pool.Query(ctx, sqlRunItemsByStatus, runID, status, p.AfterStep, p.AfterKey, limit(p.Limit))
	if err != nil {
		return s.wrap(op, err)
	}
	defer rows.Close()
	for rows.Next() {
		var it checkpoint.Item
		if err := rows.Scan(&it.Step, &it.Key, &it.Status, &it.Output, &it.Error, &it.Attempt, &it.Chunk, &it.Fingerprint); err != nil {
			return s.wrap(op, err)
		}
		if err := fn(it); err != nil {
			return err
		}
	}
	return s.wrap(op, rows.Err())
}

// RunChunkPlans implements checkpoint.Inspector: one query, streamed.
func (s *Store) RunChunkPlans(ctx context.Context, runID string, p checkpoint.Page, fn func(checkpoint.ChunkPlan) error) error {
	op := "read chunk plans of " + runID
	rows, err := s.pool.Query(ctx, sqlRunChunkPlans, runID, p.AfterStep, p.AfterKey, limit(p.Limit))
	if err != nil {
		return s.wrap(op, err)
	}
	defer rows.Close()
	for rows.Next() {
		var c checkpoint.ChunkPlan
		if err := rows.Scan(&c.Step, &c.EffectID, &c.Status, &c.Plan); err != nil {
			return s.wrap(op, err)
		}
		if err := fn(c); err != nil {
			return err
		}
	}
	return s.wrap(op, rows.Err())
}

// ChunkPlanCounts implements checkpoint.Inspector.
func (s *Store) ChunkPlanCounts(ctx context.Context, runID string) ([]checkpoint.ItemCount, error) {
	op := "count chunk plans of " + runID
	rows, err := s.pool.Query(ctx, sqlChunkPlanCounts, runID)
	if err != nil {
		return nil, s.wrap(op, err)
	}
	counts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (checkpoint.ItemCount, error) {
		var c checkpoint.ItemCount
		return c, r.Scan(&c.Step, &c.Status, &c.Count)
	})
	if len(counts) == 0 {
		counts = nil // as from the SQLite store
	}
	return counts, s.wrap(op, err)
}

// StoreNow implements checkpoint.Inspector: the server's now(), or the
// zero time under Config.CallerClock.
func (s *Store) StoreNow(ctx context.Context) (time.Time, error) {
	if s.cfg.CallerClock {
		return time.Time{}, nil
	}
	var now time.Time
	if err := s.pool.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return time.Time{}, s.wrap("read the server's clock", err)
	}
	return now.UTC(), nil
}
