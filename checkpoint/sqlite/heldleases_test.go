package sqlite

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHeldLeasesReadOnlyTheRunsInFlight: a worker's look for a gone
// runner's work (every poll of every idle worker) reads the running runs
// through runs_running_lease, never by walking the queue's backlog.
func TestHeldLeasesReadOnlyTheRunsInFlight(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, Config{Path: filepath.Join(t.TempDir(), "held.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rows, err := s.rdb.QueryContext(ctx, "EXPLAIN QUERY PLAN "+sqlHeldLeases, fmtTime(time.Now()), "boot=b pidns=1")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if !strings.Contains(text, "runs USING INDEX runs_running_lease") {
		t.Errorf("HeldLeases does not read runs through runs_running_lease; its plan:\n%s", text)
	}
	if strings.Contains(text, "runs_queue") || strings.Contains(text, "SCAN runs\n") || strings.HasSuffix(text, "SCAN runs") {
		t.Errorf("HeldLeases walks the queue's runs; its plan:\n%s", text)
	}
}
