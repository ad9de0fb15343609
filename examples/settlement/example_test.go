package settlement_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
)

// Seed a tiny ledger into the checkpoint database (the same store), settle
// the day through the runner, print the settlement summary, audit the
// ledger independently of the checkpoints, and settle the day again: every
// step replays from its checkpoint.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "settlement-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "stepwise.db")

	// A reproducible ledger: 5 accounts of 10.00, 12 transfers of up to 9.00.
	ledger, err := sqlite.OpenTarget(ctx, sqlite.Config{Path: path})
	if err != nil {
		log.Fatal(err)
	}
	defer ledger.Close()
	err = settlement.Seed(ctx, ledger, settlement.SeedConfig{Accounts: 5, Transfers: 12, Date: "2026-11-28", Seed: 1, Balance: 1000, MaxAmount: 900})
	if err != nil {
		log.Fatal(err)
	}

	st, err := sqlite.Open(ctx, sqlite.Config{Path: path})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	var reg jobs.Registry
	reg.MustRegister(settlement.Job)
	r, err := runner.New(runner.Config{Store: st, Jobs: &reg})
	if err != nil {
		log.Fatal(err)
	}
	res, err := r.Run(ctx, runner.Request{Job: "settle", Values: map[string]string{"date": "2026-11-28"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("run %s %s\n", res.RunID, res.Status)

	err = st.Steps(ctx, res.RunID, func(s checkpoint.Step) error {
		if s.ID != "summary" {
			return nil
		}
		sum, err := settlement.DecodeSummary(s.Output)
		fmt.Printf("settlement %s: %d transfers, %d posted (%d), %d rejected %v\n",
			sum.Date, sum.Transfers, sum.Posted, sum.PostedAmount, sum.Rejected, sum.RejectedIDs)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	rep, err := settlement.Check(ctx, ledger, "2026-11-28")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(rep)

	// Settling the day again replays every step from its checkpoint and
	// posts nothing twice.
	res, err = r.Run(ctx, runner.Request{Job: "settle", Values: map[string]string{"date": "2026-11-28"}, Force: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("forced rerun %s: %d steps executed, every one replayed from its checkpoint\n", res.Status, res.Stats.Executed)
	// Output:
	// run settle/2026-11-28 succeeded
	// settlement 2026-11-28: 12 transfers, 11 posted (3622), 1 rejected [T-2026-11-28-00000008]
	// ledger check 2026-11-28: 5 accounts, 12 transfers (11 posted, 1 rejected)
	//   replayed from 2026-11-28's opening balances, compared with the current balances
	//   money conserved: total 5000
	//   every account equals its opening balance plus posted incoming minus posted outgoing
	// forced rerun succeeded: 0 steps executed, every one replayed from its checkpoint
}
