package steps_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/steps"
)

var accountsTable = checkpoint.Table{Name: "accounts", Key: "id", Value: "balance", Version: "version"}

// createAccounts is the accounts table in SQLite's own words, for the
// benchmarks, which run on SQLite files only.
const createAccounts = `CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL, version INTEGER NOT NULL)`

// ledger creates the accounts table in the database at loc (the store's
// own, or a separate target) with the given balances.
func ledger(t *testing.T, loc string, balances map[string]int64) {
	t.Helper()
	checkpointtest.CreateTable(t, loc, accountsTable, balances)
}

// balance reads one account of the accounts table at loc.
func balance(t *testing.T, loc, id string) (value, version int64) {
	t.Helper()
	s := checkpointtest.Balance(t, loc, accountsTable, id)
	return s.Value, s.Version
}

// execSQL runs a statement (placeholders $1, $2, ...) on the database at
// loc: a test's own change to a target table, as another writer would.
func execSQL(t *testing.T, loc, q string, args ...any) sql.Result {
	t.Helper()
	db := checkpointtest.SQL(t, loc)
	res, err := db.Exec(q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return res
}

// stepOf returns the checkpoint of one step of runID, read through the
// contract; ok is false when none is recorded.
func stepOf(t *testing.T, st checkpoint.Backend, runID, id string) (s checkpoint.Step, ok bool) {
	t.Helper()
	err := st.Steps(context.Background(), runID, func(c checkpoint.Step) error {
		if c.ID == id {
			s, ok = c, true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s, ok
}

// stepCount counts runID's step checkpoints, through the contract.
func stepCount(t *testing.T, st checkpoint.Backend, runID string) int {
	t.Helper()
	n := 0
	if err := st.Steps(context.Background(), runID, func(checkpoint.Step) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// beginEffects claims runID afresh (a new attempt) and opens its steps.Run.
func beginEffects(t *testing.T, st checkpoint.Backend, runID string) *steps.Run {
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
	st, loc := checkpointtest.OpenNew(t)
	opening := map[string]int64{"a": 1000, "b": 0}
	ledger(t, loc, opening)
	target := steps.Target{Table: accountsTable}
	t1 := checkpointtest.Transfer{ID: "post/T1", From: "a", To: "b", Amount: 300}
	onlyT1 := checkpointtest.LedgerCheck{Opening: opening, Applied: []checkpointtest.Transfer{t1}}

	run := beginEffects(t, st, "j/k")
	out, err := steps.Apply(ctx, run, "post/T1", target, transfer("a", "b", 300))
	if err != nil || out != "moved" {
		t.Fatalf("Apply = %q, %v", out, err)
	}
	checkpointtest.CheckLedger(t, loc, accountsTable, onlyT1)
	if s := run.Stats(); s.Effects != 2 || s.Executed != 1 {
		t.Fatalf("stats %+v, want 2 effects applied by 1 step", s)
	}
	// Overdraft: rejected and pinned, nothing applied.
	_, err = steps.Apply(ctx, run, "post/T2", target, transfer("a", "b", 701))
	var rej *steps.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("overdraft: err = %v, want *RejectedError", err)
	}
	checkpointtest.CheckLedger(t, loc, accountsTable, onlyT1) // the rejected transfer moved nothing

	// Top the account up; a rerun must still return the same rejection and
	// must not apply T1 again.
	execSQL(t, loc, `UPDATE accounts SET balance = balance + 5000, version = version + 1 WHERE id = 'a'`)
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
	// The ledger as topped up (a opened with 6000, one more version of a)
	// holds T1 once and T2 never.
	checkpointtest.CheckLedger(t, loc, accountsTable, checkpointtest.LedgerCheck{Opening: map[string]int64{"a": 6000, "b": 0},
		Applied: onlyT1.Applied, Versions: map[string]int64{"a": 2, "b": 1}})
}

// The store and its separate target come from checkpointtest.SeparateTarget:
// SQLite files whatever the suite's store, until the PostgreSQL store can
// open a separate target.
func TestApplySeparateStore(t *testing.T) {
	ctx := context.Background()
	st, path := checkpointtest.SeparateTarget(t)
	db := checkpointtest.SQL(t, path)
	opening := map[string]int64{"a": 1000, "b": 0}
	ledger(t, path, opening)
	target := steps.Target{Location: path, Table: accountsTable}
	onlyT1 := checkpointtest.LedgerCheck{Opening: opening, Applied: []checkpointtest.Transfer{{ID: "post/T1", From: "a", To: "b", Amount: 250}}}

	run := beginEffects(t, st, "j/k")
	if _, err := steps.Apply(ctx, run, "post/T1", target, transfer("a", "b", 250)); err != nil {
		t.Fatal(err)
	}
	checkpointtest.CheckLedger(t, path, accountsTable, onlyT1)
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM stepwise_applied`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("applied effects = %d, %v; want 1", n, err)
	}
	run2 := beginEffects(t, st, "j/k")
	if _, err := steps.Apply(ctx, run2, "post/T1", target, transfer("a", "b", 250)); err != nil {
		t.Fatal(err)
	}
	checkpointtest.CheckLedger(t, path, accountsTable, onlyT1) // the rerun applied nothing again
}

func TestBuiltInState(t *testing.T) {
	ctx := context.Background()
	st, loc := checkpointtest.OpenNew(t)
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
	c := checkpointtest.Balance(t, loc, checkpoint.StateTable, "counter")
	if v, ver := c.Value, c.Version; v != 3 || ver != 2 {
		t.Fatalf("counter = %d v%d, want 3 v2", v, ver)
	}
}

func TestApplyDryRun(t *testing.T) {
	ctx := context.Background()
	st, loc := checkpointtest.OpenNew(t)
	opening := map[string]int64{"a": 1000, "b": 0}
	ledger(t, loc, opening)
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
	checkpointtest.CheckLedger(t, loc, accountsTable, checkpointtest.LedgerCheck{Opening: opening}) // the dry run wrote nothing
	if n := stepCount(t, st, "j/dry"); n != 0 {
		t.Fatalf("dry run checkpointed %d steps", n)
	}
}

// resetStep deletes one step's checkpoint (not its items) through the
// contract, as a runner reopening a batch step does: it claims runID (taking
// over whoever held it), resets the step in a write transaction and
// releases the run, interrupted.
func resetStep(t *testing.T, st checkpoint.Backend, runID, id string) {
	t.Helper()
	ctx := context.Background()
	info, err := st.Run(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	r := info.Run
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: runID, Job: r.Job, RunKey: r.RunKey, Params: r.Params, ParamsHash: r.ParamsHash,
		Owner: "reset:1", Now: time.Now(), LeaseFor: time.Minute, OwnerGone: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error { return tx.ResetStep(id) }); err != nil {
		t.Fatal(err)
	}
	if err := st.Finish(ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunInterrupted, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

// targetStore opens a store and says where its effect target's database
// is: the suite's store with the target in its own database, or, separate,
// a SQLite store with the target in a separate SQLite file. Separate
// targets run on SQLite whatever the suite's store: the PostgreSQL store
// cannot open one yet (see checkpointtest.SeparateTarget).
func targetStore(t *testing.T, separate bool) (st checkpoint.Backend, loc string, target steps.Target) {
	t.Helper()
	target = steps.Target{Table: accountsTable}
	if separate {
		st, loc = checkpointtest.SeparateTarget(t)
		target.Location = loc
		return st, loc, target
	}
	st, loc = checkpointtest.OpenNew(t)
	return st, loc, target
}
