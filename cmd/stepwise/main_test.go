package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/checkpoint/stores"
	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/examples/settlement"
)

// stepwise runs the stock binary's command line in this process, with its
// registry and extra commands, and returns its exit code and output.
func stepwise(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = cmd.Execute(context.Background(), registry(), args, &out, &errb, extraCommands()...)
	return code, out.String(), errb.String()
}

// mustRun runs args and fails the test unless they exit with want.
func mustRun(t *testing.T, want int, args ...string) (stdout, stderr string) {
	t.Helper()
	code, stdout, stderr := stepwise(t, args...)
	if code != want {
		t.Fatalf("stepwise %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, stdout, stderr)
	}
	return stdout, stderr
}

func wantContains(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Errorf("%s does not contain %q:\n%s", what, w, got)
		}
	}
}

func TestDemo(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	out, _ := mustRun(t, cmd.ExitOK, "--db", db, "demo", "--accounts", "40", "--transfers", "400")
	wantContains(t, "demo output", out,
		"seeded a demo ledger in "+db+": 400 transfers on 2026-11-28",
		"run settle/2026-11-28 succeeded (attempt 1): ",
		"settlement 2026-11-28: 400 transfers, ",
		"Try next:",
		"1. crash and rerun:", "demo --date 2026-11-29",
		"2. look inside:", "show settle/2026-11-28",
		"3. audit the ledger:", "ledger check --date 2026-11-28",
	)
	// The summary's counts are the independent audit's.
	ledger := openTestLedger(t, db)
	rep, err := settlement.Check(context.Background(), ledger, "2026-11-28")
	if err != nil || !rep.OK() {
		t.Fatalf("ledger check after the demo: %v\n%s", err, rep)
	}
	wantContains(t, "demo output", out, " posted (", " rejected for overdraft (")
	if !strings.Contains(out, "400 transfers, "+itoa(rep.Posted)+" posted") || !strings.Contains(out, itoa(rep.Rejected)+" rejected for overdraft") {
		t.Errorf("demo summary disagrees with ledger check (%d posted, %d rejected):\n%s", rep.Posted, rep.Rejected, out)
	}

	// The three suggested commands work as printed (with our --db).
	out, _ = mustRun(t, cmd.ExitOK, "--db", db, "show", "settle/2026-11-28")
	wantContains(t, "show output", out, "settle/2026-11-28", "summary")
	out, _ = mustRun(t, cmd.ExitOK, "--db", db, "ledger", "check", "--date", "2026-11-28")
	wantContains(t, "ledger check output", out, "money conserved", "every account equals")
	out, _ = mustRun(t, cmd.ExitOK, "--db", db, "demo", "--date", "2026-11-29", "--transfers", "300")
	wantContains(t, "next day's demo", out, "300 transfers on 2026-11-29", "settlement 2026-11-29: 300 transfers")
	mustRun(t, cmd.ExitOK, "--db", db, "ledger", "check", "--date", "2026-11-29")

	// The demo again on a settled day seeds nothing and prints the summary.
	out, _ = mustRun(t, cmd.ExitOK, "--db", db, "demo", "--transfers", "400")
	wantContains(t, "demo rerun output", out, "already has 2026-11-28's transfers", "settlement 2026-11-28: 400 transfers")
	if strings.Contains(out, "seeded") {
		t.Errorf("demo on a seeded date seeded again:\n%s", out)
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// openTestLedger opens the ledger at loc: a PostgreSQL database (a
// postgres:// URL) or a SQLite file. SQL sent to it uses $n placeholders,
// which both take.
func openTestLedger(t *testing.T, loc string) *sql.DB {
	t.Helper()
	var db *sql.DB
	var err error
	if stores.IsURL(loc) {
		db, err = postgres.OpenDB(context.Background(), postgres.Config{URL: loc})
	} else {
		db, err = sqlite.OpenTarget(context.Background(), sqlite.Config{Path: loc})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// The tests run on the store STEPWISE_TEST_STORE selects: sqlite (the
// default) or postgres, on the server STEPWISE_TEST_PG names, each test in
// a schema of its own. Tests about SQLite files and paths stay on SQLite.
const storeEnv = "STEPWISE_TEST_STORE"

// onPostgres reports whether the tests run on PostgreSQL, failing t on a
// value of STEPWISE_TEST_STORE it does not know.
func onPostgres(t *testing.T) bool {
	t.Helper()
	switch v := os.Getenv(storeEnv); v {
	case "", "sqlite":
		return false
	case "postgres":
		return true
	default:
		t.Fatalf("%s=%q: want sqlite or postgres", storeEnv, v)
		return false
	}
}

// testDB returns a fresh checkpoint location on the selected store: a
// file path in a new temporary directory, or the URL of a new PostgreSQL
// schema. STEPWISE_TEST_STORE=postgres without STEPWISE_TEST_PG fails t.
func testDB(t *testing.T) string {
	t.Helper()
	if !onPostgres(t) {
		return filepath.Join(t.TempDir(), "stepwise.db")
	}
	if os.Getenv(pgtest.EnvURL) == "" {
		t.Fatalf("%s=postgres but %s is not set: give the server's URL, e.g. %s=postgres://postgres@127.0.0.1:5432/test",
			storeEnv, pgtest.EnvURL, pgtest.EnvURL)
	}
	return pgtest.Schema(t)
}

// ledgerLayout is where a test keeps the example ledger: in the checkpoint
// store, or in a database of its own.
type ledgerLayout struct {
	name string
	// ledger returns the separate ledger's location; nil: the checkpoint
	// store's own database.
	ledger func(t *testing.T) string
}

// ledgerLayouts are the layouts for the selected store: the same store
// and a separate SQLite file on both, and on PostgreSQL also another
// PostgreSQL database.
func ledgerLayouts(t *testing.T) []ledgerLayout {
	ls := []ledgerLayout{
		{"same store", nil},
		{"separate store", func(t *testing.T) string { return filepath.Join(t.TempDir(), "ledger.db") }},
	}
	if onPostgres(t) {
		ls = append(ls, ledgerLayout{"separate PostgreSQL database", func(t *testing.T) string { return pgtest.Database(t) }})
	}
	return ls
}

func TestLedgerSeedAndCheck(t *testing.T) {
	t.Parallel()
	for _, layout := range ledgerLayouts(t) {
		t.Run(layout.name, func(t *testing.T) {
			t.Parallel()
			db := testDB(t)
			ledgerPath, ledgerFlag, ledgerParam := db, []string{}, []string{}
			if layout.ledger != nil {
				ledgerPath = layout.ledger(t)
				ledgerFlag = []string{"--ledger", ledgerPath}
				ledgerParam = []string{"-p", "ledger=" + ledgerPath}
			}
			args := func(a ...string) []string { return append([]string{"--db", db}, a...) }

			out, _ := mustRun(t, cmd.ExitOK, args(append([]string{"ledger", "seed", "--date", "2026-11-28",
				"--accounts", "20", "--transfers", "300", "--balance", "5000"}, ledgerFlag...)...)...)
			wantContains(t, "seed output", out, "seeded "+ledgerPath+": 300 transfers on 2026-11-28 (seed 1)")
			check := args(append([]string{"ledger", "check", "--date", "2026-11-28"}, ledgerFlag...)...)

			// Before settlement the balances are the opening ones, which
			// is not what the day's transfers make them.
			out, _ = mustRun(t, 1, check...)
			wantContains(t, "check of an unsettled day", out, "WRONG ")

			settle := args(append([]string{"run", "settle", "-p", "date=2026-11-28", "--progress", "none"}, ledgerParam...)...)
			if code, stdout, stderr := stepwise(t, settle...); code != cmd.ExitOK {
				t.Fatalf("stepwise %s: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", strings.Join(settle, " "), code, stdout, stderr)
			}
			out, _ = mustRun(t, cmd.ExitOK, check...)
			wantContains(t, "check output", out, "ledger check 2026-11-28: 20 accounts, 300 transfers", "money conserved")

			// Corrupt one balance: check exits 1 naming the account.
			l := openTestLedger(t, ledgerPath)
			if _, err := l.Exec(`UPDATE accounts SET balance = balance + 7 WHERE id = 'A-0000003'`); err != nil {
				t.Fatal(err)
			}
			out, errOut := mustRun(t, 1, check...)
			wantContains(t, "check output", out, "WRONG A-0000003", "(off by 7)", "MONEY NOT CONSERVED")
			wantContains(t, "check error", errOut, "ledger check failed: 1 accounts wrong, total off by 7")

			out, _ = mustRun(t, 1, append(check, "--json")...)
			var rep settlement.Report
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("--json output is not a report: %v\n%s", err, out)
			}
			if len(rep.Mismatches) != 1 || rep.Mismatches[0].Account != "A-0000003" || rep.Mismatches[0].Got-rep.Mismatches[0].Want != 7 {
				t.Errorf("--json mismatches %+v, want A-0000003 off by 7", rep.Mismatches)
			}
		})
	}
}

func TestLedgerSeedBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := testDB(t)
	for _, date := range []string{"2026-13-01", "28/11/2026", "2026-02-30"} {
		_, errOut := mustRun(t, cmd.ExitUsage, "--db", db, "ledger", "seed", "--date", date, "--transfers", "10")
		wantContains(t, "seed error", errOut, date)
	}
	_, errOut := mustRun(t, cmd.ExitUsage, "--db", db, "ledger", "seed", "--date", "2026-11-28", "--accounts", "1")
	wantContains(t, "seed error", errOut, "accounts is 1")

	mustRun(t, cmd.ExitOK, "--db", db, "ledger", "seed", "--date", "2026-11-28", "--accounts", "5", "--transfers", "10")
	_, errOut = mustRun(t, cmd.ExitUsage, "--db", db, "ledger", "seed", "--date", "2026-11-28", "--accounts", "5", "--transfers", "10")
	wantContains(t, "seed error", errOut, "already has transfers", "2026-11-28")

	_, errOut = mustRun(t, cmd.ExitUsage, "--db", db, "ledger", "seed", "--transfers", "10")
	wantContains(t, "seed error", errOut, "--date")
	// SQLite: a file in a missing directory.
	_, errOut = mustRun(t, cmd.ExitUsage, "--db", filepath.Join(dir, "missing", "x.db"), "ledger", "seed", "--date", "2026-11-28")
	wantContains(t, "seed error", errOut, filepath.Join(dir, "missing"))
}

// Under `go run` the hints name `go run ./cmd/stepwise`, which starts the
// program again; a built binary names itself after its os.Args[0].
func TestInvokedAs(t *testing.T) {
	saved := os.Args[0]
	t.Cleanup(func() { os.Args[0] = saved })
	os.Args[0] = "/tmp/go-build1234/b001/exe/stepwise"
	if got := invokedAs(); got != "go run ./cmd/stepwise" {
		t.Errorf("under go run: %q", got)
	}
	os.Args[0] = "/usr/local/bin/stepwise"
	if got := invokedAs(); got != "" {
		t.Errorf("a built binary: %q, want \"\" (cmd.Main names it)", got)
	}
}
