package steps_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/steps"
)

// A payment provider answers 503 twice, then takes the payment. The call
// is retried under the step's policy with the same idempotency key; a
// second payment step times out after the provider took it, and is
// reconciled in the same attempt instead of stopping for an operator.
func ExampleCall() {
	dir, err := os.MkdirTemp("", "stepwise-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	st, err := sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(dir, "stepwise.db")})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	now := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: "settle/2026-11-28", Job: "settle", RunKey: "2026-11-28",
		Params: []byte(`{}`), ParamsHash: "h", Owner: "host:1", Now: now, LeaseFor: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	run, err := steps.Begin(ctx, steps.Config{Store: st, Lease: c.Lease, LeaseFor: 30 * time.Second,
		Now: func() time.Time { return now }, Sleep: func(context.Context, time.Duration) error { return nil }})
	if err != nil {
		log.Fatal(err)
	}

	paid := map[string]bool{} // the provider's payments, by idempotency key
	tries := 0
	receipt, err := steps.Call(ctx, run, steps.ID("pay", "T-1001"), func(ctx context.Context, key string) (string, error) {
		tries++
		if tries < 3 {
			fmt.Println("try", tries, key, "-> 503")
			return "", steps.Transient(errors.New("503 Service Unavailable"))
		}
		paid[key] = true
		fmt.Println("try", tries, key, "-> paid")
		return "rcpt-" + key, nil
	}, steps.Retry(steps.RetryPolicy{MaxTries: 5}))
	fmt.Println(receipt, err)

	receipt, err = steps.Call(ctx, run, steps.ID("pay", "T-1002"), func(ctx context.Context, key string) (string, error) {
		paid[key] = true // taken, but the answer never comes
		<-ctx.Done()
		return "", ctx.Err()
	}, steps.Timeout(time.Millisecond), steps.Reconcile(func(ctx context.Context, key string) (any, bool, error) {
		fmt.Println("reconcile", key, "found:", paid[key])
		return "rcpt-" + key, paid[key], nil
	}))
	fmt.Println(receipt, err)
	// Output:
	// try 1 settle/2026-11-28/pay/T-1001 -> 503
	// try 2 settle/2026-11-28/pay/T-1001 -> 503
	// try 3 settle/2026-11-28/pay/T-1001 -> paid
	// rcpt-settle/2026-11-28/pay/T-1001 <nil>
	// reconcile settle/2026-11-28/pay/T-1002 found: true
	// rcpt-settle/2026-11-28/pay/T-1002 <nil>
}
