package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
)

// pipeEnv is a store with a run claimed and keys a and b of the state
// table at version 1, value 1.
func pipeEnv(t *testing.T) (*postgres.Store, checkpoint.Lease) {
	t.Helper()
	st, _ := openFresh(t)
	ctx := context.Background()
	c := mustClaim(t, st, claimReq("pipe/1", "host-a:1", t0))
	for _, k := range []string{"a", "b"} {
		if err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error { return addOne(ctx, tx, k) }); err != nil {
			t.Fatal(err)
		}
	}
	return st, c.Lease
}

// states reads keys of the state table outside any checkpoint transaction.
func states(t *testing.T, st *postgres.Store, keys ...string) map[string]checkpoint.State {
	t.Helper()
	ctx := context.Background()
	et, err := st.OpenTarget(ctx, checkpoint.TargetSpec{Table: checkpoint.StateTable})
	if err != nil {
		t.Fatal(err)
	}
	defer et.Close()
	var got map[string]checkpoint.State
	if err := et.View(ctx, func(v checkpoint.Target) error {
		var err error
		got, err = v.Read(ctx, keys)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// stepIDs lists the recorded steps of a run.
func stepIDs(t *testing.T, st *postgres.Store, runID string) map[string]checkpoint.Step {
	t.Helper()
	out := map[string]checkpoint.Step{}
	if err := st.Steps(context.Background(), runID, func(s checkpoint.Step) error { out[s.ID] = s; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func done(id, output string) checkpoint.Step {
	return checkpoint.Step{ID: id, Status: checkpoint.StepCompleted, Output: []byte(output), StartedAt: t0, FinishedAt: t0}
}

// Writes made after a read go to the server with COMMIT in one batch. A
// compare-and-set there that misses a key aborts the transaction: the
// COMMIT behind it in the same batch commits nothing (neither the writes
// queued before the failed one nor those after it), and InTx returns the
// *checkpoint.VersionConflictError naming the key, expected and found
// versions, as a Write sent alone would.
func TestPipelinedConflictKeepsNothing(t *testing.T) {
	st, l := pipeEnv(t)
	ctx := context.Background()
	var werr error
	err := st.InTx(ctx, l, func(tx checkpoint.Tx) error {
		v, err := tx.Target(checkpoint.StateTable)
		if err != nil {
			return err
		}
		if _, err := v.Read(ctx, []string{"a", "b"}); err != nil {
			return err
		}
		if err := tx.PutStep(done("before", `1`)); err != nil {
			return err
		}
		werr = v.Write(ctx, []checkpoint.Write{
			{Key: "a", OldVersion: 1, OldValue: 1, NewValue: 5},
			{Key: "b", OldVersion: 7, OldValue: 1, NewValue: 5}, // stale
			{Key: "c", NewValue: 5, Insert: true},
		})
		if werr != nil {
			return werr
		}
		if err := tx.Enqueue(checkpoint.Message{Key: "pipe/1/m", Topic: "t", Payload: []byte(`{}`), CreatedAt: t0}); err != nil {
			return err
		}
		return tx.PutStep(done("after", `2`))
	})
	if werr != nil {
		t.Errorf("Write in the open transaction returned %v; want nil (its statement waits for COMMIT's round trip)", werr)
	}
	var vc *checkpoint.VersionConflictError
	if !errors.As(err, &vc) {
		t.Fatalf("InTx = %v; want a *checkpoint.VersionConflictError", err)
	}
	if want := (checkpoint.VersionConflictError{Table: checkpoint.StateTable.Name, Key: "b", Expected: 7, Found: 1}); *vc != want {
		t.Errorf("conflict = %+v; want %+v", *vc, want)
	}
	got := states(t, st, "a", "b", "c")
	if got["a"] != (checkpoint.State{Value: 1, Version: 1, Exists: true}) || got["b"].Version != 1 || got["c"].Exists {
		t.Errorf("after the conflict: %+v; want a and b untouched, c never inserted", got)
	}
	if steps := stepIDs(t, st, l.RunID); len(steps) != 0 {
		t.Errorf("steps after the conflict: %v; want none", steps)
	}
	msgs, err := st.RunMessages(ctx, l.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 0 {
		t.Errorf("messages after the conflict: %+v; want none", msgs)
	}
	// The connection is usable: the next transaction commits.
	if err := st.InTx(ctx, l, func(tx checkpoint.Tx) error { return addOne(ctx, tx, "a") }); err != nil {
		t.Fatalf("the transaction after the conflict: %v", err)
	}
	if got := states(t, st, "a"); got["a"].Version != 2 {
		t.Errorf("a = %+v after a good write; want version 2", got["a"])
	}
}

// An insert of a key another writer created is a conflict too, found at
// the existing row's version; the pipelined writes ahead of a read are
// reported by that read.
func TestPipelinedInsertConflict(t *testing.T) {
	st, l := pipeEnv(t)
	ctx := context.Background()
	err := st.InTx(ctx, l, func(tx checkpoint.Tx) error {
		v, err := tx.Target(checkpoint.StateTable)
		if err != nil {
			return err
		}
		if _, err := v.Read(ctx, []string{"b"}); err != nil {
			return err
		}
		if err := v.Write(ctx, []checkpoint.Write{{Key: "a", NewValue: 9, Insert: true}, {Key: "b", OldVersion: 1, NewValue: 3}}); err != nil {
			return err
		}
		_, err = v.Read(ctx, []string{"a"})
		return err
	})
	var vc *checkpoint.VersionConflictError
	if !errors.As(err, &vc) || vc.Key != "a" || vc.Expected != 0 || vc.Found != 1 {
		t.Fatalf("InTx = %v; want a conflict on a, expected 0 (missing), found 1", err)
	}
	if got := states(t, st, "a", "b"); got["a"].Version != 1 || got["b"].Version != 1 {
		t.Errorf("after the conflict: %+v; want a and b at version 1", got)
	}
}

// A step checkpoint after a read is sent with COMMIT: refused (the step is
// finished with another result) it rolls back the transaction's effects
// and is InTx's *checkpoint.StepConflictError; finished with the same
// result (our own earlier commit) it is accepted and the effects commit.
func TestPipelinedPutStep(t *testing.T) {
	st, l := pipeEnv(t)
	ctx := context.Background()
	if err := st.InTx(ctx, l, func(tx checkpoint.Tx) error { return tx.PutStep(done("s", `1`)) }); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		output  string
		wantErr bool
		wantA   int64
	}{{`2`, true, 1}, {`1`, false, 2}} {
		err := st.InTx(ctx, l, func(tx checkpoint.Tx) error {
			if err := addOne(ctx, tx, "a"); err != nil {
				return err
			}
			return tx.PutStep(done("s", tc.output))
		})
		var sc *checkpoint.StepConflictError
		if tc.wantErr && (!errors.As(err, &sc) || sc.StepID != "s" || sc.Status != checkpoint.StepCompleted) {
			t.Errorf("PutStep with output %s over a completed step with output 1: %v; want a StepConflictError for s", tc.output, err)
		}
		if !tc.wantErr && err != nil {
			t.Errorf("PutStep again with the recorded result: %v; want success", err)
		}
		if got := states(t, st, "a"); got["a"].Version != tc.wantA {
			t.Errorf("after PutStep with output %s: a = %+v; want version %d", tc.output, got["a"], tc.wantA)
		}
	}
	if s := stepIDs(t, st, l.RunID)["s"]; string(s.Output) != `1` {
		t.Errorf("step s = %+v; want its first output kept", s)
	}
}

// Items recorded after a read are sent with COMMIT: one already finished
// rolls the chunk back and is named in InTx's checkpoint.ErrItemFinished.
func TestPipelinedPutItemsRefused(t *testing.T) {
	st, l := pipeEnv(t)
	ctx := context.Background()
	item := func(key, out string) checkpoint.Item {
		return checkpoint.Item{Step: "post", Key: key, Status: checkpoint.StepCompleted, Output: []byte(out), Chunk: "c1"}
	}
	if err := st.InTx(ctx, l, func(tx checkpoint.Tx) error { return tx.PutItems([]checkpoint.Item{item("k2", `1`)}) }); err != nil {
		t.Fatal(err)
	}
	err := st.InTx(ctx, l, func(tx checkpoint.Tx) error {
		if err := addOne(ctx, tx, "a"); err != nil {
			return err
		}
		return tx.PutItems([]checkpoint.Item{item("k1", `1`), item("k2", `2`)})
	})
	if !errors.Is(err, checkpoint.ErrItemFinished) {
		t.Fatalf("InTx = %v; want checkpoint.ErrItemFinished", err)
	}
	if want := "item post/k2 of run pipe/1 is already finished"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if got := states(t, st, "a"); got["a"].Version != 1 {
		t.Errorf("a = %+v; want version 1: the chunk's effect rolled back", got["a"])
	}
	var keys []string
	if err := st.Items(ctx, checkpoint.ItemQuery{RunID: l.RunID, Step: "post"}, func(it checkpoint.Item) error {
		keys = append(keys, it.Key+"="+string(it.Output))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != "k2=1" {
		t.Errorf("items = %v; want only k2=1", keys)
	}
}
