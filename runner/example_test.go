package runner_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

type dayParams struct {
	Date string `param:"date,key" format:"date"`
}

// Run a job, then run it again: the second run executes nothing and returns
// every step's recorded output.
func Example() {
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

	var registry jobs.Registry
	registry.MustRegister(jobs.Define("report", func(ctx context.Context, run *steps.Run, p dayParams) error {
		orders, err := steps.Do(ctx, run, steps.ID("load"), func(ctx context.Context) ([]int64, error) {
			return []int64{1200, 800, 4000}, nil
		})
		if err != nil {
			return err
		}
		for i, amount := range orders {
			if _, err := steps.Do(ctx, run, steps.ID("price", fmt.Sprint(i+1)), func(ctx context.Context) (int64, error) {
				return amount * 15 / 1000, nil
			}); err != nil {
				return err
			}
		}
		return nil
	}))

	r, err := runner.New(runner.Config{Store: st, Jobs: &registry})
	if err != nil {
		log.Fatal(err)
	}
	req := runner.Request{Job: "report", Values: map[string]string{"date": "2026-11-28"}}
	first, err := r.Run(ctx, req)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s %s (attempt %d): executed %d, skipped %d\n",
		first.RunID, first.Status, first.Attempt, first.Stats.Executed, first.Stats.Skipped)

	// A succeeded run is not run again unless forced; forced, every step
	// is answered from its checkpoint.
	req.Force = true
	second, err := r.Run(ctx, req)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s %s (attempt %d): executed %d, skipped %d\n",
		second.RunID, second.Status, second.Attempt, second.Stats.Executed, second.Stats.Skipped)
	// Output:
	// report/2026-11-28 succeeded (attempt 1): executed 4, skipped 0
	// report/2026-11-28 succeeded (attempt 2): executed 0, skipped 4
}
