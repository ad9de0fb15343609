package steps_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/steps"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// These tests hold the effect protocol to its promise at every boundary of
// the failure model: a real runner process is killed with SIGKILL at a named
// point, rerun to success, and the ledger is checked: money conserved, every
// transfer applied exactly once, every balance the sum of its applied
// deltas, every version the count of its applied effects.

// Environment of the child runner (TestFxChild).
const (
	fxChildEnv     = "STEPWISE_FX_CHILD"     // "1" makes TestFxChild run
	fxDBEnv        = "STEPWISE_FX_DB"        // checkpoint database's location (file path or postgres:// URL)
	fxLedgerEnv    = "STEPWISE_FX_LEDGER"    // separate ledger database; empty for the same store
	fxTransfersEnv = "STEPWISE_FX_TRANSFERS" // JSON []fxTransfer, posted in order
	fxCallsEnv     = "STEPWISE_FX_CALLS"     // file the child appends each called step ID to
)

const fxRunID = "settle/fx"

// fxTransfer moves Amount from From to To, guarded against overdraft, as
// the step post/ID.
type fxTransfer struct {
	ID       string
	From, To string
	Amount   int64
}

func (tr fxTransfer) stepID() string { return steps.ID("post", tr.ID) }

func (tr fxTransfer) post(ctx context.Context, e *steps.Effects) (string, error) {
	e.Add(tr.From, -tr.Amount, steps.NotBelow(0))
	e.Add(tr.To, tr.Amount)
	return "posted " + tr.ID, nil
}

var fxOpening = map[string]int64{"A": 1000, "B": 500, "C": 200, "D": 0}

// fxTransfers are posted in order; T-4 and T-7 overdraw and are rejected.
var fxTransfers = []fxTransfer{
	{"T-1", "A", "B", 300},
	{"T-2", "B", "C", 450},
	{"T-3", "C", "D", 600},
	{"T-4", "D", "A", 1000},
	{"T-5", "A", "D", 250},
	{"T-6", "D", "B", 800},
	{"T-7", "C", "A", 100},
	{"T-8", "B", "C", 1000},
	{"T-9", "C", "D", 999},
	{"T-10", "A", "C", 450},
}

// fxSimulate posts ts in order over opening, with the overdraft guard, and
// returns the final balances and the IDs of the rejected transfers.
func fxSimulate(opening map[string]int64, ts []fxTransfer) (map[string]int64, map[string]bool) {
	bal := make(map[string]int64, len(opening))
	for k, v := range opening {
		bal[k] = v
	}
	rejected := map[string]bool{}
	for _, tr := range ts {
		if bal[tr.From] < tr.Amount {
			rejected[tr.stepID()] = true
			continue
		}
		bal[tr.From] -= tr.Amount
		bal[tr.To] += tr.Amount
	}
	return bal, rejected
}

func fxClaimRequest(owner string) checkpoint.ClaimRequest {
	return checkpoint.ClaimRequest{
		RunID: fxRunID, Job: "settle", RunKey: "fx", Params: []byte(`{}`), ParamsHash: "fx",
		Owner: owner, Now: time.Now(), LeaseFor: time.Hour,
		// Every earlier runner in these tests is dead or must be fenced:
		// take the run over at once, as for a dead owner on this host.
		OwnerGone: func(string) bool { return true },
	}
}

func fxTarget(ledgerPath string) steps.Target {
	return steps.Target{Location: ledgerPath, Table: accountsTable}
}

// TestFxChild is the runner the crash tests start as a real process: it
// claims the run (taking it over from a killed runner), posts every transfer
// with steps.Apply and marks the run succeeded. STEPWISE_CRASH_AT stops it
// with SIGKILL at a boundary; "fx:in-fn:STEP" does so inside the step's own
// function, before anything of the step is committed.
func TestFxChild(t *testing.T) {
	if os.Getenv(fxChildEnv) != "1" {
		t.Skip("helper process for the effect crash tests")
	}
	ctx := context.Background()
	var ts []fxTransfer
	if err := json.Unmarshal([]byte(os.Getenv(fxTransfersEnv)), &ts); err != nil {
		t.Fatalf("decode %s: %v", fxTransfersEnv, err)
	}
	st, err := checkpointtest.OpenLocationErr(os.Getenv(fxDBEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c, err := st.Claim(ctx, fxClaimRequest(fmt.Sprintf("fx:%d", os.Getpid())))
	if err != nil {
		t.Fatal(err)
	}
	run, err := steps.Begin(ctx, steps.Config{Store: st, Lease: c.Lease})
	if err != nil {
		t.Fatal(err)
	}
	defer run.Close()
	target := fxTarget(os.Getenv(fxLedgerEnv))
	calls, err := os.OpenFile(os.Getenv(fxCallsEnv), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer calls.Close()
	for _, tr := range ts {
		id := tr.stepID()
		_, err := steps.Apply(ctx, run, id, target, func(ctx context.Context, e *steps.Effects) (string, error) {
			if _, err := fmt.Fprintln(calls, id); err != nil {
				return "", err
			}
			steps.Crash("fx:in-fn:" + id)
			return tr.post(ctx, e)
		})
		var rej *steps.RejectedError
		if err != nil && !errors.As(err, &rej) {
			t.Fatalf("step %s: %v", id, err)
		}
	}
	if err := st.Finish(ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

// fxLedger is one scenario's databases, seen from the test process.
type fxLedger struct {
	dir        string
	dbLoc      string // the store's location: a file path or a postgres:// URL
	ledgerPath string // "" for the same store
	targetLoc  string // where the accounts table lives: dbLoc or ledgerPath
	store      checkpoint.Backend
	target     *sql.DB // SQL on targetLoc, for the tests' own writes
	opening    map[string]int64
	transfers  []fxTransfer
	children   int
}

// fxNewLedger makes a scenario's databases: the store on the suite's store
// with the accounts in its database, or, separate, a SQLite store with the
// accounts in a separate SQLite file (the PostgreSQL store cannot open a
// separate target yet; see checkpointtest.SeparateLocations).
func fxNewLedger(t *testing.T, separate bool, opening map[string]int64, ts []fxTransfer) *fxLedger {
	t.Helper()
	dir := t.TempDir()
	l := &fxLedger{dir: dir, opening: opening, transfers: ts}
	if separate {
		l.dbLoc, l.ledgerPath = checkpointtest.SeparateLocations(t)
		l.targetLoc = l.ledgerPath
	} else {
		l.dbLoc = checkpointtest.NewLocation(t)
		l.targetLoc = l.dbLoc
	}
	l.store = checkpointtest.OpenLocation(t, l.dbLoc)
	l.target = checkpointtest.SQL(t, l.targetLoc)
	ledger(t, l.targetLoc, opening)
	return l
}

// runChild runs TestFxChild over l. With crashAt set, the child must die of
// SIGKILL; without, it must succeed. It returns the step IDs whose function
// the child called, in order.
func (l *fxLedger) runChild(t *testing.T, crashAt string) []string {
	t.Helper()
	l.children++
	callsPath := filepath.Join(l.dir, fmt.Sprintf("calls-%d", l.children))
	ts, err := json.Marshal(l.transfers)
	if err != nil {
		t.Fatal(err)
	}
	env := []string{fxChildEnv + "=1", fxDBEnv + "=" + l.dbLoc, fxLedgerEnv + "=" + l.ledgerPath,
		fxTransfersEnv + "=" + string(ts), fxCallsEnv + "=" + callsPath}
	if crashAt == "" {
		crashtest.Start(t, crashtest.Spec{Test: "TestFxChild", Env: env}).WantCode(0)
	} else {
		crashtest.Start(t, crashtest.Spec{Test: "TestFxChild", Env: append(env, crashtest.CrashAt(crashAt))}).WantKilled()
	}
	b, err := os.ReadFile(callsPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

// fxSeen is the durable state of a scenario, read by the test process.
type fxSeen struct {
	steps    map[string]checkpoint.Step
	plans    map[string]steps.PlanRecord
	balances map[string]checkpoint.State // every row of the accounts table
	applied  map[string]string           // effect ID -> step ID, from the target's stepwise_applied
}

func (l *fxLedger) read(t *testing.T) fxSeen {
	t.Helper()
	ctx := context.Background()
	s := fxSeen{steps: map[string]checkpoint.Step{}, plans: map[string]steps.PlanRecord{},
		applied: map[string]string{}}
	err := l.store.Steps(ctx, fxRunID, func(st checkpoint.Step) error {
		s.steps[st.ID] = st
		if len(st.Plan) > 0 {
			var pr steps.PlanRecord
			if err := json.Unmarshal(st.Plan, &pr); err != nil {
				return fmt.Errorf("step %s: decode plan: %w", st.ID, err)
			}
			s.plans[st.ID] = pr
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s.balances = checkpointtest.Balances(t, l.targetLoc, accountsTable)
	// Applied-effect records are kept in a separate target only (a
	// same-store effect commits with its checkpoint, which is the proof).
	if l.ledgerPath != "" && fxHasTable(t, l.targetLoc, l.target, "stepwise_applied") {
		rows, err := l.target.Query(`SELECT effect_id, step_id FROM stepwise_applied`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var eid, sid string
			if err := rows.Scan(&eid, &sid); err != nil {
				t.Fatal(err)
			}
			s.applied[eid] = sid
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// fxHasTable reports whether the database at loc (a separate target: a
// SQLite file, or a PostgreSQL schema URL), which db reaches, has the table
// name.
func fxHasTable(t *testing.T, loc string, db *sql.DB, name string) bool {
	t.Helper()
	q := `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = $1`
	if checkpointtest.IsURL(loc) {
		q = `SELECT (to_regclass($1) IS NOT NULL)::int`
	}
	var n int
	if err := db.QueryRow(q, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// appliedSteps is the set of transfer steps whose effects are in the ledger
// by the protocol's own evidence: completed steps, and (separate store)
// planned steps whose effect ID the target holds.
func (l *fxLedger) appliedSteps(t *testing.T, s fxSeen) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for id, st := range s.steps {
		pr := s.plans[id]
		switch st.Status {
		case checkpoint.StepCompleted:
			if l.ledgerPath != "" && s.applied[pr.EffectID] != id {
				t.Errorf("step %s is completed but its effect %q is not in the target's stepwise_applied", id, pr.EffectID)
			}
			out[id] = true
		case checkpoint.StepPlanned:
			if _, ok := s.applied[pr.EffectID]; ok && pr.EffectID != "" {
				out[id] = true
			}
		}
	}
	return out
}

// checkInvariants checks the ledger against the applied steps: money
// conserved, each balance its opening plus the deltas of exactly the applied
// transfers, each version the number of applied transfers touching it, and
// (separate store) one applied-effect row per applied step.
func (l *fxLedger) checkInvariants(t *testing.T, s fxSeen, applied map[string]bool) {
	t.Helper()
	var moved []checkpointtest.Transfer
	for _, tr := range l.transfers {
		if applied[tr.stepID()] {
			moved = append(moved, checkpointtest.Transfer(tr))
		}
	}
	for _, p := range (checkpointtest.LedgerCheck{Opening: l.opening, Applied: moved}).Problems(s.balances) {
		t.Errorf("%s (applied steps %v)", p, fxKeys(applied))
	}
	if l.ledgerPath == "" {
		if len(s.applied) != 0 {
			t.Errorf("same-store effects left rows in stepwise_applied: %v", s.applied)
		}
		return
	}
	bySteps := map[string]int{}
	for _, sid := range s.applied {
		bySteps[sid]++
	}
	for sid, n := range bySteps {
		if n != 1 || !applied[sid] {
			t.Errorf("stepwise_applied holds %d effects of step %s (applied: %v)", n, sid, applied[sid])
		}
	}
	if len(s.applied) != len(applied) {
		t.Errorf("stepwise_applied holds %d effects; %d steps applied", len(s.applied), len(applied))
	}
}

func fxKeys(m map[string]bool) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// expectedCalls lists the steps whose function a child should call, given
// the recorded state before it starts: every step without a finished or
// planned checkpoint, in order, up to stopAt (all of them when stopAt is "").
func (l *fxLedger) expectedCalls(s fxSeen, stopAt string) []string {
	var ids []string
	for _, tr := range l.transfers {
		id := tr.stepID()
		switch s.steps[id].Status {
		case checkpoint.StepCompleted, checkpoint.StepRejected, checkpoint.StepPlanned:
		default:
			ids = append(ids, id)
		}
		if id == stopAt {
			break
		}
	}
	return ids
}

// fxCrash is one kill of the runner: the point, and what the killed step's
// checkpoint and the ledger must show afterwards.
type fxCrash struct {
	where   string // fx:in-fn, or the boundary's name in STEPWISE_CRASH_AT
	step    string // transfer ID
	status  string // the killed step's checkpoint status; "" for none
	applied bool   // whether the killed step's effects are in the ledger
}

func (c fxCrash) point() string {
	id := steps.ID("post", c.step)
	if c.where == "fx:in-fn" {
		return "fx:in-fn:" + id
	}
	return "step:" + id + ":" + c.where
}

// The killed step's state at each boundary (DESIGN.md, Failure model).
var (
	fxInFn         = fxCrash{where: "fx:in-fn"}                                                      // inside the step: no checkpoint
	fxBeforeCommit = fxCrash{where: "before-commit"}                                                 // same store: nothing of the step
	fxAfterCommit  = fxCrash{where: "after-commit", status: checkpoint.StepCompleted, applied: true} // same store: all of it
	fxAfterPlan    = fxCrash{where: "after-plan", status: checkpoint.StepPlanned}                    // plan recorded, not applied
	fxAfterApply   = fxCrash{where: "after-apply", status: checkpoint.StepPlanned, applied: true}    // effect ID in target, not recorded
)

func (c fxCrash) at(step string) fxCrash { c.step = step; return c }

// TestFxCrashAtEveryEffectBoundary posts ten transfers (two of them
// overdrafts, pinned as rejections) as one step each, kills the runner with
// SIGKILL at one boundary (or several in a row), checks what the kill left,
// reruns to success and checks the ledger's invariants and that the result
// is the uninterrupted run's.
func TestFxCrashAtEveryEffectBoundary(t *testing.T) {
	finalBalances, rejected := fxSimulate(fxOpening, fxTransfers)
	if len(rejected) == 0 {
		t.Fatal("the transfers should include rejected ones")
	}
	tests := []struct {
		name     string
		separate bool
		crashes  []fxCrash // one killed runner each, then a clean rerun
	}{
		{"same/in-fn/first", false, []fxCrash{fxInFn.at("T-1")}},
		{"same/before-commit", false, []fxCrash{fxBeforeCommit.at("T-5")}},
		{"same/after-commit/last", false, []fxCrash{fxAfterCommit.at("T-10")}},
		{"same/in-fn,before-commit,after-commit", false, []fxCrash{fxInFn.at("T-6"), fxBeforeCommit.at("T-6"), fxAfterCommit.at("T-6")}},
		{"separate/in-fn", true, []fxCrash{fxInFn.at("T-5")}},
		{"separate/after-plan", true, []fxCrash{fxAfterPlan.at("T-5")}},
		{"separate/after-apply", true, []fxCrash{fxAfterApply.at("T-5")}},
		{"separate/after-plan/last", true, []fxCrash{fxAfterPlan.at("T-10")}},
		{"separate/after-plan,after-apply", true, []fxCrash{fxAfterPlan.at("T-1"), fxAfterApply.at("T-1")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := fxNewLedger(t, tt.separate, fxOpening, fxTransfers)
			recorded := map[string]string{} // planned step -> its recorded plan's effect ID
			for i, c := range tt.crashes {
				before := l.read(t)
				called := l.runChild(t, c.point())
				if want := l.expectedCalls(before, steps.ID("post", c.step)); !slices.Equal(called, want) {
					t.Errorf("killed runner %d called step functions %v; want %v", i+1, called, want)
				}
				s := l.read(t)
				killed := steps.ID("post", c.step)
				if got := s.steps[killed].Status; got != c.status {
					t.Fatalf("after a kill at %s: step %s status %q; want %q", c.point(), killed, got, c.status)
				}
				passed := true
				for _, tr := range l.transfers {
					id := tr.stepID()
					st := s.steps[id].Status
					if passed && id != killed && st != checkpoint.StepCompleted && st != checkpoint.StepRejected {
						t.Errorf("step %s before the killed one is %q; want finished", id, st)
					}
					if !passed && st != "" {
						t.Errorf("step %s after the killed one has a checkpoint (%q)", id, st)
					}
					if id == killed {
						passed = false
					}
				}
				if c.status == checkpoint.StepPlanned {
					recorded[killed] = s.plans[killed].EffectID
				}
				applied := l.appliedSteps(t, s)
				if applied[killed] != c.applied {
					t.Errorf("after a kill at %s: step %s applied = %v; want %v", c.point(), killed, applied[killed], c.applied)
				}
				l.checkInvariants(t, s, applied)
			}

			before := l.read(t)
			called := l.runChild(t, "")
			if want := l.expectedCalls(before, ""); !slices.Equal(called, want) {
				t.Errorf("rerun called step functions %v; want %v (never a completed, rejected or planned step)", called, want)
			}
			s := l.read(t)
			completed := map[string]bool{}
			for _, tr := range l.transfers {
				id := tr.stepID()
				st := s.steps[id].Status
				switch {
				case rejected[id] && st != checkpoint.StepRejected,
					!rejected[id] && st != checkpoint.StepCompleted:
					t.Errorf("after the rerun step %s is %q; want rejected = %v", id, st, rejected[id])
				}
				if st == checkpoint.StepCompleted {
					completed[id] = true
				}
			}
			for id, eid := range recorded {
				// Nobody else moved a key: the rerun finishes the recorded
				// plan instead of making a new one.
				if got := s.plans[id].EffectID; got != eid {
					t.Errorf("step %s completed with plan %s; want the recorded plan %s", id, got, eid)
				}
			}
			applied := l.appliedSteps(t, s)
			if !maps.Equal(applied, completed) {
				t.Errorf("applied steps %v; want exactly the completed ones %v", fxKeys(applied), fxKeys(completed))
			}
			l.checkInvariants(t, s, applied)
			for acct, want := range finalBalances {
				if got := s.balances[acct].Value; got != want {
					t.Errorf("account %s = %d; an uninterrupted run gives %d", acct, got, want)
				}
			}
			info, err := l.store.Run(context.Background(), fxRunID)
			if err != nil {
				t.Fatal(err)
			}
			if info.Run.Status != checkpoint.RunSucceeded || len(info.Attempts) != len(tt.crashes)+1 {
				t.Errorf("run %s, %d attempts; want succeeded after %d", info.Run.Status, len(info.Attempts), len(tt.crashes)+1)
			}
		})
	}
}

// TestFxABAReplansOnVersion kills a separate-store runner after its plan is
// recorded; another writer then takes 500 from the planned key and puts it
// back. The value is where the plan expects it, so a value comparison would
// apply the stale plan; the version moved twice, so the rerun must re-plan
// and apply exactly once.
func TestFxABAReplansOnVersion(t *testing.T) {
	t.Parallel()
	tr := fxTransfer{"T-1", "A", "B", 300}
	l := fxNewLedger(t, true, map[string]int64{"A": 1000, "B": 0}, []fxTransfer{tr})
	l.runChild(t, fxAfterPlan.at(tr.ID).point())

	s := l.read(t)
	stale := s.plans[tr.stepID()]
	if s.steps[tr.stepID()].Status != checkpoint.StepPlanned || len(stale.Writes) != 2 || stale.EffectID == "" {
		t.Fatalf("after the kill: step %+v, plan %+v; want a recorded plan of two writes", s.steps[tr.stepID()], stale)
	}
	if len(s.applied) != 0 {
		t.Fatalf("plan applied before the kill: %v", s.applied)
	}
	for _, q := range []string{
		`UPDATE accounts SET balance = balance - 500, version = version + 1 WHERE id = 'A'`,
		`UPDATE accounts SET balance = balance + 500, version = version + 1 WHERE id = 'A'`,
	} {
		if _, err := l.target.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if v, ver := balance(t, l.targetLoc, "A"); v != stale.Writes[0].OldValue || ver == stale.Writes[0].OldVersion {
		t.Fatalf("setup: A = %d v%d; want the plan's old value %d under a new version (plan %+v)", v, ver, stale.Writes[0].OldValue, stale.Writes[0])
	}

	if called := l.runChild(t, ""); len(called) != 0 {
		t.Errorf("rerun called the planned step's function: %v; it must re-plan from the recorded operations", called)
	}
	s = l.read(t)
	// The other writer's two moves net to nothing: money conserved, T-1
	// applied once; A at version 3 (two other writes, then ours once).
	checkpointtest.CheckLedger(t, l.targetLoc, accountsTable, checkpointtest.LedgerCheck{Opening: l.opening,
		Applied: []checkpointtest.Transfer{checkpointtest.Transfer(tr)}, Versions: map[string]int64{"A": 3, "B": 1}})
	final := s.plans[tr.stepID()]
	if s.steps[tr.stepID()].Status != checkpoint.StepCompleted || final.Writes[0].OldVersion != 2 {
		t.Errorf("step %s, plan %+v; want completed with a plan expecting A at version 2", s.steps[tr.stepID()].Status, final)
	}
	if len(s.applied) != 1 || s.applied[final.EffectID] != tr.stepID() || final.EffectID == stale.EffectID {
		t.Errorf("applied effects %v; want only the new plan's %q (the stale plan's is %q)", s.applied, final.EffectID, stale.EffectID)
	}
}

// fxHookStore is the real store with one fault: after a transaction that
// recorded a planned step commits, afterPlan runs, so a test can act at the
// separate store's "after plan, before apply" boundary in process.
type fxHookStore struct {
	checkpoint.Backend
	afterPlan func(stepID string)
	afterRun  func() // runs once, after the next Fence (the fence check) returns
}

func (s *fxHookStore) Fence(ctx context.Context, runID string) (int64, error) {
	fence, err := s.Backend.Fence(ctx, runID)
	if f := s.afterRun; f != nil {
		s.afterRun = nil
		f()
	}
	return fence, err
}

func (s *fxHookStore) InTx(ctx context.Context, l checkpoint.Lease, fn func(checkpoint.Tx) error) error {
	var planned []string
	err := s.Backend.InTx(ctx, l, func(tx checkpoint.Tx) error {
		return fn(fxPlanTx{Tx: tx, planned: &planned})
	})
	if err == nil && s.afterPlan != nil {
		for _, id := range planned {
			s.afterPlan(id)
		}
	}
	return err
}

type fxPlanTx struct {
	checkpoint.Tx
	planned *[]string
}

func (tx fxPlanTx) PutStep(st checkpoint.Step) error {
	err := tx.Tx.PutStep(st)
	if err == nil && st.Status == checkpoint.StepPlanned {
		*tx.planned = append(*tx.planned, st.ID)
	}
	return err
}

// fxClaim claims the run as owner (taking it over from anyone) and begins
// its steps on store, which may wrap st.
func fxClaim(t *testing.T, st checkpoint.Backend, store checkpoint.Backend, owner string) (checkpoint.Lease, *steps.Run) {
	t.Helper()
	ctx := context.Background()
	c, err := st.Claim(ctx, fxClaimRequest(owner))
	if err != nil {
		t.Fatal(err)
	}
	run, err := steps.Begin(ctx, steps.Config{Store: store, Lease: c.Lease})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Close() })
	return c.Lease, run
}

// fxDump renders what effects and checkpoints may change: the accounts, the
// step checkpoints (read through the contract) and, on a separate target,
// the applied effects.
func (l *fxLedger) dump(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("accounts:\n")
	bals := checkpointtest.Balances(t, l.targetLoc, accountsTable)
	for _, k := range slices.Sorted(maps.Keys(bals)) {
		fmt.Fprintf(&b, "  %s %d v%d\n", k, bals[k].Value, bals[k].Version)
	}
	b.WriteString("steps:\n")
	err := l.store.Steps(context.Background(), fxRunID, func(st checkpoint.Step) error {
		fmt.Fprintf(&b, "  %s %s attempt %d output %s plan %s error %q\n", st.ID, st.Status, st.Attempt, st.Output, st.Plan, st.Error)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if l.ledgerPath == "" {
		return b.String()
	}
	b.WriteString("stepwise_applied:\n")
	if !fxHasTable(t, l.targetLoc, l.target, "stepwise_applied") {
		return b.String()
	}
	rows, err := l.target.Query(`SELECT * FROM stepwise_applied ORDER BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	cols, _ := rows.Columns()
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		for i, v := range vals {
			if bs, ok := v.([]byte); ok {
				vals[i] = string(bs)
			}
		}
		fmt.Fprintf(&b, "  %v\n", vals)
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestFxFencedRunnerWritesNothing: a runner whose run was claimed by another
// (lease taken over, fence moved) applies no effect and records nothing,
// whether the takeover came before the step, during its function, or (on a
// separate store) between its plan and its apply. The new owner then
// finishes the step exactly once.
func TestFxFencedRunnerWritesNothing(t *testing.T) {
	tr := fxTransfer{"T-1", "A", "B", 300}
	next := fxTransfer{"T-2", "B", "A", 100}
	for _, separate := range []bool{false, true} {
		for _, when := range []string{"before-step", "in-fn", "after-plan"} {
			if when == "after-plan" && !separate {
				continue
			}
			name := "same/" + when
			if separate {
				name = "separate/" + when
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				l := fxNewLedger(t, separate, map[string]int64{"A": 1000, "B": 0}, []fxTransfer{tr, next})
				target := fxTarget(l.ledgerPath)
				hook := &fxHookStore{Backend: l.store}
				_, stale := fxClaim(t, l.store, hook, "fx:stale")

				var snapshot string
				takeover := func() {
					fxClaim(t, l.store, l.store, "fx:new")
					snapshot = l.dump(t)
				}
				fn := tr.post
				switch when {
				case "before-step":
					takeover()
				case "in-fn":
					snapshot = l.dump(t)
					fn = func(ctx context.Context, e *steps.Effects) (string, error) {
						takeover()
						return tr.post(ctx, e)
					}
				case "after-plan":
					hook.afterPlan = func(string) { takeover() }
				}
				_, err := steps.Apply(ctx, stale, tr.stepID(), target, fn)
				if !errors.Is(err, checkpoint.ErrFenced) {
					t.Fatalf("Apply after the takeover: err = %v; want checkpoint.ErrFenced", err)
				}
				if got := l.dump(t); got != snapshot {
					t.Fatalf("the fenced runner wrote after the takeover:\nbefore\n%s\nafter\n%s", snapshot, got)
				}
				_, err = steps.Apply(ctx, stale, next.stepID(), target, next.post)
				if !errors.Is(err, checkpoint.ErrFenced) {
					t.Fatalf("next Apply of the fenced runner: err = %v; want checkpoint.ErrFenced", err)
				}
				if got := l.dump(t); got != snapshot {
					t.Fatalf("the fenced runner's next step wrote:\nbefore\n%s\nafter\n%s", snapshot, got)
				}

				// The new owner (the latest claim) finishes both steps once.
				_, fresh := fxClaim(t, l.store, l.store, "fx:new")
				for _, tr := range []fxTransfer{tr, next} {
					if _, err := steps.Apply(ctx, fresh, tr.stepID(), target, tr.post); err != nil {
						t.Fatalf("new owner, step %s: %v", tr.stepID(), err)
					}
				}
				s := l.read(t)
				l.checkInvariants(t, s, l.appliedSteps(t, s))
				if v, _ := balance(t, l.targetLoc, "A"); v != 800 || len(l.appliedSteps(t, s)) != 2 {
					t.Errorf("A = %d, applied %v; want 800 after both steps once", v, fxKeys(l.appliedSteps(t, s)))
				}
			})
		}
	}
}

// fxBumpB is another writer outside Stepwise moving account B.
const fxBumpB = `UPDATE accounts SET balance = balance + 1, version = version + 1 WHERE id = 'B'`

// TestFxConcurrentWriterIsNeverOverwritten runs separate-store steps while a
// writer outside Stepwise keeps moving one of their keys. Each step either
// applies exactly once or fails with a *VersionConflictError after
// steps.MaxReplans plans; every one of the writer's updates survives.
func TestFxConcurrentWriterIsNeverOverwritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var ts []fxTransfer
	for i := 1; i <= 5; i++ {
		ts = append(ts, fxTransfer{fmt.Sprintf("T-%d", i), "A", "B", 100})
	}
	l := fxNewLedger(t, true, map[string]int64{"A": 1_000_000, "B": 0}, ts)
	var plans atomic.Int64
	hook := &fxHookStore{Backend: l.store, afterPlan: func(string) { plans.Add(1) }}
	_, run := fxClaim(t, l.store, hook, "fx:runner")
	writer := checkpointtest.SQL(t, l.ledgerPath) // the target's own database, SQLite or PostgreSQL

	// The writer has a budget: unbounded, it starves the runner's lock
	// requests (SQLite's busy handler backs off to 100 ms sleeps) and the
	// test would take seconds per step. The runner starts after its first
	// update, so the two certainly overlap.
	const budget = 150
	var moved atomic.Int64
	stop, started := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(started)
		for range budget {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := writer.Exec(fxBumpB); err != nil {
				t.Errorf("other writer: %v", err)
				return
			}
			if moved.Add(1) == 1 {
				started <- struct{}{}
			}
		}
	})
	<-started
	var ok, conflicted []string
	for _, tr := range ts {
		_, err := steps.Apply(ctx, run, tr.stepID(), fxTarget(l.ledgerPath), tr.post)
		var conflict *checkpoint.VersionConflictError
		switch {
		case err == nil:
			ok = append(ok, tr.stepID())
		case errors.As(err, &conflict):
			if conflict.Key != "B" || conflict.Table != "accounts" || conflict.Found <= conflict.Expected {
				t.Errorf("step %s: conflict %+v; want key B of accounts found past its expected version", tr.stepID(), conflict)
			}
			conflicted = append(conflicted, tr.stepID())
		default:
			t.Errorf("step %s: %v; want success or a *checkpoint.VersionConflictError", tr.stepID(), err)
		}
	}
	close(stop)
	wg.Wait()
	n, k := moved.Load(), int64(len(ok))
	t.Logf("other writer moved B %d times; %d plans for %d steps; applied %v, conflicted %v", n, plans.Load(), len(ts), ok, conflicted)

	if v, ver := balance(t, l.targetLoc, "A"); v != 1_000_000-100*k || ver != k {
		t.Errorf("A = %d v%d; want %d v%d", v, ver, 1_000_000-100*k, k)
	}
	if v, ver := balance(t, l.targetLoc, "B"); v != n+100*k || ver != n+k {
		t.Errorf("B = %d v%d; want %d v%d: every outside update plus our %d deltas once", v, ver, n+100*k, n+k, k)
	}
	s := l.read(t)
	applied := l.appliedSteps(t, s)
	if !slices.Equal(fxKeys(applied), ok) || len(s.applied) != len(ok) {
		t.Errorf("applied steps %v (effects %v); want exactly %v", fxKeys(applied), s.applied, ok)
	}
	for _, id := range conflicted {
		if st := s.steps[id].Status; st != checkpoint.StepPlanned {
			t.Errorf("conflicted step %s is %q; want planned, for a rerun to re-plan", id, st)
		}
	}
}

// TestFxConflictAfterMaxReplans makes the other writer deterministic: it
// moves B right after each plan is recorded (a wrapped store), so every plan
// is stale before it applies.
func TestFxConflictAfterMaxReplans(t *testing.T) {
	tr := fxTransfer{"T-1", "A", "B", 100}
	for _, bumps := range []int{steps.MaxReplans, steps.MaxReplans - 1} {
		t.Run(fmt.Sprintf("stale-plans=%d", bumps), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			l := fxNewLedger(t, true, map[string]int64{"A": 1000, "B": 0}, []fxTransfer{tr})
			plans := 0
			hook := &fxHookStore{Backend: l.store, afterPlan: func(string) {
				plans++
				if plans <= bumps {
					if _, err := l.target.Exec(fxBumpB); err != nil {
						t.Error(err)
					}
				}
			}}
			_, run := fxClaim(t, l.store, hook, "fx:runner")
			_, err := steps.Apply(ctx, run, tr.stepID(), fxTarget(l.ledgerPath), tr.post)
			b := int64(bumps)
			if plans != steps.MaxReplans {
				t.Errorf("%d plans recorded; want %d", plans, steps.MaxReplans)
			}
			if bumps < steps.MaxReplans {
				// The last allowed plan applies.
				if err != nil {
					t.Fatalf("Apply: %v; want success on plan %d", err, steps.MaxReplans)
				}
				fxWantAccounts(t, l, 900, 1, b+100, b+1)
				return
			}
			var conflict *checkpoint.VersionConflictError
			if !errors.As(err, &conflict) {
				t.Fatalf("Apply: %v; want a *checkpoint.VersionConflictError", err)
			}
			want := checkpoint.VersionConflictError{Table: "accounts", Key: "B", Expected: b - 1, Found: b}
			if *conflict != want || !strings.Contains(err.Error(), fmt.Sprintf(`key "B": expected version %d, found %d`, b-1, b)) {
				t.Errorf("conflict %+v (%q); want %+v", *conflict, err, want)
			}
			fxWantAccounts(t, l, 1000, 0, b, b)
			s := l.read(t)
			if len(s.applied) != 0 || s.steps[tr.stepID()].Status != checkpoint.StepPlanned {
				t.Fatalf("after the conflict: applied %v, step %q; want nothing applied, step planned", s.applied, s.steps[tr.stepID()].Status)
			}

			// With the writer gone, a rerun re-plans from the recorded
			// operations (without calling the function) and applies once.
			_, rerun := fxClaim(t, l.store, l.store, "fx:rerun")
			_, err = steps.Apply(ctx, rerun, tr.stepID(), fxTarget(l.ledgerPath), func(context.Context, *steps.Effects) (string, error) {
				t.Error("rerun called the planned step's function")
				return "", nil
			})
			if err != nil {
				t.Fatalf("rerun: %v", err)
			}
			fxWantAccounts(t, l, 900, 1, b+100, b+1)
			if s := l.read(t); len(s.applied) != 1 || s.steps[tr.stepID()].Status != checkpoint.StepCompleted {
				t.Errorf("after the rerun: applied %v, step %q; want one effect, completed", s.applied, s.steps[tr.stepID()].Status)
			}
		})
	}
}

func fxWantAccounts(t *testing.T, l *fxLedger, a, aVer, b, bVer int64) {
	t.Helper()
	if v, ver := balance(t, l.targetLoc, "A"); v != a || ver != aVer {
		t.Errorf("A = %d v%d; want %d v%d", v, ver, a, aVer)
	}
	if v, ver := balance(t, l.targetLoc, "B"); v != b || ver != bVer {
		t.Errorf("B = %d v%d; want %d v%d", v, ver, b, bVer)
	}
}

// TestFxFenceCheckRaceStaysExactlyOnce takes the run over in the window a
// separate store cannot close: after the stale runner checked its fence
// (in the checkpoint database) and before its target transaction (in
// another database). The stale runner may still apply the plan it
// recorded, under that plan's effect ID, but it records nothing, and the new
// owner finds the effect ID and does not apply it again.
func TestFxFenceCheckRaceStaysExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tr := fxTransfer{"T-1", "A", "B", 300}
	l := fxNewLedger(t, true, map[string]int64{"A": 1000, "B": 0}, []fxTransfer{tr})
	hook := &fxHookStore{Backend: l.store}
	_, stale := fxClaim(t, l.store, hook, "fx:stale")
	tookOver := false
	hook.afterRun = func() {
		fxClaim(t, l.store, l.store, "fx:new")
		tookOver = true
	}
	_, err := steps.Apply(ctx, stale, tr.stepID(), fxTarget(l.ledgerPath), tr.post)
	if tookOver && !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("stale runner after the takeover: err = %v; want checkpoint.ErrFenced", err)
	}
	if !tookOver {
		t.Fatalf("the takeover hook never ran: the separate store's fence check no longer goes through Store.Fence (err %v)", err)
	}
	s := l.read(t)
	if st := s.steps[tr.stepID()].Status; tookOver && st == checkpoint.StepCompleted {
		t.Errorf("the fenced runner recorded step %s as completed", tr.stepID())
	}
	t.Logf("window left by the stale runner: effects %v, step %q", s.applied, s.steps[tr.stepID()].Status)

	_, fresh := fxClaim(t, l.store, l.store, "fx:new")
	if _, err := steps.Apply(ctx, fresh, tr.stepID(), fxTarget(l.ledgerPath), tr.post); err != nil {
		t.Fatalf("new owner: %v", err)
	}
	s = l.read(t)
	applied := l.appliedSteps(t, s)
	l.checkInvariants(t, s, applied)
	if !applied[tr.stepID()] || s.steps[tr.stepID()].Status != checkpoint.StepCompleted {
		t.Errorf("step %s: %q, applied %v; want completed and applied once", tr.stepID(), s.steps[tr.stepID()].Status, applied)
	}
	fxWantAccounts(t, l, 700, 1, 300, 1)
}
