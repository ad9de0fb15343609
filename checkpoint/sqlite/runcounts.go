package sqlite

import (
	"context"
	"database/sql"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// sqlCountRuns counts the runs Runs' filters select, by status.
const sqlCountRuns = `SELECT status, count(*) FROM runs
WHERE (?1 = '' OR job = ?1) AND (?2 = '' OR substr(run_key, 1, length(?2)) = ?2)
  AND (?3 = '' OR created_at >= ?3) AND (?4 = '' OR created_at < ?4)
GROUP BY status`

// CountRuns implements checkpoint.Inspector.
func (s *Store) CountRuns(ctx context.Context, f checkpoint.RunFilter) (map[string]int64, error) {
	rows, err := s.rdb.QueryContext(ctx, sqlCountRuns, f.Job, f.RunKeyPrefix, fmtTime(f.CreatedFrom), fmtTime(f.CreatedBefore))
	if err != nil {
		return nil, s.wrap("count runs", err)
	}
	return countByStatus(rows, func(err error) error { return s.wrap("count runs", err) })
}

func countByStatus(rows *sql.Rows, wrap func(error) error) (map[string]int64, error) {
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var status string
		var n int64
		if err := rows.Scan(&status, &n); err != nil {
			return nil, wrap(err)
		}
		out[status] = n
	}
	return out, wrap(rows.Err())
}
