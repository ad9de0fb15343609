package sqlite

import (
	"context"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

const (
	// sqlRunItemsByStatus pages through a run's items of one status in
	// (step, key) order, after the previous page's last item.
	sqlRunItemsByStatus = `SELECT step_id, item_key, status, output, error, attempt, chunk FROM items
WHERE run_id = ? AND status = ? AND (step_id, item_key) > (?, ?) ORDER BY step_id, item_key LIMIT ?`
	// sqlRunChunkPlans pages through a run's chunk plans of every status in
	// step order, then effect IDs shortest first: IDs of one step differ in
	// their numbers (fence, chunk), so this lists them in the order they
	// were made (c2 before c10). The keys are sorted alone, then the plans
	// read by key, so the sort never holds the plans themselves.
	sqlRunChunkPlans = `SELECT c.step_id, c.effect_id, c.status, c.plan FROM (
    SELECT step_id, effect_id FROM chunk_plans
    WHERE run_id = ?1 AND (step_id, length(effect_id), effect_id) > (?2, length(?3), ?3)
    ORDER BY step_id, length(effect_id), effect_id LIMIT ?4
) AS k JOIN chunk_plans AS c ON c.run_id = ?1 AND c.step_id = k.step_id AND c.effect_id = k.effect_id
ORDER BY k.step_id, length(k.effect_id), k.effect_id`
	sqlChunkPlanCounts = `SELECT step_id, status, count(*) FROM chunk_plans WHERE run_id = ?
GROUP BY step_id, status ORDER BY step_id, status`
)

// sqlLimit turns a limit of 0 or less into SQLite's "no limit".
func sqlLimit(n int) int {
	if n <= 0 {
		return -1
	}
	return n
}

// RunItems calls fn for a run's item checkpoints with the given status, of
// every batch step, in (step, key) order, one page of them.
func (s *Store) RunItems(ctx context.Context, runID, status string, p checkpoint.Page, fn func(checkpoint.Item) error) error {
	op := "read " + status + " items of " + runID
	rows, err := s.rdb.QueryContext(ctx, sqlRunItemsByStatus, runID, status, p.AfterStep, p.AfterKey, sqlLimit(p.Limit))
	if err != nil {
		return s.wrap(op, err)
	}
	defer rows.Close()
	for rows.Next() {
		var it checkpoint.Item
		var attempt int64
		if err := rows.Scan(&it.Step, &it.Key, &it.Status, &it.Output, &it.Error, &attempt, &it.Chunk); err != nil {
			return s.wrap(op, err)
		}
		it.Attempt = int(attempt)
		if err := fn(it); err != nil {
			return err
		}
	}
	return s.wrap(op, rows.Err())
}

// RunChunkPlans calls fn for a run's chunk plans of every status (planned,
// applied, superseded), one page of them, by step and, within a step, in
// the order they were made (effect IDs shortest first, then by text). The
// page's AfterKey is an effect ID.
func (s *Store) RunChunkPlans(ctx context.Context, runID string, p checkpoint.Page, fn func(checkpoint.ChunkPlan) error) error {
	op := "read chunk plans of " + runID
	rows, err := s.rdb.QueryContext(ctx, sqlRunChunkPlans, runID, p.AfterStep, p.AfterKey, sqlLimit(p.Limit))
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

// ChunkPlanCounts counts a run's chunk plans by step and status (the Count
// of an ItemCount is then a number of plans).
func (s *Store) ChunkPlanCounts(ctx context.Context, runID string) ([]checkpoint.ItemCount, error) {
	return s.counts(ctx, "count chunk plans of "+runID, sqlChunkPlanCounts, runID)
}

func (s *Store) counts(ctx context.Context, op, query string, args ...any) ([]checkpoint.ItemCount, error) {
	rows, err := s.rdb.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, s.wrap(op, err)
	}
	defer rows.Close()
	var out []checkpoint.ItemCount
	for rows.Next() {
		var c checkpoint.ItemCount
		if err := rows.Scan(&c.Step, &c.Status, &c.Count); err != nil {
			return nil, s.wrap(op, err)
		}
		out = append(out, c)
	}
	return out, s.wrap(op, rows.Err())
}

// StoreNow implements checkpoint.Inspector: the zero time, as a SQLite
// store keeps every time on its caller's clock (the local one).
func (s *Store) StoreNow(context.Context) (time.Time, error) { return time.Time{}, nil }
