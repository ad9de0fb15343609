package sqlite_test

import (
	"context"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
)

// A panic inside an InTx function rolls the transaction back as it goes
// by: the one writer connection is free again, and nothing of the
// transaction was kept.
func TestInTxPanicRollsBack(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	ctx := context.Background()
	c, err := st.Claim(ctx, claimReq("job/panic", "a:1", claimNow))
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not reach the caller")
			}
		}()
		st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
			if err := tx.PutStep(checkpoint.Step{ID: "half", Status: checkpoint.StepCompleted, Output: []byte(`1`),
				StartedAt: claimNow, FinishedAt: claimNow}); err != nil {
				t.Error(err)
			}
			panic("job bug")
		})
	}()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = st.InTx(wctx, c.Lease, func(tx checkpoint.Tx) error {
		return tx.PutStep(checkpoint.Step{ID: "next", Status: checkpoint.StepCompleted, Output: []byte(`2`),
			StartedAt: claimNow, FinishedAt: claimNow})
	})
	if err != nil {
		t.Fatalf("write after a panicking transaction: %v (its transaction was left open)", err)
	}
	var ids []string
	if err := st.Steps(ctx, "job/panic", func(s checkpoint.Step) error { ids = append(ids, s.ID); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] != "next" {
		t.Errorf("steps recorded: %v; want only [next] (the panicking transaction kept nothing)", ids)
	}
}
