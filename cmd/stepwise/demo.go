package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// demoCmd seeds a demo ledger if needed and settles a day on it.
type demoCmd struct {
	Date      string `default:"2026-11-28" help:"Business date to seed (if absent) and settle."`
	Accounts  int    `default:"10000" help:"Accounts in a new demo ledger."`
	Transfers int    `default:"300000" help:"Transfers seeded for the date when it has none."`
	// Pace slows posting for the crash drills.
	Pace time.Duration `placeholder:"DURATION" help:"Wait this long after each posted chunk of 1000 transfers, so a Ctrl-C or kill -9 lands while it posts (the README's drills use 20ms: about 6s more for 300,000 transfers); 0 posts at full speed."`
}

func (c *demoCmd) Run(env *cmd.Env) error {
	ctx := env.Ctx
	cfg := settlement.SeedConfig{Accounts: c.Accounts, Transfers: c.Transfers, Date: c.Date, Seed: 1, Balance: 100000, MaxAmount: 10000}
	if err := cfg.Validate(); err != nil {
		return cmd.UsageError(err) // bad input: exit 2, before any file is created
	}
	db, path, err := openLedger(ctx, env, "", false)
	if err != nil {
		return err
	}
	prog := newSeedProgress(env, "auto", false)
	err = settlement.SeedReporting(ctx, db, cfg, prog.report())
	prog.close()
	db.Close()
	switch {
	case err == nil:
		fmt.Fprintf(env.Stdout, "seeded a demo ledger in %s: %d transfers on %s\n", path, c.Transfers, c.Date)
	case errors.Is(err, settlement.ErrAlreadySeeded) && ctx.Err() == nil:
		fmt.Fprintf(env.Stdout, "the ledger in %s already has %s's transfers\n", path, c.Date)
	default:
		return seedError(ctx, "seeding "+c.Date, err)
	}
	fmt.Fprintf(env.Stdout, "settling %s (press Ctrl-C to interrupt; run the same command again to resume)\n", c.Date)
	var opts []cmd.RunOption
	if c.Pace > 0 {
		opts = append(opts, cmd.AfterEachChunk(pace(ctx, c.Pace)))
	}
	res, err := env.RunJob(runner.Request{Job: settlement.Job.Name(), Values: map[string]string{"date": c.Date}}, 30*time.Second, opts...)
	if err != nil && !errors.Is(err, checkpoint.ErrAlreadySucceeded) {
		return err
	}
	runID := "settle/" + c.Date
	if res.RunID != "" {
		runID = res.RunID
	}
	if err := printSummary(ctx, env, runID); err != nil {
		return err
	}
	self := env.Name
	next := c.nextDate()
	fmt.Fprintf(env.Stdout, `
Try next:
  1. crash and rerun:  %[1]s demo --date %[2]s --pace 20ms
     press Ctrl-C (or kill -9 it) while it posts (--pace slows it down), then run the same command again:
     it resumes at the first unposted chunk and posts every transfer exactly once
  2. look inside:      %[1]s show %[3]s
  3. audit the ledger: %[1]s ledger check --date %[4]s
`, self, next, runID, c.Date)
	return nil
}

// pace waits d after each chunk of a batch step but its last, or until
// ctx ends (Ctrl-C: the run is then interrupted after that chunk).
func pace(ctx context.Context, d time.Duration) func(steps.Progress) {
	return func(p steps.Progress) {
		if p.Final || (p.Total > 0 && p.Done >= p.Total) {
			return
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
}

func (c *demoCmd) nextDate() string {
	d, err := time.Parse("2006-01-02", c.Date)
	if err != nil {
		return c.Date
	}
	return d.AddDate(0, 0, 1).Format("2006-01-02")
}

// printSummary prints the settlement summary recorded by the run.
func printSummary(ctx context.Context, env *cmd.Env, runID string) error {
	st, err := env.Store()
	if err != nil {
		return err
	}
	var found bool
	err = st.Steps(ctx, runID, func(s checkpoint.Step) error {
		if s.ID != "summary" || s.Status != checkpoint.StepCompleted {
			return nil
		}
		sum, err := settlement.DecodeSummary(s.Output)
		if err != nil {
			return err
		}
		found = true
		bad := ""
		if sum.BadAmount > 0 {
			bad = fmt.Sprintf(", %d for an amount that is not positive", sum.BadAmount)
		}
		fmt.Fprintf(env.Stdout, "\nsettlement %s: %d transfers, %d posted (%s), %d rejected for overdraft%s (%s)\n",
			sum.Date, sum.Transfers, sum.Posted, money(sum.PostedAmount), sum.Rejected-sum.BadAmount, bad, money(sum.RejectedAmount))
		if len(sum.RejectedIDs) > 0 {
			fmt.Fprintf(env.Stdout, "first rejected: %s\n", strings.Join(sum.RejectedIDs[:min(5, len(sum.RejectedIDs))], ", "))
		}
		return nil
	})
	if err == nil && !found {
		err = fmt.Errorf("run %s has no summary yet", runID)
	}
	return err
}

// money formats minor units as units with two decimals.
func money(minor int64) string {
	sign, u := "", uint64(minor)
	if minor < 0 {
		sign, u = "-", -u // two's complement: right even for math.MinInt64
	}
	return fmt.Sprintf("%s%d.%02d", sign, u/100, u%100)
}

// invokedAs is "go run ./cmd/stepwise" when this program runs under
// `go run` (a binary in the build cache), else "": then the program names
// itself after its os.Args[0] like any program built on cmd.Main.
func invokedAs() string {
	if strings.Contains(os.Args[0], "go-build") {
		return "go run ./cmd/stepwise"
	}
	return ""
}
