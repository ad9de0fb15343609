package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
)

// accounts is a user's table for the target tests.
var accounts = checkpoint.Table{Name: "accounts", Key: "id", Value: "balance", Version: "version"}

// opening is the accounts createAccounts opens, at versions 3 and 1 (not
// 0, so a version read back is told from a default).
var opening = map[string]int64{"a": 100, "b": 0}

func createAccounts(t *testing.T, db *sql.DB) {
	t.Helper()
	if _, err := db.Exec(`CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL, version INTEGER NOT NULL);
INSERT INTO accounts VALUES ('a', 100, 3), ('b', 0, 1)`); err != nil {
		t.Fatal(err)
	}
}

// TestOpenTargetSameByIdentity: the store decides "same store" by the
// database file's identity, not by its name: the empty location, the
// checkpoint file under a relative name, through a symlink and through a
// hard link are the same store; a copy of it is not.
func TestOpenTargetSameByIdentity(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	t.Chdir(dir)
	path := filepath.Join(dir, "stepwise.db")
	st, err := sqlite.Open(ctx, sqlite.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	createAccounts(t, st.DB())
	if err := os.Symlink(path, filepath.Join(dir, "link.db")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(path, filepath.Join(dir, "hard.db")); err != nil {
		t.Fatal(err)
	}
	other, err := sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(dir, "other.db")})
	if err != nil {
		t.Fatal(err)
	}
	createAccounts(t, other.DB())
	other.Close()
	for loc, want := range map[string]bool{"": true, "stepwise.db": true, "./stepwise.db": true, "link.db": true, "hard.db": true, "other.db": false} {
		tgt, err := st.OpenTarget(ctx, checkpoint.TargetSpec{Location: loc, Table: accounts})
		if err != nil {
			t.Errorf("OpenTarget(%q): %v", loc, err)
			continue
		}
		if got := tgt.Same(); got != want {
			t.Errorf("OpenTarget(%q).Same() = %v, want %v", loc, got, want)
		}
		tgt.Close()
	}
}

// TestOpenTargetKeepsStoreSettings: a separate target is opened with the
// store's busy timeout and synchronous level, not the defaults.
func TestOpenTargetKeepsStoreSettings(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(dir, "stepwise.db"), Synchronous: sqlite.SyncNormal, BusyTimeout: 1234 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ledger, err := sqlite.OpenTarget(ctx, sqlite.Config{Path: filepath.Join(dir, "ledger.db")})
	if err != nil {
		t.Fatal(err)
	}
	createAccounts(t, ledger)
	ledger.Close()
	tgt, err := st.OpenTarget(ctx, checkpoint.TargetSpec{Location: filepath.Join(dir, "ledger.db"), Table: accounts})
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Close()
	rd, ok := tgt.(interface{ ReadDB() *sql.DB })
	if !ok {
		t.Fatalf("%T has no ReadDB", tgt)
	}
	var busy, sync int
	if err := rd.ReadDB().QueryRow(`PRAGMA busy_timeout`).Scan(&busy); err != nil {
		t.Fatal(err)
	}
	if err := rd.ReadDB().QueryRow(`PRAGMA synchronous`).Scan(&sync); err != nil {
		t.Fatal(err)
	}
	if busy != 1234 || sync != 1 {
		t.Errorf("separate target has busy_timeout %d and synchronous %d; want the store's 1234 and 1 (NORMAL)", busy, sync)
	}
}

// TestTargetView: the set-based view reads every key at once, writes
// compare-and-set, refuses a stale version with a *VersionConflictError
// naming it, and records applied effect IDs, on a separate target's own
// transactions; a read-only target refuses Update.
func TestTargetView(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(dir, "stepwise.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ledgerPath := filepath.Join(dir, "ledger.db")
	ledger, err := sqlite.OpenTarget(ctx, sqlite.Config{Path: ledgerPath})
	if err != nil {
		t.Fatal(err)
	}
	defer ledger.Close()
	createAccounts(t, ledger)
	tgt, err := st.OpenTarget(ctx, checkpoint.TargetSpec{Location: ledgerPath, Table: accounts})
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Close()
	var cur map[string]checkpoint.State
	err = tgt.View(ctx, func(v checkpoint.Target) error { cur, err = v.Read(ctx, []string{"a", "b", "a"}); return err })
	if err != nil {
		t.Fatal(err)
	}
	if want := (checkpoint.State{Value: 100, Version: 3, Exists: true}); cur["a"] != want || len(cur) != 2 {
		t.Errorf("Read = %+v; want a=%+v and b", cur, want)
	}
	for _, keys := range [][]string{{"zz"}, {"a", "zz", "b"}} {
		err = tgt.View(ctx, func(v checkpoint.Target) error { _, err := v.Read(ctx, keys); return err })
		if !errors.Is(err, checkpoint.ErrMissingKey) || !strings.Contains(err.Error(), `"zz"`) {
			t.Errorf("Read(%q) with a missing key: %v; want ErrMissingKey naming zz", keys, err)
		}
	}
	state, err := st.OpenTarget(ctx, checkpoint.TargetSpec{Table: checkpoint.StateTable})
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	err = state.View(ctx, func(v checkpoint.Target) error { cur, err = v.Read(ctx, []string{"x", "y"}); return err })
	if err != nil || len(cur) != 2 || cur["x"] != (checkpoint.State{}) {
		t.Errorf("Read of missing keys of a table that creates them = %+v, %v; want two zero states", cur, err)
	}
	err = tgt.Update(ctx, func(v checkpoint.Target) error {
		if err := v.Write(ctx, []checkpoint.Write{{Key: "a", OldVersion: 3, OldValue: 100, NewValue: 60}, {Key: "b", OldVersion: 1, NewValue: 40}}); err != nil {
			return err
		}
		return v.MarkApplied(ctx, checkpoint.Applied{EffectID: "r/s@1.0", RunID: "r", StepID: "s", At: time.Unix(0, 0)})
	})
	if err != nil {
		t.Fatal(err)
	}
	var conflict *checkpoint.VersionConflictError
	err = tgt.Update(ctx, func(v checkpoint.Target) error {
		return v.Write(ctx, []checkpoint.Write{{Key: "a", OldVersion: 3, NewValue: 1}})
	})
	if !errors.As(err, &conflict) || conflict.Key != "a" || conflict.Expected != 3 || conflict.Found != 4 {
		t.Errorf("stale write: %v; want a version conflict on a, expected 3, found 4", err)
	}
	var applied, other bool
	err = tgt.View(ctx, func(v checkpoint.Target) error {
		var err error
		if applied, err = v.IsApplied(ctx, "r/s@1.0"); err != nil {
			return err
		}
		other, err = v.IsApplied(ctx, "r/s@1.1")
		return err
	})
	if err != nil || !applied || other {
		t.Errorf("IsApplied = %v, %v (err %v); want true for the recorded ID, false for another", applied, other, err)
	}
	// The one write moved 40 from a to b, one version each; the stale one nothing.
	checkpointtest.CheckLedger(t, ledgerPath, accounts, checkpointtest.LedgerCheck{Opening: opening,
		Applied:  []checkpointtest.Transfer{{ID: "r/s@1.0", From: "a", To: "b", Amount: 40}},
		Versions: map[string]int64{"a": 4, "b": 2}})

	ro, err := st.OpenTarget(ctx, checkpoint.TargetSpec{Location: ledgerPath, Table: accounts, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if err := ro.Update(ctx, func(checkpoint.Target) error { return nil }); err == nil {
		t.Error("Update on a read-only target succeeded")
	}
}

// TestSQLTxCommitsWithTheCheckpoint: job SQL written through SQLTx in a
// fenced transaction is rolled back with it.
func TestSQLTxCommitsWithTheCheckpoint(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(t.TempDir(), "stepwise.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	path := st.Path()
	createAccounts(t, st.DB())
	now := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	req := checkpoint.ClaimRequest{RunID: "j/k", Job: "j", RunKey: "k", Params: []byte(`{}`), ParamsHash: "h", Owner: "a:1", Now: now, LeaseFor: time.Minute}
	old, err := st.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	req.Owner, req.Now, req.Force = "b:2", now.Add(2*time.Minute), true
	if _, err := st.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	err = st.InTx(ctx, old.Lease, func(tx checkpoint.Tx) error {
		sqlTx, ok := sqlite.SQLTx(tx)
		if !ok {
			t.Fatal("SQLTx refused a SQLite transaction")
		}
		if _, err := sqlTx.Exec(`UPDATE accounts SET balance = 0 WHERE id = 'a'`); err != nil {
			return err
		}
		return tx.PutStep(checkpoint.Step{ID: "s", Status: checkpoint.StepCompleted, Output: []byte(`1`), StartedAt: now, FinishedAt: now})
	})
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("InTx with a lost lease: %v; want ErrFenced", err)
	}
	// The fenced transaction's job SQL is rolled back: the ledger is as opened.
	checkpointtest.CheckLedger(t, path, accounts, checkpointtest.LedgerCheck{Opening: opening, Versions: map[string]int64{"a": 3, "b": 1}})
}

// A store opened with a relative path keeps naming its own file after the
// process changes directory: "same store" is still its file, and another
// directory's file of the same name is a separate store.
func TestRelativeStoreAfterChdir(t *testing.T) {
	ctx := context.Background()
	first, second := t.TempDir(), t.TempDir()
	t.Chdir(first)
	st, err := sqlite.Open(ctx, sqlite.Config{Path: "ck.db"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if want := filepath.Join(first, "ck.db"); st.Path() != want {
		t.Errorf("Path() = %q; want the absolute %q", st.Path(), want)
	}
	other, err := sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(second, "ck.db")})
	if err != nil {
		t.Fatal(err)
	}
	other.Close()
	t.Chdir(second)
	for _, c := range []struct {
		loc  string
		same bool
	}{{filepath.Join(first, "ck.db"), true}, {"ck.db", false}, {"", true}} {
		et, err := st.OpenTarget(ctx, checkpoint.TargetSpec{Location: c.loc, Table: checkpoint.StateTable, ReadOnly: true})
		if err != nil {
			t.Fatalf("open target at %q: %v", c.loc, err)
		}
		if et.Same() != c.same {
			t.Errorf("target at %q (cwd %s): same store %v, want %v", c.loc, second, et.Same(), c.same)
		}
		et.Close()
	}
}

// Effects are fenced like checkpoints: a transaction whose only writes go
// through Tx.Target commits nothing once another runner claimed the run.
func TestTargetOnlyTransactionIsFenced(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(t.TempDir(), "ck.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	req := checkpoint.ClaimRequest{RunID: "job/k", Job: "job", RunKey: "k", Params: []byte(`{}`), ParamsHash: "h",
		Owner: "a:1", Now: now, LeaseFor: time.Second}
	a, err := st.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	req.Owner, req.Now = "b:2", now.Add(time.Minute)
	if _, err := st.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	err = st.InTx(ctx, a.Lease, func(tx checkpoint.Tx) error {
		v, err := tx.Target(checkpoint.StateTable)
		if err != nil {
			return err
		}
		return v.Write(ctx, []checkpoint.Write{{Key: "k", NewValue: 99, Insert: true}})
	})
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("a stale runner's target-only transaction: %v; want ErrFenced", err)
	}
	var n int
	if err := st.ReadDB().QueryRow(`SELECT count(*) FROM stepwise_state`).Scan(&n); err != nil || n != 0 {
		t.Errorf("stepwise_state has %d rows (%v) after the fenced write; want 0", n, err)
	}
}
