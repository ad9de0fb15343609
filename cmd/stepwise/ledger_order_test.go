package main

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/stepwise-run/stepwise/cmd"
)

// TestLedgerSeedOrderFromTheCommandLine: seeding past an unsettled date is
// exit 2 naming --allow-unsettled; with it, the earlier date's check is
// exit 2 saying it has no closing balances (not a list of WRONG accounts);
// seed --json says what it seeded; and the check of the checkpoint
// database for a date settled into a separate ledger names that ledger.
func TestLedgerSeedOrderFromTheCommandLine(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	args := func(a ...string) []string { return append([]string{"--db", db}, a...) }
	mustRun(t, cmd.ExitOK, args("ledger", "seed", "--date", "2026-11-28", "--accounts", "20", "--transfers", "200", "--balance", "5000")...)
	_, errOut := mustRun(t, cmd.ExitUsage, args("ledger", "seed", "--date", "2026-11-27", "--transfers", "100")...)
	wantContains(t, "seed past an unsettled date", errOut, "2026-11-28", "looks unsettled", "--allow-unsettled")
	out, _ := mustRun(t, cmd.ExitOK, args("ledger", "seed", "--date", "2026-11-27", "--transfers", "100", "--allow-unsettled", "--json")...)
	var seeded struct {
		Date      string `json:"date"`
		Transfers int    `json:"transfers"`
	}
	if err := json.Unmarshal([]byte(out), &seeded); err != nil || seeded.Date != "2026-11-27" || seeded.Transfers != 100 {
		t.Fatalf("seed --json printed %q (%v); want date 2026-11-27 and 100 transfers", out, err)
	}
	for _, date := range []string{"2026-11-28", "2026-11-27"} {
		mustRun(t, cmd.ExitOK, args("run", "settle", "-p", "date="+date, "--progress", "none")...)
	}
	out, errOut = mustRun(t, cmd.ExitUsage, args("ledger", "check", "--date", "2026-11-28")...)
	wantContains(t, "check without closing balances", errOut, "2026-11-27 was seeded before 2026-11-28 was settled")
	if out != "" {
		t.Errorf("check without closing balances printed a report:\n%s", out)
	}
	_, errOut = mustRun(t, cmd.ExitUsage, args("ledger", "check", "--date", "2026-11-27")...)
	wantContains(t, "check without opening balances", errOut, "2026-11-27 was seeded before 2026-11-28 was settled")

	// A date settled into another ledger: checking the checkpoint
	// database names it.
	ledger := filepath.Join(t.TempDir(), "ledger.db")
	mustRun(t, cmd.ExitOK, args("ledger", "seed", "--ledger", ledger, "--date", "2026-11-30", "--accounts", "20", "--transfers", "200")...)
	mustRun(t, cmd.ExitOK, args("run", "settle", "-p", "date=2026-11-30", "-p", "ledger="+ledger, "--progress", "none")...)
	_, errOut = mustRun(t, cmd.ExitUsage, args("ledger", "check", "--date", "2026-11-30")...)
	wantContains(t, "check of the wrong ledger", errOut, "2026-11-30 was settled into the ledger "+ledger, "--ledger "+ledger)
	mustRun(t, cmd.ExitOK, args("ledger", "check", "--date", "2026-11-30", "--ledger", ledger)...)
}
