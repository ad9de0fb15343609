package sqlite

import (
	"context"
	"database/sql"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/internal/rowscan"
)

// sqlRunCounts counts the runs in one pass over the table: by job and
// status, running runs also by owner and by whether their lease expired
// at ?1 (lease_until is fixed-width text, so it compares as time); ?2 to
// ?5 are the run listing's job, key prefix and creation filters.
const sqlRunCounts = `SELECT job, status,
    CASE WHEN status = 'running' THEN coalesce(lease_owner, '') ELSE '' END AS owner,
    CASE WHEN status = 'running' AND coalesce(lease_until, '') <> '' AND lease_until <= ?1 THEN 1 ELSE 0 END AS expired,
    count(*), max(finished_at)
FROM runs
WHERE (?2 = '' OR job = ?2) AND (?3 = '' OR substr(run_key, 1, length(?3)) = ?3)
  AND (?4 = '' OR created_at >= ?4) AND (?5 = '' OR created_at < ?5)
GROUP BY job, status, owner, expired ORDER BY job, status, owner, expired`

// RunCounts implements checkpoint.Inspector.
func (s *Store) RunCounts(ctx context.Context, f checkpoint.RunFilter, now time.Time) ([]checkpoint.RunCount, error) {
	rows, err := s.rdb.QueryContext(ctx, sqlRunCounts, fmtTime(now), f.Job, f.RunKeyPrefix, fmtTime(f.CreatedFrom), fmtTime(f.CreatedBefore))
	if err != nil {
		return nil, s.wrap("count runs", err)
	}
	defer rows.Close()
	counts, err := rowscan.Collect(rows, func(r rowscan.Rows) (checkpoint.RunCount, error) {
		var c checkpoint.RunCount
		var finished sql.NullString
		err := r.Scan(&c.Job, &c.Status, &c.Owner, &c.Expired, &c.Count, &finished)
		c.LastFinished = parseTime(finished)
		return c, err
	})
	return counts, s.wrap("count runs", err)
}
