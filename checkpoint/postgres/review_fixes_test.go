package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
)

// TestConnSeesLaterWrites: job SQL on Conn sees a Write made after Conn
// was obtained (writes are no longer held once the connection is handed
// out). Found by review.
func TestConnSeesLaterWrites(t *testing.T) {
	st, l := pipeEnv(t)
	ctx := context.Background()
	var seen int64
	err := st.InTx(ctx, l, func(tx checkpoint.Tx) error {
		v, _ := tx.Target(checkpoint.StateTable)
		cur, err := v.Read(ctx, []string{"a"})
		if err != nil {
			return err
		}
		c, err := postgres.Conn(tx)
		if err != nil {
			return err
		}
		if err := v.Write(ctx, []checkpoint.Write{{Key: "a", OldVersion: cur["a"].Version, OldValue: 1, NewValue: 42}}); err != nil {
			return err
		}
		return c.QueryRow(ctx, `SELECT value FROM stepwise_state WHERE key = 'a'`).Scan(&seen)
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen != 42 {
		t.Errorf("job SQL on Conn after Write saw %d, want 42", seen)
	}
}

// TestSwallowedRefusalStillFails: a refusal surfaced by a later Read that
// fn ignores still fails InTx, and nothing commits.
func TestSwallowedRefusalStillFails(t *testing.T) {
	st, l := pipeEnv(t)
	ctx := context.Background()
	var rerr error
	err := st.InTx(ctx, l, func(tx checkpoint.Tx) error {
		v, _ := tx.Target(checkpoint.StateTable)
		if _, err := v.Read(ctx, []string{"a"}); err != nil {
			return err
		}
		_ = v.Write(ctx, []checkpoint.Write{{Key: "a", OldVersion: 9, OldValue: 1, NewValue: 42}})
		_, rerr = v.Read(ctx, []string{"b"})
		return tx.PutStep(done("s", `1`))
	})
	var vc *checkpoint.VersionConflictError
	t.Logf("read err=%v InTx=%v", rerr, err)
	if !errors.As(err, &vc) {
		t.Errorf("InTx = %v; want VersionConflictError", err)
	}
	if n := len(stepIDs(t, st, l.RunID)); n != 0 {
		t.Errorf("steps committed: %d", n)
	}
}

// TestCancelBeforeCommitKeepsNothing: the context cancelled after writes
// are held and before InTx commits keeps nothing, and the pool stays good.
func TestCancelBeforeCommitKeepsNothing(t *testing.T) {
	st, l := pipeEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	err := st.InTx(ctx, l, func(tx checkpoint.Tx) error {
		v, _ := tx.Target(checkpoint.StateTable)
		if _, err := v.Read(ctx, []string{"a"}); err != nil {
			return err
		}
		_ = v.Write(ctx, []checkpoint.Write{{Key: "a", OldVersion: 1, OldValue: 1, NewValue: 42}})
		_ = tx.PutStep(done("s", `1`))
		cancel()
		return nil
	})
	t.Logf("InTx=%v", err)
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Errorf("InTx = %v; want context.Canceled", err)
	}
	if got := states(t, st, "a"); got["a"].Value != 1 {
		t.Errorf("a = %+v committed after cancel", got["a"])
	}
	if n := len(stepIDs(t, st, l.RunID)); n != 0 {
		t.Errorf("steps committed: %d", n)
	}
	// pool still good
	for i := 0; i < 5; i++ {
		if err := st.InTx(context.Background(), l, func(tx checkpoint.Tx) error { return addOne(context.Background(), tx, "b") }); err != nil {
			t.Fatalf("later InTx %d: %v", i, err)
		}
	}
}

// TestTwicePutStepInOneTransaction: a step put twice with other content in
// one open transaction is a StepConflictError, not "run not found" (the
// explanation reads after the rollback). Found by review.
func TestTwicePutStepInOneTransaction(t *testing.T) {
	st, l := pipeEnv(t)
	ctx := context.Background()
	err := st.InTx(ctx, l, func(tx checkpoint.Tx) error {
		v, _ := tx.Target(checkpoint.StateTable)
		if _, err := v.Read(ctx, []string{"a"}); err != nil {
			return err
		}
		_ = tx.PutStep(done("s", `1`))
		return tx.PutStep(done("s", `2`))
	})
	var sc *checkpoint.StepConflictError
	t.Logf("InTx=%v notfound=%v", err, errors.Is(err, checkpoint.ErrNotFound))
	if !errors.As(err, &sc) {
		t.Errorf("InTx = %v; want StepConflictError", err)
	}
}
