package postgres

import (
	"context"
	"testing"
	"time"
)

// TestHeldLeasesReadOnlyTheRunsInFlight: a worker's look for a gone
// runner's work (every poll of every idle worker) reads the running runs
// through runs_running_lease, never the queue's backlog, on a table of
// 20,000 queued runs that was never analysed.
func TestHeldLeasesReadOnlyTheRunsInFlight(t *testing.T) {
	ctx := context.Background()
	s, c := unanalysedRuns(t, `INSERT INTO runs (id, job, run_key, params, params_hash, status, fence, created_at, updated_at, queue, available_at, lease_owner, lease_until)
SELECT 'bench/' || lpad(i::text, 6, '0'), 'bench', lpad(i::text, 6, '0'), '{}', 'h',
       CASE WHEN i % 5000 = 0 THEN 'running' ELSE 'queued' END, 0, now(), now(), 'default', now() - interval '1 second',
       CASE WHEN i % 5000 = 0 THEN 'host:1 boot=b pidns=1' END, CASE WHEN i % 5000 = 0 THEN now() + interval '1 minute' END
FROM generate_series(0, 19999) AS i`)
	plan := explain(t, c, sqlHeldLeases, time.Now(), "boot=b pidns=1")
	var viaIndex bool
	plan.walk(func(n planNode) { // a bitmap index scan names its index, not its table
		switch {
		case n.Index == "runs_running_lease":
			viaIndex = true
		case n.NodeType == "Seq Scan" && n.Relation == "runs", n.Index == "runs_queue":
			t.Errorf("HeldLeases reads runs by a %s (index %q): it must read only the runs in flight", n.NodeType, n.Index)
		}
	})
	if !viaIndex {
		t.Error("HeldLeases does not read runs through runs_running_lease")
	}
	held, err := s.HeldLeases(ctx, "boot=b pidns=1", time.Now())
	if err != nil || len(held) != 4 {
		t.Fatalf("HeldLeases = %d leases, %v; want the 4 running runs", len(held), err)
	}
}
