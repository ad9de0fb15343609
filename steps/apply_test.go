package steps_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/steps"
)

var accountsTable = checkpoint.Table{Name: "accounts", Key: "id", Value: "balance", Version: "version"}

const createAccounts = `CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL, version INTEGER NOT NULL)`

// ledger creates the accounts table in db with the given balances.
func ledger(t *testing.T, db *sql.DB, balances map[string]int64) {
	t.Helper()
	if _, err := db.Exec(createAccounts); err != nil {
		t.Fatal(err)
	}
	for id, b := range balances {
		if _, err := db.Exec(`INSERT INTO accounts VALUES (?, ?, 0)`, id, b); err != nil {
			t.Fatal(err)
		}
	}
}

func balance(t *testing.T, db *sql.DB, id string) (value, version int64) {
	t.Helper()
	if err := db.QueryRow(`SELECT balance, version FROM accounts WHERE id = ?`, id).Scan(&value, &version); err != nil {
		t.Fatal(err)
	}
	return value, version
}

// beginEffects claims runID afresh (a new attempt) and opens its steps.Run.
func beginEffects(t *testing.T, st *sqlite.Store, runID string) *steps.Run {
	t.Helper()
	ctx := context.Background()
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: runID, Job: "j", RunKey: "k", Params: []byte("{}"), ParamsHash: "h",
		Owner: "test:1", Now: time.Now(), LeaseFor: time.Minute, OwnerGone: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	run, err := steps.Begin(ctx, steps.Config{Store: st, Lease: c.Lease})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Close() })
	return run
}

func transfer(from, to string, amount int64) func(context.Context, *steps.Effects) (string, error) {
	return func(ctx context.Context, e *steps.Effects) (string, error) {
		e.Add(from, -amount, steps.NotBelow(0))
		e.Add(to, amount)
		return "moved", nil
	}
}

func TestApplySameStore(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	ledger(t, st.DB(), map[string]int64{"a": 1000, "b": 0})
	target := steps.Target{Table: accountsTable}

	run := beginEffects(t, st, "j/k")
	out, err := steps.Apply(ctx, run, "post/T1", target, transfer("a", "b", 300))
	if err != nil || out != "moved" {
		t.Fatalf("Apply = %q, %v", out, err)
	}
	if v, ver := balance(t, st.DB(), "a"); v != 700 || ver != 1 {
		t.Fatalf("a = %d v%d, want 700 v1", v, ver)
	}
	if s := run.Stats(); s.Effects != 2 || s.Executed != 1 {
		t.Fatalf("stats %+v, want 2 effects applied by 1 step", s)
	}
	// Overdraft: rejected and pinned, nothing applied.
	_, err = steps.Apply(ctx, run, "post/T2", target, transfer("a", "b", 701))
	var rej *steps.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("overdraft: err = %v, want *RejectedError", err)
	}
	if v, _ := balance(t, st.DB(), "a"); v != 700 {
		t.Fatalf("rejected transfer moved money: a = %d", v)
	}

	// Top the account up; a rerun must still return the same rejection and
	// must not apply T1 again.
	if _, err := st.DB().Exec(`UPDATE accounts SET balance = balance + 5000, version = version + 1 WHERE id = 'a'`); err != nil {
		t.Fatal(err)
	}
	run2 := beginEffects(t, st, "j/k")
	called := false
	_, err = steps.Apply(ctx, run2, "post/T1", target, func(ctx context.Context, e *steps.Effects) (string, error) {
		called = true
		return "", nil
	})
	if err != nil || called {
		t.Fatalf("rerun of applied step: err %v, called %v", err, called)
	}
	_, err = steps.Apply(ctx, run2, "post/T2", target, transfer("a", "b", 701))
	if !errors.As(err, &rej) {
		t.Fatalf("rerun of rejected step: err = %v, want the pinned rejection", err)
	}
	if v, _ := balance(t, st.DB(), "a"); v != 5700 {
		t.Fatalf("a = %d, want 5700", v)
	}
	if v, _ := balance(t, st.DB(), "b"); v != 300 {
		t.Fatalf("b = %d, want 300", v)
	}
}

func TestApplySeparateStore(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	path := filepath.Join(t.TempDir(), "ledger.db")
	db, err := sqlite.OpenTarget(ctx, sqlite.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ledger(t, db, map[string]int64{"a": 1000, "b": 0})
	target := steps.Target{Path: path, Table: accountsTable}

	run := beginEffects(t, st, "j/k")
	if _, err := steps.Apply(ctx, run, "post/T1", target, transfer("a", "b", 250)); err != nil {
		t.Fatal(err)
	}
	if v, ver := balance(t, db, "a"); v != 750 || ver != 1 {
		t.Fatalf("a = %d v%d, want 750 v1", v, ver)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM stepwise_applied`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("applied effects = %d, %v; want 1", n, err)
	}
	run2 := beginEffects(t, st, "j/k")
	if _, err := steps.Apply(ctx, run2, "post/T1", target, transfer("a", "b", 250)); err != nil {
		t.Fatal(err)
	}
	if v, _ := balance(t, db, "a"); v != 750 {
		t.Fatalf("rerun applied again: a = %d", v)
	}
}

func TestBuiltInState(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	run := beginEffects(t, st, "j/k")
	for i, key := range []string{"c1", "c2"} {
		_, err := steps.Apply(ctx, run, steps.ID("count", key), steps.State, func(ctx context.Context, e *steps.Effects) (int, error) {
			e.Add("counter", int64(i+1))
			return i, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var v, ver int64
	if err := st.DB().QueryRow(`SELECT value, version FROM stepwise_state WHERE key = 'counter'`).Scan(&v, &ver); err != nil {
		t.Fatal(err)
	}
	if v != 3 || ver != 2 {
		t.Fatalf("counter = %d v%d, want 3 v2", v, ver)
	}
}

func TestApplyDryRun(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	ledger(t, st.DB(), map[string]int64{"a": 1000, "b": 0})
	run, err := steps.Begin(ctx, steps.Config{Store: st, Lease: checkpoint.Lease{RunID: "j/dry"}, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	defer run.Close()
	target := steps.Target{Table: accountsTable}
	for _, id := range []string{"T1", "T2", "T3"} {
		_, err := steps.Apply(ctx, run, steps.ID("post", id), target, transfer("a", "b", 400))
		var rej *steps.RejectedError
		if id == "T3" && !errors.As(err, &rej) {
			t.Fatalf("T3 should be rejected in the dry run after T1 and T2 (balance 200): %v", err)
		}
		if id != "T3" && err != nil {
			t.Fatal(err)
		}
	}
	plans := run.DryPlans()
	if len(plans) != 3 || plans[1].Writes[0].OldValue != 600 || plans[1].Writes[0].NewValue != 200 || len(plans[2].Rejected) != 1 {
		t.Fatalf("dry plans = %+v", plans)
	}
	if v, ver := balance(t, st.DB(), "a"); v != 1000 || ver != 0 {
		t.Fatalf("dry run wrote: a = %d v%d", v, ver)
	}
	var n int
	if err := st.DB().QueryRow(`SELECT count(*) FROM steps`).Scan(&n); err != nil {
		t.Fatalf("count the checkpoints: %v", err)
	}
	if n != 0 {
		t.Fatalf("dry run checkpointed %d steps", n)
	}
}
