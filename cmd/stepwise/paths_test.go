package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/cmd"
)

// These tests are about SQLite files and the paths that name them
// (relative paths made absolute, missing files, files that are not a
// ledger): they run on SQLite whatever STEPWISE_TEST_STORE says.

// files lists the names in dir.
func files(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestRelativeLedgerResumesFromAnotherDirectory: -p ledger=ledger.db is
// stored as the absolute path of the directory the run was created in, so
// show displays it and a resume from another directory settles the same
// ledger, creating nothing where it runs. The same relative path typed in
// the other directory names another file: refused while missing, a params
// mismatch once it exists. (t.Chdir: not in parallel.)
func TestRelativeLedgerResumesFromAnotherDirectory(t *testing.T) {
	one, two := t.TempDir(), t.TempDir()
	ledger := filepath.Join(one, "ledger.db")
	t.Chdir(one)
	mustRun(t, cmd.ExitOK, "--db", "stepwise.db", "ledger", "seed", "--ledger", "ledger.db", "--date", "2026-11-28",
		"--accounts", "20", "--transfers", "300", "--balance", "5000")
	// A balance the first credit overflows: the run fails with nothing of
	// its one chunk committed.
	l := openTestLedger(t, ledger)
	if _, err := l.Exec(`UPDATE accounts SET balance = 9223372036854775806 WHERE id = 'A-0000001'`); err != nil {
		t.Fatal(err)
	}
	_, errOut := mustRun(t, cmd.ExitFailed, "--db", "stepwise.db", "run", "settle", "-p", "date=2026-11-28", "-p", "ledger=ledger.db",
		"-p", "chunk=1000", "--progress", "none")
	wantContains(t, "overflow error", errOut, "A-0000001", "overflow")

	t.Chdir(two)
	db := filepath.Join(one, "stepwise.db")
	out, _ := mustRun(t, cmd.ExitOK, "--db", db, "show", "settle/2026-11-28", "--json")
	var shown struct {
		Run struct {
			Params map[string]any `json:"params"`
		} `json:"run"`
	}
	if err := json.Unmarshal([]byte(out), &shown); err != nil {
		t.Fatalf("show --json: %v\n%s", err, out)
	}
	if got := shown.Run.Params["ledger"]; got != ledger {
		t.Errorf("stored ledger parameter %v; want the absolute %s", got, ledger)
	}
	if _, err := l.Exec(`UPDATE accounts SET balance = (SELECT balance FROM opening_balances WHERE account_id = 'A-0000001')
WHERE id = 'A-0000001'`); err != nil {
		t.Fatal(err)
	}
	mustRun(t, cmd.ExitOK, "--db", db, "resume", "settle/2026-11-28", "--progress", "none")
	out, _ = mustRun(t, cmd.ExitOK, "--db", db, "ledger", "check", "--ledger", ledger, "--date", "2026-11-28")
	wantContains(t, "ledger check after the resume", out, "300 transfers", "money conserved")
	if got := files(t, two); len(got) != 0 {
		t.Errorf("commands run in %s created %v there", two, got)
	}

	// The same relative path in the other directory is another file.
	_, errOut = mustRun(t, cmd.ExitUsage, "--db", db, "run", "settle", "-p", "date=2026-11-28", "-p", "ledger=ledger.db", "--progress", "none")
	wantContains(t, "missing ledger", errOut, filepath.Join(two, "ledger.db"), "does not exist")
	if got := files(t, two); len(got) != 0 {
		t.Errorf("a run with a missing ledger created %v", got)
	}
	if err := os.WriteFile(filepath.Join(two, "ledger.db"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut = mustRun(t, cmd.ExitUsage, "--db", db, "run", "settle", "-p", "date=2026-11-28", "-p", "ledger=ledger.db",
		"-p", "chunk=1000", "--progress", "none")
	wantContains(t, "params mismatch", errOut, ledger, filepath.Join(two, "ledger.db"))
}

// TestReadOnlyCommandsCreateNothing: runs, show, resume, run --dry-run,
// backfill --dry-run and ledger check on a missing checkpoint database or
// ledger exit 2 naming its absolute path (given relative: t.Chdir, not in
// parallel) and create no file.
func TestReadOnlyCommandsCreateNothing(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	abs := filepath.Join(dir, "missing.db")
	for _, args := range [][]string{
		{"--db", "missing.db", "runs"},
		{"--db", "missing.db", "show", "settle/2026-11-28"},
		{"--db", "missing.db", "resume", "settle/2026-11-28"},
		{"--db", "missing.db", "run", "settle", "-p", "date=2026-11-28", "--dry-run"},
		{"--db", "missing.db", "backfill", "settle", "--from", "2026-11-28", "--to", "2026-11-29", "--dry-run"},
		{"--db", "missing.db", "ledger", "check", "--date", "2026-11-28"},
		{"--db", "missing.db", "ledger", "check", "--ledger", "missing.db", "--date", "2026-11-28"},
	} {
		_, errOut := mustRun(t, cmd.ExitUsage, args...)
		wantContains(t, strings.Join(args, " "), errOut, abs, "does not exist")
		if got := files(t, dir); len(got) != 0 {
			t.Fatalf("stepwise %s created %v", strings.Join(args, " "), got)
		}
	}
	// A missing separate ledger under an existing checkpoint database.
	mustRun(t, cmd.ExitOK, "--db", "stepwise.db", "ledger", "seed", "--date", "2026-11-28", "--accounts", "5", "--transfers", "10")
	before := files(t, dir)
	for _, args := range [][]string{
		{"--db", "stepwise.db", "ledger", "check", "--ledger", "missing.db", "--date", "2026-11-28"},
		{"--db", "stepwise.db", "run", "settle", "-p", "date=2026-11-28", "-p", "ledger=missing.db", "--dry-run"},
		{"--db", "stepwise.db", "run", "settle", "-p", "date=2026-11-28", "-p", "ledger=missing.db"},
	} {
		_, errOut := mustRun(t, cmd.ExitUsage, args...)
		wantContains(t, strings.Join(args, " "), errOut, abs, "does not exist")
		if got := files(t, dir); !slices.Equal(got, before) {
			t.Fatalf("stepwise %s: files %v, were %v", strings.Join(args, " "), got, before)
		}
	}
	out, _ := mustRun(t, cmd.ExitOK, "--db", "stepwise.db", "runs")
	wantContains(t, "runs", out, "no runs yet")
}

// TestBadInputExitsTwo: bad input to demo and ledger check is exit 2 and
// creates nothing; a wrong ledger is exit 1.
func TestBadInputExitsTwo(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := filepath.Join(dir, "stepwise.db")
	for _, args := range [][]string{
		{"demo", "--date", "2026-13-01"},
		{"demo", "--date", "28/11/2026"},
		{"demo", "--accounts", "1"},
		{"demo", "--transfers", "-1"},
		{"ledger", "seed", "--date", "2026-02-30"},
		{"ledger", "seed", "--date", "2026-11-28", "--balance", "9223372036854775807"},
	} {
		_, errOut := mustRun(t, cmd.ExitUsage, append([]string{"--db", db}, args...)...)
		if errOut == "" {
			t.Errorf("%v: no error message", args)
		}
		if got := files(t, dir); len(got) != 0 {
			t.Fatalf("%v with bad input created %v", args, got)
		}
	}
	mustRun(t, cmd.ExitOK, "--db", db, "ledger", "seed", "--date", "2026-11-28", "--accounts", "5", "--transfers", "10")
	for _, tc := range []struct {
		date    string
		mention string
	}{{"2026-13-01", "not YYYY-MM-DD"}, {"28/11/2026", "not YYYY-MM-DD"}, {"2026-11-29", "no opening balances for 2026-11-29"}} {
		_, errOut := mustRun(t, cmd.ExitUsage, "--db", db, "ledger", "check", "--date", tc.date)
		wantContains(t, "ledger check --date "+tc.date, errOut, tc.date, tc.mention)
	}
	notLedger := filepath.Join(dir, "other.db")
	st, err := sqlite.Open(context.Background(), sqlite.Config{Path: notLedger}) // a checkpoint database, not a ledger
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	_, errOut := mustRun(t, cmd.ExitUsage, "--db", db, "ledger", "check", "--ledger", notLedger, "--date", "2026-11-28")
	wantContains(t, "check of a file that is not a ledger", errOut, "not a ledger")

	// A total that overflows is a failed audit, not bad input.
	l := openTestLedger(t, db)
	if _, err := l.Exec(`UPDATE accounts SET balance = 4611686018427387904`); err != nil {
		t.Fatal(err)
	}
	_, errOut = mustRun(t, cmd.ExitFailed, "--db", db, "ledger", "check", "--date", "2026-11-28")
	wantContains(t, "overflowing check", errOut, "overflow", "current balances")
}
