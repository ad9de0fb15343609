package storetest

// The effect target tests reach a table the way steps does: the store
// opens it (Store.OpenTarget), writes go through the checkpoint
// transaction's view of it (Tx.Target), reads through EffectTarget.View.

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// target is a table opened on one host as a same-store effect target.
type target struct {
	t     *testing.T
	ctx   context.Context
	table checkpoint.Table
	et    checkpoint.EffectTarget
}

// openTarget opens table on st; a table in the store's own database must
// be the same store.
func openTarget(t *testing.T, ctx context.Context, st checkpoint.Store, table checkpoint.Table) *target {
	t.Helper()
	et, err := st.OpenTarget(ctx, checkpoint.TargetSpec{Table: table})
	if err != nil {
		t.Fatalf("open target %s: %v", table, err)
	}
	t.Cleanup(func() { et.Close() })
	if !et.Same() {
		t.Fatalf("target %s in the store's own database is not the same store", table)
	}
	return &target{t: t, ctx: ctx, table: table, et: et}
}

// in returns the checkpoint transaction's view of the table.
func (g *target) in(tx checkpoint.Tx) (checkpoint.Target, error) { return tx.Target(g.table) }

// states reads keys outside any write transaction.
func (g *target) states(keys ...string) (map[string]checkpoint.State, error) {
	var out map[string]checkpoint.State
	err := g.et.View(g.ctx, func(v checkpoint.Target) error {
		var err error
		out, err = v.Read(g.ctx, keys)
		return err
	})
	return out, err
}

// applied reports whether effectID is recorded applied.
func (g *target) applied(effectID string) (bool, error) {
	var ok bool
	err := g.et.View(g.ctx, func(v checkpoint.Target) error {
		var err error
		ok, err = v.IsApplied(g.ctx, effectID)
		return err
	})
	return ok, err
}

// add plans "key += delta" on what it reads in tx, writes it with the
// store's compare-and-set, and returns the write.
func (g *target) add(tx checkpoint.Tx, key string, delta int64) (checkpoint.Write, error) {
	v, err := g.in(tx)
	if err != nil {
		return checkpoint.Write{}, err
	}
	cur, err := v.Read(g.ctx, []string{key})
	if err != nil {
		return checkpoint.Write{}, err
	}
	s := cur[key]
	w := checkpoint.Write{Key: key, OldVersion: s.Version, OldValue: s.Value, NewValue: s.Value + delta, Insert: !s.Exists}
	return w, v.Write(g.ctx, []checkpoint.Write{w})
}

func testTargets(t *testing.T, h Harness) {
	t.Run("ReadWriteAndVersions", func(t *testing.T) { targetsReadWriteAndVersions(t, h) })
	t.Run("VersionConflictRollsBackTheTransaction", func(t *testing.T) { targetsVersionConflictRollsBackTheTransaction(t, h) })
	t.Run("MissingKeyRefused", func(t *testing.T) { targetsMissingKeyRefused(t, h) })
	t.Run("AppliedEffectIDs", func(t *testing.T) { targetsAppliedEffectIDs(t, h) })
	testSeparateTargets(t, h)
}

// targetsReadWriteAndVersions is the Targets test ReadWriteAndVersions.
func targetsReadWriteAndVersions(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "target/1", ownerA, t0)
	g := openTarget(t, e.ctx, st, checkpoint.StateTable)
	got, err := g.states("acct:1")
	if err != nil || got["acct:1"] != (checkpoint.State{}) {
		t.Fatalf("a key never written reads %+v, %v; want absent, value 0, version 0", got, err)
	}
	for i, delta := range []int64{-1000, 250, 750} {
		e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
			_, err := g.add(tx, "acct:1", delta)
			return err
		})
		s, err := g.states("acct:1")
		if err != nil {
			t.Fatal(err)
		}
		if want := (checkpoint.State{Value: []int64{-1000, -750, 0}[i], Version: int64(i + 1), Exists: true}); s["acct:1"] != want {
			t.Errorf("after write %d: %+v; want %+v (a value may return, a version only grows)", i+1, s["acct:1"], want)
		}
	}
}

// targetsVersionConflictRollsBackTheTransaction is the Targets test VersionConflictRollsBackTheTransaction.
func targetsVersionConflictRollsBackTheTransaction(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "target/2", ownerA, t0)
	g := openTarget(t, e.ctx, st, checkpoint.StateTable)
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
		_, err := g.add(tx, "acct:1", 100)
		return err
	})
	err := st.InTx(e.ctx, c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(completed("post", `1`)); err != nil {
			return err
		}
		if _, err := g.add(tx, "acct:2", 5); err != nil {
			return err
		}
		// A plan made when acct:1 was at version 0: another write moved it.
		stale := checkpoint.Write{Key: "acct:1", OldVersion: 0, OldValue: 0, NewValue: 7}
		v, err := g.in(tx)
		if err != nil {
			return err
		}
		return v.Write(e.ctx, []checkpoint.Write{stale})
	})
	var vc *checkpoint.VersionConflictError
	if !errors.As(err, &vc) {
		t.Fatalf("a compare-and-set on a moved key: %v; want *VersionConflictError", err)
	}
	if vc.Key != "acct:1" || vc.Expected != 0 || vc.Found != 1 || vc.Table != checkpoint.StateTable.Name {
		t.Errorf("VersionConflictError = %+v; want key acct:1 expected 0 found 1 in %s", vc, checkpoint.StateTable.Name)
	}
	s, err := g.states("acct:1", "acct:2")
	if err != nil {
		t.Fatal(err)
	}
	if s["acct:1"] != (checkpoint.State{Value: 100, Version: 1, Exists: true}) || s["acct:2"].Exists {
		t.Errorf("after the conflict: %+v; want acct:1 untouched and acct:2 never written", s)
	}
	if steps := e.steps(st, "target/2"); len(steps) != 0 {
		t.Errorf("steps after the conflict = %+v; want none: the checkpoint rolls back with the effects", steps)
	}
}

// targetsMissingKeyRefused is the Targets test MissingKeyRefused.
func targetsMissingKeyRefused(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "target/3", ownerA, t0)
	accounts := checkpoint.StateTable
	accounts.CreateMissing = false
	g := openTarget(t, e.ctx, st, accounts)
	err := st.InTx(e.ctx, c.Lease, func(tx checkpoint.Tx) error {
		_, err := g.add(tx, "acct:404", 1)
		return err
	})
	if !errors.Is(err, checkpoint.ErrMissingKey) {
		t.Errorf("a write to a missing key of a table that does not create keys: %v; want ErrMissingKey", err)
	}
}

// targetsAppliedEffectIDs is the Targets test AppliedEffectIDs.
func targetsAppliedEffectIDs(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "target/4", ownerA, t0)
	g := openTarget(t, e.ctx, st, checkpoint.StateTable)
	mark := func(effectID string, fail bool) error {
		return st.InTx(e.ctx, c.Lease, func(tx checkpoint.Tx) error {
			if _, err := g.add(tx, "acct:1", 1); err != nil {
				return err
			}
			v, err := g.in(tx)
			if err != nil {
				return err
			}
			if err := v.MarkApplied(e.ctx, checkpoint.Applied{EffectID: effectID, RunID: "target/4", StepID: "post", At: t0}); err != nil {
				return err
			}
			if fail {
				return errors.New("the step failed after applying")
			}
			return nil
		})
	}
	if err := mark("target/4/post@1.0", true); err == nil {
		t.Fatal("the failing transaction committed")
	}
	if ok, err := g.applied("target/4/post@1.0"); err != nil || ok {
		t.Errorf("effect ID of a rolled-back transaction: applied %v, %v; want not applied", ok, err)
	}
	if err := mark("target/4/post@1.1", false); err != nil {
		t.Fatal(err)
	}
	if ok, err := g.applied("target/4/post@1.1"); err != nil || !ok {
		t.Errorf("effect ID of a committed transaction: applied %v, %v; want applied", ok, err)
	}
	if err := mark("target/4/post@1.1", false); err == nil {
		t.Errorf("an effect ID marked applied twice committed; want an error (an effect applies once)")
	}
	if s, _ := g.states("acct:1"); s["acct:1"].Version != 1 {
		t.Errorf("acct:1 = %+v; want version 1: only the one committed application counts", s["acct:1"])
	}
}

// raceSameStoreTarget is the fence race's same-store effect: a
// compare-and-set on the state table and the step checkpoint that records
// its plan, in one transaction.
func raceSameStoreTarget(e *env, a, b checkpoint.Store) fencedWrite {
	ga := openTarget(e.t, e.ctx, a, checkpoint.StateTable)
	gb := openTarget(e.t, e.ctx, b, checkpoint.StateTable)
	key := func(round int) string { return fmt.Sprintf("acct:%04d", round) }
	return fencedWrite{
		write: func(tx checkpoint.Tx, round int) error {
			w, err := ga.add(tx, key(round), 1000)
			if err != nil {
				return err
			}
			s := completed("post", `{}`)
			s.Plan = fmt.Appendf(nil, `{"writes":[{"key":%q,"new_value":%d}]}`, w.Key, w.NewValue)
			return tx.PutStep(s)
		},
		rows: 2,
		visible: func(st checkpoint.Store, runID string, round int) (int, error) {
			g := ga
			if st == b {
				g = gb
			}
			s, err := g.states(key(round))
			if err != nil {
				return 0, err
			}
			n := 0
			if s[key(round)] == (checkpoint.State{Value: 1000, Version: 1, Exists: true}) {
				n++
			}
			err = st.Steps(e.ctx, runID, func(s checkpoint.Step) error {
				if s.ID == "post" {
					n++
				}
				return nil
			})
			return n, err
		},
	}
}
