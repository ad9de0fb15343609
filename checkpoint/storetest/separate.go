package storetest

// The separate-store effect target tests: a table in a database that is
// not the checkpoint's, opened by Store.OpenTarget from a Location,
// written in its own transactions (EffectTarget.Update) with the
// applied-effects record beside the writes.

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// TargetDatabase is a database for separate-store effect targets, of the
// backend's own kind, and what the suite needs to set it up and check it
// without going through the store.
type TargetDatabase struct {
	// Location is the TargetSpec.Location naming the database.
	Location string
	// Missing is a location of the same kind naming a database that does
	// not exist (a file in a directory that does, a database the server
	// does not have). If it carries a password, no error may show it.
	Missing string
	// Exec runs one statement on the database. The suite's SQL is
	// portable: TEXT and BIGINT columns, $1 placeholders.
	Exec func(sql string, args ...any) error
	// QueryInt runs a query returning one row of one integer.
	QueryInt func(sql string, args ...any) (int64, error)
	// Tables lists the names of the tables in the database (in the
	// location's schema, for a server), in any order.
	Tables func() ([]string, error)
}

// ledger is the separate target's table: accounts that must exist.
var ledger = checkpoint.Table{Name: "ledger", Key: "id", Value: "balance", Version: "version"}

// newLedger makes a target database with the ledger table holding
// acct:1 = 100 and acct:2 = 0, both at version 1.
func newLedger(t *testing.T, h Harness) TargetDatabase {
	t.Helper()
	td := h.NewTargetDatabase(t)
	for _, q := range []string{
		`CREATE TABLE ledger (id TEXT PRIMARY KEY, balance BIGINT NOT NULL, version BIGINT NOT NULL)`,
		`INSERT INTO ledger (id, balance, version) VALUES ('acct:1', 100, 1), ('acct:2', 0, 1)`,
	} {
		if err := td.Exec(q); err != nil {
			t.Fatalf("set up the target database %s: %s: %v", td.Location, q, err)
		}
	}
	return td
}

// row is a ledger row read straight from the target database.
func row(t *testing.T, td TargetDatabase, key string) checkpoint.State {
	t.Helper()
	bal, err := td.QueryInt(`SELECT balance FROM ledger WHERE id = $1`, key)
	if err != nil {
		t.Fatalf("read %s of the target database: %v", key, err)
	}
	ver, err := td.QueryInt(`SELECT version FROM ledger WHERE id = $1`, key)
	if err != nil {
		t.Fatalf("read %s of the target database: %v", key, err)
	}
	return checkpoint.State{Value: bal, Version: ver, Exists: true}
}

// openSeparate opens table in td as an effect target of st, which must
// not be the same store.
func openSeparate(t *testing.T, ctx context.Context, st checkpoint.Store, td TargetDatabase, spec checkpoint.TargetSpec) checkpoint.EffectTarget {
	t.Helper()
	spec.Location = td.Location
	et, err := st.OpenTarget(ctx, spec)
	if err != nil {
		t.Fatalf("open target %s in %s: %v", spec.Table, td.Location, err)
	}
	t.Cleanup(func() { et.Close() })
	if et.Same() {
		t.Fatalf("target %s in another database (%s) is the same store; want separate", spec.Table, td.Location)
	}
	return et
}

// plan reads keys in v and returns the writes adding deltas to them.
func plan(ctx context.Context, v checkpoint.Target, deltas map[string]int64) ([]checkpoint.Write, error) {
	keys := make([]string, 0, len(deltas))
	for k := range deltas {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	cur, err := v.Read(ctx, keys)
	if err != nil {
		return nil, err
	}
	var ws []checkpoint.Write
	for _, k := range keys {
		s := cur[k]
		ws = append(ws, checkpoint.Write{Key: k, OldVersion: s.Version, OldValue: s.Value, NewValue: s.Value + deltas[k], Insert: !s.Exists})
	}
	return ws, nil
}

// appliedIn reports whether effectID is recorded in et's database.
func appliedIn(ctx context.Context, et checkpoint.EffectTarget, effectID string) (bool, error) {
	var ok bool
	err := et.View(ctx, func(v checkpoint.Target) error {
		var err error
		ok, err = v.IsApplied(ctx, effectID)
		return err
	})
	return ok, err
}

func testSeparateTargets(t *testing.T, h Harness) {
	t.Run("LocationOfTheStoreItselfIsTheSameStore", func(t *testing.T) { separateLocationOfTheStoreItselfIsTheSameStore(t, h) })
	t.Run("SeparateAppliesAndRecordsTheEffect", func(t *testing.T) { separateSeparateAppliesAndRecordsTheEffect(t, h) })
	t.Run("SeparateVersionConflict", func(t *testing.T) { separateSeparateVersionConflict(t, h) })
	t.Run("SeparateConcurrentFinishOfOnePlan", func(t *testing.T) { separateSeparateConcurrentFinishOfOnePlan(t, h) })
	t.Run("SeparateMissingKeys", func(t *testing.T) { separateSeparateMissingKeys(t, h) })
	t.Run("SeparateReadOnlyWritesNothing", func(t *testing.T) { separateSeparateReadOnlyWritesNothing(t, h) })
	t.Run("SeparateMissingDatabaseOrTable", func(t *testing.T) { separateSeparateMissingDatabaseOrTable(t, h) })
}

// separateLocationOfTheStoreItselfIsTheSameStore is the SeparateTargets test LocationOfTheStoreItselfIsTheSameStore.
func separateLocationOfTheStoreItselfIsTheSameStore(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	et, err := st.OpenTarget(e.ctx, checkpoint.TargetSpec{Location: e.db, Table: checkpoint.StateTable})
	if err != nil {
		t.Fatalf("open the state table at the store's own location %s: %v", e.db, err)
	}
	defer et.Close()
	if !et.Same() {
		t.Errorf("the store's own location %s is a separate store; want the same store", e.db)
	}
}

// separateSeparateAppliesAndRecordsTheEffect is the SeparateTargets test SeparateAppliesAndRecordsTheEffect.
func separateSeparateAppliesAndRecordsTheEffect(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	td := newLedger(t, h)
	et := openSeparate(t, e.ctx, st, td, checkpoint.TargetSpec{Table: ledger})
	a := checkpoint.Applied{EffectID: "sep/1/pay@1.0", RunID: "sep/1", StepID: "pay", At: t0}
	err := et.Update(e.ctx, func(v checkpoint.Target) error {
		ws, err := plan(e.ctx, v, map[string]int64{"acct:1": -30, "acct:2": 30})
		if err != nil {
			return err
		}
		if err := v.Write(e.ctx, ws); err != nil {
			return err
		}
		return v.MarkApplied(e.ctx, a)
	})
	if err != nil {
		t.Fatalf("apply a transfer to the separate target: %v", err)
	}
	if got := row(t, td, "acct:1"); got != (checkpoint.State{Value: 70, Version: 2, Exists: true}) {
		t.Errorf("acct:1 after the transfer = %+v; want 70 at version 2", got)
	}
	if got := row(t, td, "acct:2"); got != (checkpoint.State{Value: 30, Version: 2, Exists: true}) {
		t.Errorf("acct:2 after the transfer = %+v; want 30 at version 2", got)
	}
	if ok, err := appliedIn(e.ctx, et, a.EffectID); err != nil || !ok {
		t.Errorf("IsApplied(%s) after MarkApplied committed = %v, %v; want true", a.EffectID, ok, err)
	}
	if ok, err := appliedIn(e.ctx, et, "sep/1/pay@2.0"); err != nil || ok {
		t.Errorf("IsApplied of an effect never marked = %v, %v; want false", ok, err)
	}

	// The same effect applied again: refused, and its writes roll back.
	err = et.Update(e.ctx, func(v checkpoint.Target) error {
		ws, err := plan(e.ctx, v, map[string]int64{"acct:1": -30})
		if err != nil {
			return err
		}
		if err := v.Write(e.ctx, ws); err != nil {
			return err
		}
		return v.MarkApplied(e.ctx, a)
	})
	if err == nil {
		t.Error("an effect ID marked applied twice committed; want an error (an effect applies once)")
	}
	// A failing fn rolls back what it wrote.
	boom := errors.New("the step failed after writing")
	err = et.Update(e.ctx, func(v checkpoint.Target) error {
		ws, err := plan(e.ctx, v, map[string]int64{"acct:2": 5})
		if err != nil {
			return err
		}
		if err := v.Write(e.ctx, ws); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Errorf("Update whose fn fails = %v; want fn's error", err)
	}
	if got := row(t, td, "acct:1"); got.Value != 70 || got.Version != 2 {
		t.Errorf("acct:1 after a refused second application = %+v; want 70 at version 2", got)
	}
	if got := row(t, td, "acct:2"); got.Value != 30 || got.Version != 2 {
		t.Errorf("acct:2 after a failed Update = %+v; want 30 at version 2", got)
	}

	// Closing the target leaves the store open.
	if err := et.Close(); err != nil {
		t.Errorf("close the separate target: %v", err)
	}
	e.claim(st, "sep/1", ownerA, t0)
}

// separateSeparateVersionConflict is the SeparateTargets test SeparateVersionConflict.
func separateSeparateVersionConflict(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	td := newLedger(t, h)
	et := openSeparate(t, e.ctx, st, td, checkpoint.TargetSpec{Table: ledger})
	// A plan made from a read outside the write transaction...
	var ws []checkpoint.Write
	if err := et.View(e.ctx, func(v checkpoint.Target) error {
		var err error
		ws, err = plan(e.ctx, v, map[string]int64{"acct:1": -10, "acct:2": 10})
		return err
	}); err != nil {
		t.Fatalf("read the plan's keys: %v", err)
	}
	// ...and another writer moves acct:2 before it is applied.
	if err := td.Exec(`UPDATE ledger SET balance = 500, version = 2 WHERE id = 'acct:2'`); err != nil {
		t.Fatal(err)
	}
	a := checkpoint.Applied{EffectID: "sep/2/pay@1.0", RunID: "sep/2", StepID: "pay", At: t0}
	err := et.Update(e.ctx, func(v checkpoint.Target) error {
		if err := v.Write(e.ctx, ws); err != nil {
			return err
		}
		return v.MarkApplied(e.ctx, a)
	})
	var vc *checkpoint.VersionConflictError
	if !errors.As(err, &vc) {
		t.Fatalf("a compare-and-set on a key another writer moved: %v; want *VersionConflictError", err)
	}
	if vc.Key != "acct:2" || vc.Expected != 1 || vc.Found != 2 || vc.Table != ledger.Name {
		t.Errorf("VersionConflictError = %+v; want key acct:2 expected 1 found 2 in %s", vc, ledger.Name)
	}
	if got := row(t, td, "acct:1"); got.Value != 100 || got.Version != 1 {
		t.Errorf("acct:1 after the conflict = %+v; want 100 at version 1: the whole plan rolls back", got)
	}
	if ok, err := appliedIn(e.ctx, et, a.EffectID); err != nil || ok {
		t.Errorf("IsApplied of the conflicting plan = %v, %v; want false", ok, err)
	}
}

// separateSeparateConcurrentFinishOfOnePlan is the SeparateTargets test SeparateConcurrentFinishOfOnePlan.
func separateSeparateConcurrentFinishOfOnePlan(t *testing.T, h Harness) {
	// A runner that lost its lease (A) and the new owner (B) finish
	// the same recorded plan (one effect ID) on the separate target
	// at once. B's applied check runs while A has applied and marked
	// the effect but not committed. B must then either wait and see
	// the effect applied, or fail some other way: never see it
	// unapplied and then hit a version conflict, which the protocol
	// takes for "nothing of ours applied" and answers by planning and
	// applying the effect again.
	e := newEnv(t, h)
	sa, sb := e.open(), e.open()
	td := newLedger(t, h)
	ea := openSeparate(t, e.ctx, sa, td, checkpoint.TargetSpec{Table: ledger})
	eb := openSeparate(t, e.ctx, sb, td, checkpoint.TargetSpec{Table: ledger})
	ws := []checkpoint.Write{{Key: "acct:1", OldVersion: 1, OldValue: 100, NewValue: 90}}
	a := checkpoint.Applied{EffectID: "sep/race/pay@1.0", RunID: "sep/race", StepID: "pay", At: t0}
	marked, bStarted := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		aDone <- ea.Update(e.ctx, func(v checkpoint.Target) error {
			if ok, err := v.IsApplied(e.ctx, a.EffectID); err != nil || ok {
				return fmt.Errorf("runner A: IsApplied = %v, %v; want false", ok, err)
			}
			if err := v.Write(e.ctx, ws); err != nil {
				return err
			}
			if err := v.MarkApplied(e.ctx, a); err != nil {
				return err
			}
			close(marked)
			<-bStarted
			time.Sleep(h.BlockFor) // B runs into A's open transaction
			return nil
		})
	}()
	<-marked
	var bSaw bool
	go func() {
		time.Sleep(h.BlockFor / 2)
		close(bStarted)
	}()
	errB := eb.Update(e.ctx, func(v checkpoint.Target) error {
		var err error
		if bSaw, err = v.IsApplied(e.ctx, a.EffectID); err != nil || bSaw {
			return err
		}
		if err := v.Write(e.ctx, ws); err != nil {
			return err
		}
		return v.MarkApplied(e.ctx, a)
	})
	if err := <-aDone; err != nil {
		t.Fatalf("A's apply: %v", err)
	}
	var vc *checkpoint.VersionConflictError
	if errors.As(errB, &vc) {
		t.Fatalf("B saw the effect unapplied, then a version conflict (%v): a runner would plan and apply it a second time", errB)
	}
	if errB != nil || !bSaw {
		t.Errorf("B's finish of the same plan: saw applied %v, err %v; want it to wait for A and see the effect applied", bSaw, errB)
	}
	if got := row(t, td, "acct:1"); got.Value != 90 || got.Version != 2 {
		t.Errorf("acct:1 after both = %+v; want 90 at version 2: applied once", got)
	}
}

// separateSeparateMissingKeys is the SeparateTargets test SeparateMissingKeys.
func separateSeparateMissingKeys(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	td := newLedger(t, h)
	et := openSeparate(t, e.ctx, st, td, checkpoint.TargetSpec{Table: ledger})
	err := et.Update(e.ctx, func(v checkpoint.Target) error {
		_, err := plan(e.ctx, v, map[string]int64{"acct:404": 1})
		return err
	})
	if !errors.Is(err, checkpoint.ErrMissingKey) {
		t.Errorf("a missing key of a table that does not create keys: %v; want ErrMissingKey", err)
	}
	creating := ledger
	creating.CreateMissing = true
	ec := openSeparate(t, e.ctx, st, td, checkpoint.TargetSpec{Table: creating})
	if err := ec.Update(e.ctx, func(v checkpoint.Target) error {
		ws, err := plan(e.ctx, v, map[string]int64{"acct:3": 42, "acct:1": 1})
		if err != nil {
			return err
		}
		return v.Write(e.ctx, ws)
	}); err != nil {
		t.Fatalf("write a new key to a table that creates keys: %v", err)
	}
	if got := row(t, td, "acct:3"); got.Value != 42 || got.Version != 1 {
		t.Errorf("new key acct:3 = %+v; want 42 at version 1", got)
	}
	if got := row(t, td, "acct:1"); got.Value != 101 || got.Version != 2 {
		t.Errorf("acct:1 = %+v; want 101 at version 2", got)
	}
}

// separateSeparateReadOnlyWritesNothing is the SeparateTargets test SeparateReadOnlyWritesNothing.
func separateSeparateReadOnlyWritesNothing(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	td := newLedger(t, h)
	before, err := td.Tables()
	if err != nil {
		t.Fatal(err)
	}
	et := openSeparate(t, e.ctx, st, td, checkpoint.TargetSpec{Table: ledger, ReadOnly: true})
	var got map[string]checkpoint.State
	if err := et.View(e.ctx, func(v checkpoint.Target) error {
		var err error
		if got, err = v.Read(e.ctx, []string{"acct:1", "acct:2"}); err != nil {
			return err
		}
		ok, err := v.IsApplied(e.ctx, "sep/3/pay@1.0")
		if ok {
			return errors.New("an effect never applied reads applied")
		}
		return err
	}); err != nil {
		t.Fatalf("read a target opened read-only: %v", err)
	}
	if got["acct:1"] != (checkpoint.State{Value: 100, Version: 1, Exists: true}) {
		t.Errorf("acct:1 read-only = %+v; want 100 at version 1", got["acct:1"])
	}
	if err := et.Update(e.ctx, func(v checkpoint.Target) error { return nil }); err == nil {
		t.Error("Update on a target opened read-only succeeded; want an error")
	}
	after, err := td.Tables()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(before)
	slices.Sort(after)
	if !slices.Equal(before, after) {
		t.Errorf("tables of the target database before a read-only open %v, after %v; want no change (read-only writes nothing)", before, after)
	}
	if got := row(t, td, "acct:1"); got.Value != 100 || got.Version != 1 {
		t.Errorf("acct:1 after a read-only open = %+v; want untouched", got)
	}
}

// separateSeparateMissingDatabaseOrTable is the SeparateTargets test SeparateMissingDatabaseOrTable.
func separateSeparateMissingDatabaseOrTable(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	td := h.NewTargetDatabase(t)
	_, err := st.OpenTarget(e.ctx, checkpoint.TargetSpec{Location: td.Missing, Table: ledger})
	if !errors.Is(err, checkpoint.ErrNoDatabase) {
		t.Fatalf("open a target in a database that does not exist (%s): %v; want ErrNoDatabase", td.Missing, err)
	}
	loc := td.Missing
	if u, perr := url.Parse(loc); perr == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && strings.Contains(err.Error(), pw) {
			t.Errorf("the error shows the location's password: %v", err)
		}
		loc = u.Path
	}
	if name := path.Base(loc); !strings.Contains(err.Error(), name) {
		t.Errorf("the error %q does not name the missing database %s", err, name)
	}
	if _, err := st.OpenTarget(e.ctx, checkpoint.TargetSpec{Location: td.Location, Table: ledger}); err == nil {
		t.Error("open a target table that does not exist succeeded; want an error at open")
	}
}
