package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// MaintenanceWarnings names the queue's tables whose autovacuum is
// disabled, and the server's setting when it is off; it says nothing of
// tables left as they were created on a server with autovacuum on.
func TestMaintenanceWarnings(t *testing.T) {
	ctx := context.Background()
	st, _ := openFresh(t)
	var _ checkpoint.MaintenanceChecker = st
	var on bool
	if err := st.Pool().QueryRow(ctx, "SELECT current_setting('autovacuum') = 'on'").Scan(&on); err != nil {
		t.Fatal(err)
	}
	before, err := st.MaintenanceWarnings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	serverOff := func(ws []string) bool {
		return len(ws) > 0 && strings.Contains(ws[0], "autovacuum is off on server") &&
			strings.Contains(ws[0], "runs, attempts, partitions, outbox") && strings.Contains(ws[0], "VACUUM ANALYZE")
	}
	if on && len(before) != 0 || !on && (len(before) != 1 || !serverOff(before)) {
		t.Fatalf("autovacuum on=%t, tables as created: warnings %q; want %s", on, before,
			map[bool]string{true: "none", false: "one, naming the server's setting and the tables"}[on])
	}
	for _, q := range []string{"ALTER TABLE attempts SET (autovacuum_enabled = false)", "ALTER TABLE runs SET (autovacuum_enabled = off, fillfactor = 90)"} {
		if _, err := st.Pool().Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	after, err := st.MaintenanceWarnings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before)+1 || !strings.Contains(after[len(after)-1], "disabled for the tables attempts, runs (") ||
		!strings.Contains(after[len(after)-1], "RESET (autovacuum_enabled)") {
		t.Fatalf("with autovacuum disabled on attempts and runs: warnings %q; want the earlier ones and one naming attempts, runs and the fix", after)
	}
}
