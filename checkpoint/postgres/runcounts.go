package postgres

import (
	"context"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// sqlCountRuns counts the runs Runs' filters select, by status.
const sqlCountRuns = `SELECT status, count(*) FROM runs
WHERE ($1::text = '' OR job = $1) AND ($2::text = '' OR left(run_key, length($2)) = $2)
  AND ($3::timestamptz IS NULL OR created_at >= $3) AND ($4::timestamptz IS NULL OR created_at < $4)
GROUP BY status`

// CountRuns implements checkpoint.Inspector.
func (s *Store) CountRuns(ctx context.Context, f checkpoint.RunFilter) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, sqlCountRuns, f.Job, f.RunKeyPrefix, ts(f.CreatedFrom), ts(f.CreatedBefore))
	if err != nil {
		return nil, s.wrap("count runs", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var status string
		var n int64
		if err := rows.Scan(&status, &n); err != nil {
			return nil, s.wrap("count runs", err)
		}
		out[status] = n
	}
	return out, s.wrap("count runs", rows.Err())
}
