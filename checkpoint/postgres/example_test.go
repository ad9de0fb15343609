package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
)

// ExampleOpen opens a shared store, claims a run and records a step. (It
// needs a server, so it is compiled, not run: the tests cover each call.)
func ExampleOpen() {
	ctx := context.Background()
	st, err := postgres.Open(ctx, postgres.Config{URL: "postgres://stepwise@db.internal:5432/stepwise"})
	if errors.Is(err, postgres.ErrUnavailable) {
		fmt.Println(err) // postgres: server unavailable: server db.internal:5432, database stepwise (connect): ...
		return
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{
		RunID: "settle/2026-11-28", Job: "settle", RunKey: "2026-11-28",
		Params: []byte(`{}`), ParamsHash: "44136fa3", Owner: "host-a:4242", LeaseFor: time.Minute,
	})
	if err != nil {
		fmt.Println(err) // e.g. run settle/2026-11-28 is held by host-b:77 until ...
		return
	}
	err = st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		return tx.PutStep(checkpoint.Step{ID: "load", Status: checkpoint.StepCompleted, Output: []byte(`{"rows":3}`)})
	})
	if errors.Is(err, checkpoint.ErrFenced) {
		fmt.Println("another runner took the run over; this one stops")
	}
}
