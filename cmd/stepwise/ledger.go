package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/runner"
)

// ledgerCmd groups the example ledger's commands.
type ledgerCmd struct {
	Seed  seedCmd  `cmd:"" help:"Create a reproducible example ledger: accounts and one business date's transfers."`
	Check checkCmd `cmd:"" help:"Audit a settled date independently of the checkpoints; exits 1 naming any wrong account."`
}

// openLedger opens the ledger file, defaulting to the checkpoint database.
func openLedger(ctx context.Context, env *cmd.Env, path string) (*sql.DB, string, error) {
	if path == "" {
		path = env.Globals.DB
	}
	db, err := checkpoint.OpenTarget(ctx, checkpoint.Config{Path: path, BusyTimeout: env.Globals.BusyTimeout})
	return db, path, err
}

type seedCmd struct {
	Ledger    string `help:"Ledger database file. Defaults to the checkpoint database (--db), so effects land in the same store." type:"path"`
	Accounts  int    `default:"10000" help:"Number of accounts (created when the ledger has none)."`
	Transfers int    `default:"100000" help:"Number of transfers for the date."`
	Date      string `required:"" help:"Business date of the transfers, YYYY-MM-DD."`
	Seed      uint64 `default:"1" help:"Random seed: the same seed gives the same ledger."`
	Balance   int64  `default:"100000" help:"Opening balance of each new account, in minor units (cents)."`
}

func (c *seedCmd) Run(env *cmd.Env) error {
	db, path, err := openLedger(env.Ctx, env, c.Ledger)
	if err != nil {
		return err
	}
	defer db.Close()
	err = settlement.Seed(env.Ctx, db, settlement.SeedConfig{
		Accounts: c.Accounts, Transfers: c.Transfers, Date: c.Date, Seed: c.Seed, Balance: c.Balance,
	})
	if err != nil && env.Ctx.Err() != nil {
		return fmt.Errorf("%w: seeding stopped; nothing of it was kept", runner.ErrInterrupted)
	}
	if err != nil {
		return cmd.UsageError(err)
	}
	fmt.Fprintf(env.Stdout, "seeded %s: %d transfers on %s (seed %d)\n", path, c.Transfers, c.Date, c.Seed)
	return nil
}

type checkCmd struct {
	Ledger string `help:"Ledger database file. Defaults to the checkpoint database (--db)." type:"path"`
	Date   string `required:"" help:"Business date to audit, YYYY-MM-DD."`
	JSON   bool   `name:"json" help:"Print the report as JSON."`
}

// errLedgerWrong is returned when ledger check finds a wrong balance.
var errLedgerWrong = errors.New("ledger check failed")

func (c *checkCmd) Run(env *cmd.Env) error {
	db, _, err := openLedger(env.Ctx, env, c.Ledger)
	if err != nil {
		return err
	}
	defer db.Close()
	rep, err := settlement.Check(env.Ctx, db, c.Date)
	if err != nil {
		return err
	}
	if c.JSON {
		b, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Fprintln(env.Stdout, string(b))
	} else {
		fmt.Fprint(env.Stdout, rep)
	}
	if !rep.OK() {
		return fmt.Errorf("%w: %d accounts wrong, total off by %d", errLedgerWrong, len(rep.Mismatches), rep.Total-rep.OpeningTotal)
	}
	return nil
}
