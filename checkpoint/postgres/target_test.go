package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

// addOne reads key in tx and writes it one higher (inserting it when it
// is missing), as the same-store effect protocol does.
func addOne(ctx context.Context, tx checkpoint.Tx, key string) error {
	v, err := tx.Target(checkpoint.StateTable)
	if err != nil {
		return err
	}
	cur, err := v.Read(ctx, []string{key})
	if err != nil {
		return err
	}
	s := cur[key]
	return v.Write(ctx, []checkpoint.Write{{Key: key, OldVersion: s.Version, OldValue: s.Value, NewValue: s.Value + 1, Insert: !s.Exists}})
}

// Two writers of one key that does not exist yet: the second waits for
// the first and then sees its row, instead of both reading it missing and
// the second failing with a version conflict at its insert (FOR UPDATE
// locks only rows that exist).
func TestTargetNewKeyWritersWait(t *testing.T) {
	url := pgtest.Schema(t)
	a := open(t, postgres.Config{URL: url, CallerClock: true})
	b := open(t, postgres.Config{URL: url, CallerClock: true})
	ctx := context.Background()
	ca := mustClaim(t, a, claimReq("new/a", "host-a:1", t0))
	cb := mustClaim(t, b, claimReq("new/b", "host-b:2", t0))
	wrote := make(chan struct{})
	bErr := make(chan error, 1)
	go func() {
		<-wrote
		bErr <- b.InTx(ctx, cb.Lease, func(tx checkpoint.Tx) error { return addOne(ctx, tx, "new:1") })
	}()
	err := a.InTx(ctx, ca.Lease, func(tx checkpoint.Tx) error {
		if err := addOne(ctx, tx, "new:1"); err != nil {
			return err
		}
		close(wrote)
		time.Sleep(200 * time.Millisecond) // B reads meanwhile, and must wait
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-bErr; err != nil {
		t.Fatalf("the second writer of a new key: %v; want it to wait for the first and then write", err)
	}
	et, err := a.OpenTarget(ctx, checkpoint.TargetSpec{Table: checkpoint.StateTable})
	if err != nil {
		t.Fatal(err)
	}
	defer et.Close()
	err = et.View(ctx, func(v checkpoint.Target) error {
		got, err := v.Read(ctx, []string{"new:1"})
		if err == nil && got["new:1"] != (checkpoint.State{Value: 2, Version: 2, Exists: true}) {
			t.Errorf("new:1 = %+v; want value 2 at version 2 (both writes, once each)", got["new:1"])
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A write that misses one key's version commits nothing, even when the
// caller ignores the error; a plan naming a key twice is refused.
func TestTargetConflictEndsTheTransaction(t *testing.T) {
	st, _ := openFresh(t)
	ctx := context.Background()
	c := mustClaim(t, st, claimReq("cas/1", "host-a:1", t0))
	for _, k := range []string{"a", "b"} {
		if err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error { return addOne(ctx, tx, k) }); err != nil {
			t.Fatal(err)
		}
	}
	err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		v, err := tx.Target(checkpoint.StateTable)
		if err != nil {
			return err
		}
		werr := v.Write(ctx, []checkpoint.Write{
			{Key: "a", OldVersion: 1, OldValue: 1, NewValue: 5},
			{Key: "b", OldVersion: 7, OldValue: 1, NewValue: 5}, // stale
		})
		var vc *checkpoint.VersionConflictError
		if !errors.As(werr, &vc) || vc.Key != "b" || vc.Expected != 7 || vc.Found != 1 {
			t.Errorf("stale write: %v; want a conflict on b, expected 7, found 1", werr)
		}
		return nil // ignored: the store must still roll back
	})
	if err == nil {
		t.Fatal("a transaction whose write conflicted committed")
	}
	err = st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		v, err := tx.Target(checkpoint.StateTable)
		if err != nil {
			return err
		}
		got, err := v.Read(ctx, []string{"a", "b"})
		if err == nil && (got["a"].Version != 1 || got["b"].Version != 1) {
			t.Errorf("after the conflict: %+v; want a and b untouched at version 1", got)
		}
		dup := v.Write(ctx, []checkpoint.Write{{Key: "a", OldVersion: 1, NewValue: 2}, {Key: "a", OldVersion: 1, NewValue: 3}})
		if dup == nil {
			t.Error("a plan writing key a twice was accepted")
		}
		return err
	})
	if err == nil {
		t.Error("the transaction with the refused duplicate write committed")
	}
}
