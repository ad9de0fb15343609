package postgres

import (
	"context"
	"fmt"
	"strings"
)

// queueTables are the tables a pool of workers rewrites rows of on every
// claim, heartbeat and finish.
var queueTables = []string{"runs", "attempts", "partitions", "outbox"}

// sqlAutovacuum reads the server's autovacuum setting and which of the
// tables $1 (resolved through the search_path, as the store's statements
// are) have autovacuum disabled by a storage parameter.
const sqlAutovacuum = `SELECT current_setting('autovacuum') = 'on',
    coalesce((SELECT array_agg(c.relname::text ORDER BY c.relname)
        FROM unnest($1::text[]) AS t(name)
        JOIN pg_class c ON c.oid = to_regclass(t.name)
        WHERE EXISTS (SELECT 1 FROM unnest(c.reloptions) AS o(opt)
            WHERE lower(opt) IN ('autovacuum_enabled=false', 'autovacuum_enabled=off', 'autovacuum_enabled=0',
                                 'autovacuum_enabled=no', 'autovacuum_enabled=f', 'autovacuum_enabled=n'))), '{}')`

// MaintenanceWarnings implements checkpoint.MaintenanceChecker: it warns
// when autovacuum is off for the server or for any of the tables the
// queue rewrites (runs, attempts, partitions, outbox).
func (s *Store) MaintenanceWarnings(ctx context.Context) ([]string, error) {
	var (
		on  bool
		off []string
	)
	if err := s.pool.QueryRow(ctx, sqlAutovacuum, queueTables).Scan(&on, &off); err != nil {
		return nil, s.wrap("read the autovacuum settings", err)
	}
	const harm = "dead rows and stale planner statistics pile up as runs are claimed, renewed and finished, and claims slow down as the tables grow"
	var warn []string
	if !on {
		warn = append(warn, fmt.Sprintf("autovacuum is off on %s: on the tables %s %s; turn autovacuum on (autovacuum = on in postgresql.conf), or run VACUUM ANALYZE on them regularly",
			s.where, strings.Join(queueTables, ", "), harm))
	}
	if len(off) > 0 {
		warn = append(warn, fmt.Sprintf("autovacuum is disabled for the tables %s (storage parameter autovacuum_enabled): %s; run ALTER TABLE … RESET (autovacuum_enabled) on them, or VACUUM ANALYZE them regularly",
			strings.Join(off, ", "), harm))
	}
	return warn, nil
}
