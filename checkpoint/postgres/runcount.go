package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/internal/rowscan"
)

// sqlRunCounts counts the runs in one pass over the table: by job and
// status, running runs also by owner and by whether their lease expired
// at $1 (the server's now() when $1 is NULL, as claims judge leases);
// $2 to $5 are the run listing's job, key prefix and creation filters.
const sqlRunCounts = `SELECT job, status,
    CASE WHEN status = 'running' THEN coalesce(lease_owner, '') ELSE '' END AS owner,
    (status = 'running' AND lease_until IS NOT NULL AND lease_until <= coalesce($1::timestamptz, now())) AS expired,
    count(*), max(finished_at)
FROM runs
WHERE ($2::text = '' OR job = $2) AND ($3::text = '' OR left(run_key, length($3)) = $3)
  AND ($4::timestamptz IS NULL OR created_at >= $4) AND ($5::timestamptz IS NULL OR created_at < $5)
GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4`

// RunCounts implements checkpoint.Inspector.
func (s *Store) RunCounts(ctx context.Context, f checkpoint.RunFilter, now time.Time) ([]checkpoint.RunCount, error) {
	rows, err := s.pool.Query(ctx, sqlRunCounts, s.clock(now), f.Job, f.RunKeyPrefix, ts(f.CreatedFrom), ts(f.CreatedBefore))
	if err != nil {
		return nil, s.wrap("count runs", err)
	}
	defer rows.Close()
	counts, err := rowscan.Collect(rows, func(r rowscan.Rows) (checkpoint.RunCount, error) {
		var c checkpoint.RunCount
		var finished pgtype.Timestamptz
		err := r.Scan(&c.Job, &c.Status, &c.Owner, &c.Expired, &c.Count, &finished)
		c.LastFinished = tm(finished)
		return c, err
	})
	return counts, s.wrap("count runs", err)
}
