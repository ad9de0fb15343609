package steps_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/steps"
)

// rvHookStore runs afterPlan once, right after the first transaction that
// recorded a chunk plan commits.
type rvHookStore struct {
	checkpoint.Backend
	afterPlan func()
}

type rvTx struct {
	checkpoint.Tx
	planned *bool
}

func (tx rvTx) PutChunkPlan(p checkpoint.ChunkPlan) error {
	*tx.planned = true
	return tx.Tx.PutChunkPlan(p)
}

func (s *rvHookStore) InTx(ctx context.Context, l checkpoint.Lease, fn func(checkpoint.Tx) error) error {
	planned := false
	err := s.Backend.InTx(ctx, l, func(tx checkpoint.Tx) error { return fn(rvTx{Tx: tx, planned: &planned}) })
	if err == nil && planned && s.afterPlan != nil {
		f := s.afterPlan
		s.afterPlan = nil
		f()
	}
	return err
}

func rvBegin(t *testing.T, st checkpoint.Backend, store checkpoint.Backend) *steps.Run {
	t.Helper()
	ctx := context.Background()
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: "j/k", Job: "j", RunKey: "k", Params: []byte("{}"), ParamsHash: "h",
		Owner: "test:1", Now: time.Now(), LeaseFor: time.Minute, OwnerGone: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	run, err := steps.Begin(ctx, steps.Config{Store: store, Lease: c.Lease})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Close() })
	return run
}

// rvOpening is the ledger rvLedger opens: A holds the money, B none.
var rvOpening = map[string]int64{"A": 1000, "B": 0}

// rvLedger opens a store with a separate target holding rvOpening's
// accounts, from checkpointtest.SeparateTarget (SQLite files whatever the
// suite's store, until the PostgreSQL store can open a separate target).
func rvLedger(t *testing.T) (checkpoint.Backend, string, *sql.DB) {
	st, path := checkpointtest.SeparateTarget(t)
	ledger(t, path, rvOpening)
	return st, path, checkpointtest.SQL(t, path)
}

// rvOtherWriter moves 1 from A to B behind the run's back, as another
// writer of the target would (both rows, each a new version), and returns
// that move for the ledger check.
func rvOtherWriter(t *testing.T, db *sql.DB) checkpointtest.Transfer {
	t.Helper()
	res, err := db.Exec(`UPDATE accounts SET balance = balance + CASE id WHEN 'A' THEN -1 ELSE 1 END, version = version + 1 WHERE id IN ('A', 'B')`)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 2 {
		t.Fatalf("the other writer's update moved %d rows (%v), want A's and B's", n, err)
	}
	return checkpointtest.Transfer{ID: "other writer", From: "A", To: "B", Amount: 1}
}

// rvMove is an item's effects moving amount from A to B.
func rvMove(e *steps.Effects, amount int64) {
	e.Add("A", -amount, steps.NotBelow(0))
	e.Add("B", amount)
}

func itemStatuses(t *testing.T, run *steps.Run, name string) map[string]string {
	out := map[string]string{}
	if err := run.Items(context.Background(), name, "", func(it steps.ItemResult) error {
		out[it.Key] = it.Status
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// An interruption during a ForEach with SkipFailures is no item failure:
// the interrupted items are not pinned as skipped nor the step completed,
// so a plain rerun runs them and every item's effect applies once.
func TestInterruptedItemsRunOnAPlainRerun(t *testing.T) {
	st, loc := checkpointtest.OpenNew(t)
	run := beginEffects(t, st, "j/k")
	ctx, cancel := context.WithCancel(context.Background())
	items := []string{"a", "b", "c", "d"}
	post := func(ctx context.Context, it string, e *steps.Effects) (int, error) {
		if it == "b" {
			cancel() // SIGINT arrives while b talks to something
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		e.Add("n", 1)
		return 1, nil
	}
	sum, err := steps.ForEach(ctx, run, "post", steps.Slice(items, func(s string) string { return s }), post,
		steps.ChunkSize(10), steps.SkipFailures(5), steps.WithTarget(steps.State))
	t.Logf("attempt 1: sum %+v err %v statuses %v", sum, err, itemStatuses(t, run, "post"))

	run2 := beginEffects(t, st, "j/k")
	sum, err = steps.ForEach(context.Background(), run2, "post", steps.Slice(items, func(s string) string { return s }), post,
		steps.ChunkSize(10), steps.SkipFailures(5), steps.WithTarget(steps.State))
	n := checkpointtest.Balances(t, loc, checkpoint.StateTable)["n"].Value
	t.Logf("plain rerun: sum %+v err %v n=%d", sum, err, n)
	if n != 4 {
		t.Errorf("after an interrupted attempt and a plain rerun, n = %d; want 4 (every item applied once)", n)
	}
}

// A separate-store chunk holding a rejected item re-plans after a version
// conflict without rewriting the rejected item, which is final already.
func TestChunkReplansPastARejectedItem(t *testing.T) {
	st, path, db := rvLedger(t)
	hook := &rvHookStore{Backend: st}
	var other checkpointtest.Transfer
	hook.afterPlan = func() { other = rvOtherWriter(t, db) } // after the plan is recorded
	run := rvBegin(t, st, hook)
	items := []string{"a", "b"}
	sum, err := steps.ForEach(context.Background(), run, "post", steps.Slice(items, func(s string) string { return s }),
		func(ctx context.Context, it string, e *steps.Effects) (int, error) {
			if it == "a" {
				return 0, steps.Reject(errors.New("account closed"))
			}
			rvMove(e, 10)
			return 1, nil
		}, steps.WithTarget(steps.Target{Location: path, Table: accountsTable}))
	t.Logf("sum %+v err %v", sum, err)
	if err != nil {
		t.Errorf("one conflict with a rejected item in the chunk failed the step: %v", err)
	}
	// b applied once after the re-plan, a never; one write per key each.
	checkpointtest.CheckLedger(t, path, accountsTable, checkpointtest.LedgerCheck{Opening: rvOpening,
		Applied: []checkpointtest.Transfer{other, {ID: "b", From: "A", To: "B", Amount: 10}}})
}

// A stale chunk plan re-planned on resume completes the chunk's items that
// had no effects too, instead of leaving them planned.
func TestResumedChunkCompletesItemsWithoutEffects(t *testing.T) {
	st, path, db := rvLedger(t)
	target := steps.Target{Location: path, Table: accountsTable}
	items := []string{"a", "b"}
	fn := func(ctx context.Context, it string, e *steps.Effects) (int, error) {
		if it == "b" {
			rvMove(e, 10)
		}
		return 1, nil
	}
	hook := &rvHookStore{Backend: st, afterPlan: func() { panic("crash after plan") }}
	run := rvBegin(t, st, hook)
	func() {
		defer func() { recover() }()
		steps.ForEach(context.Background(), run, "post", steps.Slice(items, func(s string) string { return s }), fn, steps.WithTarget(target))
	}()
	other := rvOtherWriter(t, db) // between the plan and its apply

	run2 := rvBegin(t, st, st)
	sum, err := steps.ForEach(context.Background(), run2, "post", steps.Slice(items, func(s string) string { return s }), fn, steps.WithTarget(target))
	got := itemStatuses(t, run2, "post")
	t.Logf("rerun: sum %+v err %v; items %v", sum, err, got)
	if got["a"] != checkpoint.StepCompleted {
		t.Errorf("item a (no effects) is %q after its step completed; want completed", got["a"])
	}
	checkpointtest.CheckLedger(t, path, accountsTable, checkpointtest.LedgerCheck{Opening: rvOpening,
		Applied: []checkpointtest.Transfer{other, {ID: "b", From: "A", To: "B", Amount: 10}}})
}

// A dry run leaves the user's target database as it was, its journal mode
// and schema included. The target is a SQLite file (the test reads its
// journal mode and schema), on a SQLite store.
func TestDryRunLeavesTheTargetUnchanged(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	path := filepath.Join(t.TempDir(), "ledger.db")
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Exec(createAccounts); err != nil {
		t.Fatal(err)
	}
	for id, b := range map[string]int64{"A": 1000, "B": 0} {
		if _, err := raw.Exec(`INSERT INTO accounts VALUES (?, ?, 0)`, id, b); err != nil {
			t.Fatal(err)
		}
	}
	before := rvSchema(t, raw)
	if !strings.Contains(before, "table accounts") {
		t.Fatalf("the target's schema before the dry run = %q; want the accounts table in it", before)
	}
	run, err := steps.Begin(context.Background(), steps.Config{Store: st, Lease: checkpoint.Lease{RunID: "j/dry"}, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := steps.Apply(context.Background(), run, "post/T1", steps.Target{Location: path, Table: accountsTable}, transfer("A", "B", 1)); err != nil {
		t.Fatal(err)
	}
	run.Close()
	if after := rvSchema(t, raw); after != before {
		t.Errorf("dry run changed the target: %s -> %s", before, after)
	}
}

// rvSchema describes db's journal mode and every table and index in it.
func rvSchema(t *testing.T, db *sql.DB) string {
	t.Helper()
	var mode string
	if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil {
		t.Fatalf("read the journal mode: %v", err)
	}
	rows, err := db.Query(`SELECT type, name FROM sqlite_master ORDER BY type, name`)
	if err != nil {
		t.Fatalf("list the schema: %v", err)
	}
	defer rows.Close()
	desc := []string{"journal_mode " + mode}
	for rows.Next() {
		var typ, name string
		if err := rows.Scan(&typ, &name); err != nil {
			t.Fatalf("list the schema: %v", err)
		}
		desc = append(desc, typ+" "+name)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("list the schema: %v", err)
	}
	return strings.Join(desc, ", ")
}

type rvFenceHook struct {
	checkpoint.Backend
	after func()
}

func (s *rvFenceHook) Fence(ctx context.Context, runID string) (int64, error) {
	f, err := s.Backend.Fence(ctx, runID)
	if s.after != nil {
		a := s.after
		s.after = nil
		a()
	}
	return f, err
}

// A takeover that lands between the stale runner's fence check and its
// target transaction still applies the effect exactly once (what
// TestFxFenceCheckRaceStaysExactlyOnce meant to do).
func TestTakeoverInTheFenceWindowIsExactlyOnce(t *testing.T) {
	st, path, _ := rvLedger(t)
	target := steps.Target{Location: path, Table: accountsTable}
	hook := &rvFenceHook{Backend: st}
	stale := rvBegin(t, st, hook)
	var fresh *steps.Run
	hook.after = func() { fresh = rvBegin(t, st, st) }
	_, err := steps.Apply(context.Background(), stale, "post/T1", target, transfer("A", "B", 300))
	t.Logf("stale: %v", err)
	_, err = steps.Apply(context.Background(), fresh, "post/T1", target, transfer("A", "B", 300))
	t.Logf("fresh: %v", err)
	checkpointtest.CheckLedger(t, path, accountsTable, checkpointtest.LedgerCheck{Opening: rvOpening,
		Applied: []checkpointtest.Transfer{{ID: "post/T1", From: "A", To: "B", Amount: 300}}})
}
