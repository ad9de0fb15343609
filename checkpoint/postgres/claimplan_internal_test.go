package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

// planNode is one node of EXPLAIN (FORMAT JSON).
type planNode struct {
	NodeType string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Function string     `json:"Function Name"`
	Plans    []planNode `json:"Plans"`
}

// walk calls fn on n and every node under it.
func (n planNode) walk(fn func(planNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

// explain returns the plan of sql with args on conn.
func explain(t *testing.T, conn *pgx.Conn, sql string, args ...any) planNode {
	t.Helper()
	var out []byte
	if err := conn.QueryRow(context.Background(), "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&out); err != nil {
		t.Fatalf("explain: %v", err)
	}
	var plans []struct{ Plan planNode }
	if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
		t.Fatalf("explain output %s: %v", out, err)
	}
	return plans[0].Plan
}

// The claim's plan does not depend on statistics: on a queue of many runs
// just filled and never analysed (the planner guesses a handful of rows
// match), the pick walks the claim index in claim order and stops at its
// LIMIT, with no sort, bitmap or sequential scan, in custom and generic
// plans alike; the rest of the claim reaches runs and attempts by key.
func TestClaimPlanWithoutStatistics(t *testing.T) {
	ctx := context.Background()
	_, c := unanalysedRuns(t, `INSERT INTO runs (id, job, run_key, params, params_hash, status, fence, created_at, updated_at, queue, available_at)
SELECT 'bench/' || lpad(i::text, 6, '0'), CASE WHEN i % 10 = 0 THEN 'other' ELSE 'bench' END, lpad(i::text, 6, '0'), '{}', 'h',
       'queued', 0, now(), now(), 'default', now() - interval '1 second'
FROM generate_series(0, 19999) AS i`)
	var body string
	var config []string
	if err := c.QueryRow(ctx, `SELECT prosrc, coalesce(proconfig, '{}') FROM pg_proc
WHERE proname = 'stepwise_claim_candidates' AND pronamespace = current_schema()::regnamespace`).Scan(&body, &config); err != nil {
		t.Fatalf("read the claim's pick: %v", err)
	}
	// The query the function returns: between RETURN QUERY and its ";".
	_, query, _ := strings.Cut(body, "RETURN QUERY")
	query, _, _ = strings.Cut(query, ";")
	now := time.Now()
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		t.Run(mode, func(t *testing.T) {
			if _, err := c.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
				t.Fatal(err)
			}
			// The pick, planned as the function plans it: under its own
			// settings.
			if _, err := c.Exec(ctx, "BEGIN"); err != nil {
				t.Fatal(err)
			}
			for _, kv := range config {
				k, v, _ := strings.Cut(kv, "=")
				if _, err := c.Exec(ctx, fmt.Sprintf("SET LOCAL %s = %s", pgx.Identifier{k}.Sanitize(), v)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := c.Exec(ctx, "PREPARE stepwise_pick (timestamptz, text[], text[], text[], integer) AS "+query); err != nil {
				t.Fatal(err)
			}
			pick := explain(t, c, fmt.Sprintf("EXECUTE stepwise_pick ('%s', '{}', '{bench}', '{}', 4)", now.Format(time.RFC3339Nano)))
			rollback(ctx, c)
			if _, err := c.Exec(ctx, "DEALLOCATE stepwise_pick"); err != nil {
				t.Fatal(err)
			}
			var ordered bool
			pick.walk(func(n planNode) {
				switch {
				case n.NodeType == "Seq Scan" || n.NodeType == "Sort" || n.NodeType == "Bitmap Heap Scan" || n.NodeType == "Incremental Sort":
					t.Errorf("the claim's pick has a %s (on %q): it must walk the claim index in order", n.NodeType, n.Relation)
				case n.NodeType == "Index Scan" && n.Relation == "runs" && n.Index == "runs_queue":
					ordered = true
				}
			})
			if pick.NodeType != "Limit" || !ordered {
				t.Errorf("the claim's pick is %s without an ordered scan of runs_queue under it (ordered: %v)", pick.NodeType, ordered)
			}
			// The whole claim, as sent.
			claim := explain(t, c, sqlClaimNext, now, []string{}, []string{"bench"}, "o:1", int64(60e6), []string{}, "o", 4)
			finish := explain(t, c, sqlFinish, "bench/000001", int64(1), "succeeded", "", now, 1, int64(0))
			var picked bool
			for _, p := range []planNode{claim, finish} {
				p.walk(func(n planNode) {
					if n.NodeType == "Seq Scan" || n.NodeType == "Bitmap Heap Scan" && n.Relation == "runs" {
						t.Errorf("the claim reads %s by a %s", n.Relation, n.NodeType)
					}
					picked = picked || n.Function == "stepwise_claim_candidates"
				})
			}
			if !picked {
				t.Error("the claim does not pick through stepwise_claim_candidates")
			}
		})
	}
}

// unanalysedRuns opens a store in a schema of its own, fills its runs with
// fill (autovacuum off on runs and attempts, so nothing analyses them) and
// returns it with a connection of its pool, both closed when t ends. It
// fails t unless runs was never analysed.
func unanalysedRuns(t *testing.T, fill string) (*Store, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, Config{URL: pgtest.Schema(t), CallerClock: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	c := conn.Conn()
	for _, q := range []string{
		`ALTER TABLE runs SET (autovacuum_enabled = false)`,
		`ALTER TABLE attempts SET (autovacuum_enabled = false)`,
		fill,
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var reltuples float64
	if err := c.QueryRow(ctx, `SELECT reltuples FROM pg_class WHERE oid = 'runs'::regclass`).Scan(&reltuples); err != nil || reltuples >= 0 {
		t.Fatalf("runs has reltuples %v (%v); the test needs a table never analysed (-1)", reltuples, err)
	}
	return s, c
}
