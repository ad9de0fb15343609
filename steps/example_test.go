package steps_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/steps"
)

// loadTotal is the job's first step; it reports whether it ran or was
// answered from its checkpoint.
func loadTotal(ctx context.Context, run *steps.Run) (int64, error) {
	before := run.Stats().Skipped
	total, err := steps.Do(ctx, run, steps.ID("load"), func(ctx context.Context) (int64, error) {
		fmt.Println("load: loading orders")
		return 1250, nil
	})
	if err != nil {
		return 0, err
	}
	if run.Stats().Skipped > before {
		fmt.Println("load: skipped (checkpointed)")
	}
	return total, nil
}

// A run crashes after its first step; the rerun skips that step, gets its
// recorded output, and carries on.
func Example_resume() {
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

	now := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	attempt := func(now time.Time) *steps.Run {
		c, err := st.Claim(ctx, checkpoint.ClaimRequest{
			RunID: "report/2026-11-28", Job: "report", RunKey: "2026-11-28",
			Params: []byte(`{}`), ParamsHash: "h", Owner: "host:1", Now: now, LeaseFor: time.Minute,
		})
		if err != nil {
			log.Fatal(err)
		}
		run, err := steps.Begin(ctx, steps.Config{Store: st, Lease: c.Lease, Now: func() time.Time { return now }})
		if err != nil {
			log.Fatal(err)
		}
		return run
	}

	// First attempt: load runs, then the process dies before "fees".
	run := attempt(now)
	total, _ := loadTotal(ctx, run)
	fmt.Println("attempt", run.Attempt(), "total", total)

	// The rerun, after the dead runner's lease expired.
	run = attempt(now.Add(2 * time.Minute))
	total, _ = loadTotal(ctx, run)
	fee, err := steps.Do(ctx, run, steps.ID("fees", "2026-11-28"), func(ctx context.Context) (int64, error) {
		return total * 15 / 1000, nil
	}, steps.Input(total))
	if err != nil {
		log.Fatal(err)
	}
	s := run.Stats()
	fmt.Println("attempt", run.Attempt(), "total", total, "fee", fee)
	fmt.Printf("executed %d, skipped %d\n", s.Executed, s.Skipped)
	// Output:
	// load: loading orders
	// attempt 1 total 1250
	// load: skipped (checkpointed)
	// attempt 2 total 1250 fee 18
	// executed 1, skipped 1
}

func ExampleID() {
	fmt.Println(steps.ID("load"))
	fmt.Println(steps.ID("post", "T-1001"))
	fmt.Println(steps.ValidateID(steps.ID("post", "T 1001")) != nil)
	// Output:
	// load
	// post/T-1001
	// true
}
