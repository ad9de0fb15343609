package checkpoint_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
)

// Effects through the contract: a store opens the built-in state table as
// an effect target in its own database (same store), a fenced transaction
// writes it compare-and-set with a step checkpoint, and a stale write is a
// version conflict.
func Example_target() {
	dir, err := os.MkdirTemp("", "stepwise-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	var st checkpoint.Store
	if st, err = sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(dir, "stepwise.db")}); err != nil {
		log.Fatal(err)
	}
	defer st.Close()

	now := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: "count/1", Job: "count", RunKey: "1",
		Params: []byte(`{}`), ParamsHash: "h", Owner: "host-a:4242", Now: now, LeaseFor: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	tgt, err := st.OpenTarget(ctx, checkpoint.TargetSpec{Table: checkpoint.StateTable})
	if err != nil {
		log.Fatal(err)
	}
	defer tgt.Close()
	fmt.Println("same store:", tgt.Same())

	write := func(w checkpoint.Write) error {
		return st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
			view, err := tx.Target(checkpoint.StateTable)
			if err != nil {
				return err
			}
			if err := view.Write(ctx, []checkpoint.Write{w}); err != nil {
				return err
			}
			return tx.PutStep(checkpoint.Step{ID: "add/" + fmt.Sprint(w.NewValue), Status: checkpoint.StepCompleted,
				Output: []byte(`null`), StartedAt: now, FinishedAt: now})
		})
	}
	if err := write(checkpoint.Write{Key: "total", NewValue: 5, Insert: true}); err != nil {
		log.Fatal(err)
	}
	if err := write(checkpoint.Write{Key: "total", OldVersion: 1, OldValue: 5, NewValue: 7}); err != nil {
		log.Fatal(err)
	}
	fmt.Println(write(checkpoint.Write{Key: "total", OldVersion: 1, OldValue: 5, NewValue: 9}))

	err = tgt.View(ctx, func(v checkpoint.Target) error {
		cur, err := v.Read(ctx, []string{"total", "other"})
		fmt.Printf("total %+v, other %+v\n", cur["total"], cur["other"])
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// same store: true
	// version conflict on stepwise_state key "total": expected version 1, found 2 (another writer moved it)
	// total {Value:7 Version:2 Exists:true}, other {Value:0 Version:0 Exists:false}
}
