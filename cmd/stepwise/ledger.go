package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/stores"
	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
)

// ledgerCmd groups the example ledger's commands.
type ledgerCmd struct {
	Seed  seedCmd  `cmd:"" help:"Create a reproducible example ledger: accounts and one business date's transfers."`
	Check checkCmd `cmd:"" help:"Audit a settled date independently of the checkpoints (reads only; creates no file): exits 1 naming any wrong account or a total that overflows int64, 2 for a missing ledger, a date it was never seeded for, or a date seeded next to one that was still unsettled (no snapshot to compare with). Dates may be seeded and settled in any calendar order, one at a time: a date is compared with the opening balances of the date seeded after it, or the current ones. A date settled with -p partitions=N (N > 1) is checked against the outcomes its run recorded, as its guards saw commit order, not ID order."`
}

// openLedger opens the ledger, defaulting to the checkpoint database: a
// PostgreSQL database (which must exist) or a SQLite file. With mustExist
// (commands that only read) a missing file is not created but is a usage
// error naming its absolute path. It returns the ledger's name for
// messages (a URL without its password).
func openLedger(ctx context.Context, env *cmd.Env, loc string, mustExist bool) (*sql.DB, string, error) {
	flag := "--ledger"
	if loc == "" {
		loc, flag = env.Globals.DB, "--db"
	}
	if stores.IsURL(loc) {
		db, err := stores.OpenDB(ctx, loc, stores.Settings{})
		return db, stores.Redact(loc), err
	}
	path := loc
	db, err := stores.OpenDB(ctx, path, stores.Settings{BusyTimeout: env.Globals.BusyTimeout, MustExist: mustExist})
	if errors.Is(err, checkpoint.ErrNoDatabase) {
		err = cmd.UsageError(fmt.Errorf("ledger: %w; check %s, or create a ledger with `%s ledger seed`", err, flag, env.Name))
	}
	return db, path, err
}

// seedError classifies an error of settlement.Seed: what the user asked
// for is a usage error (exit 2), an interruption is resumable (exit 3),
// anything else (a full disk, say) a failure.
func seedError(ctx context.Context, what string, err error) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %s stopped; nothing of it was kept", runner.ErrInterrupted, what)
	case errors.Is(err, settlement.ErrBadInput), errors.Is(err, settlement.ErrAlreadySeeded), errors.Is(err, settlement.ErrUnsettled):
		return cmd.UsageError(err)
	}
	return err
}

type seedCmd struct {
	Ledger    string `help:"Ledger database: a SQLite file (created if missing) or a postgres:// URL (the database must exist). Defaults to the checkpoint database (--db), so effects land in the same store." type:"database"`
	Accounts  int    `default:"10000" help:"Number of accounts (created when the ledger has none)."`
	Transfers int    `default:"100000" help:"Number of transfers for the date."`
	Date      string `required:"" help:"Business date of the transfers, YYYY-MM-DD."`
	Seed      uint64 `default:"1" help:"Random seed: the same seed gives the same ledger."`
	Balance   int64  `default:"100000" help:"Opening balance of each new account, in minor units (cents)."`
	// AllowUnsettled seeds past a date that looks unsettled.
	AllowUnsettled bool   `help:"Seed even when the date seeded last looks unsettled (it has transfers and no balance has moved since it was seeded). Without it that is refused (exit 2): the new date's opening balances would not be the last date's closing ones, and ledger check of the last date would have nothing to compare with."`
	JSON           bool   `name:"json" help:"Print what was seeded as JSON: ledger, date, transfers, seed."`
	Progress       string `default:"auto" enum:"auto,bar,log,none" help:"Progress on stderr while the transfers are inserted: a live bar on a terminal, otherwise a log line every few seconds, and none with --json (auto); or forced. Log lines follow --log-format and --log-level."`
}

func (c *seedCmd) Run(env *cmd.Env) error {
	cfg := settlement.SeedConfig{Accounts: c.Accounts, Transfers: c.Transfers, Date: c.Date, Seed: c.Seed, Balance: c.Balance, AllowUnsettled: c.AllowUnsettled}
	if err := cfg.Validate(); err != nil {
		return cmd.UsageError(err) // before any file is created
	}
	db, path, err := openLedger(env.Ctx, env, c.Ledger, false)
	if err != nil {
		return err
	}
	defer db.Close()
	prog := newSeedProgress(env, c.Progress, c.JSON)
	err = settlement.SeedReporting(env.Ctx, db, cfg, prog.report())
	prog.close()
	if err := seedError(env.Ctx, "seeding", err); err != nil {
		return err
	}
	if c.JSON {
		b, _ := json.MarshalIndent(map[string]any{"ledger": path, "date": c.Date, "transfers": c.Transfers, "seed": c.Seed}, "", "  ")
		fmt.Fprintln(env.Stdout, string(b))
		return nil
	}
	fmt.Fprintf(env.Stdout, "seeded %s: %d transfers on %s (seed %d)\n", path, c.Transfers, c.Date, c.Seed)
	return nil
}

type checkCmd struct {
	Ledger string `help:"Ledger database: a SQLite file (it must exist) or a postgres:// URL. Defaults to the checkpoint database (--db)." type:"database"`
	Date   string `required:"" help:"Business date to audit, YYYY-MM-DD."`
	JSON   bool   `name:"json" help:"Print the report as JSON."`
}

// errLedgerWrong is returned when ledger check finds a wrong balance.
var errLedgerWrong = errors.New("ledger check failed")

func (c *checkCmd) Run(env *cmd.Env) error {
	db, _, err := openLedger(env.Ctx, env, c.Ledger, true)
	if err != nil {
		return err
	}
	defer db.Close()
	var rep settlement.Report
	if outcome := partitionedOutcomes(env, c.Date); outcome != nil {
		rep, err = settlement.CheckRecorded(env.Ctx, db, c.Date, outcome)
	} else {
		rep, err = settlement.Check(env.Ctx, db, c.Date)
	}
	if errors.Is(err, settlement.ErrBadInput) || errors.Is(err, settlement.ErrNoSnapshot) {
		return cmd.UsageError(fmt.Errorf("%w%s", err, elsewhereHint(env, c.Date, c.Ledger)))
	}
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
		return fmt.Errorf("%w: %d accounts wrong, total off by %s%s", errLedgerWrong, len(rep.Mismatches), rep.Difference(), elsewhereHint(env, c.Date, c.Ledger))
	}
	return nil
}

// elsewhereHint returns "; DATE was settled into the ledger L: check it
// with --ledger L" when the checkpoint store (--db) holds date's settle run
// and its ledger parameter names another ledger than the one checked
// (ledger: the --ledger flag, "" for the checkpoint database); else "".
func elsewhereHint(env *cmd.Env, date, ledger string) string {
	st, err := env.ExistingStore()
	if err != nil {
		return ""
	}
	info, err := st.Run(env.Ctx, jobs.RunID(settlement.Job.Name(), date))
	if err != nil {
		return ""
	}
	var p struct {
		Ledger string `json:"ledger"`
	}
	if json.Unmarshal(info.Run.Params, &p) != nil || p.Ledger == "" || p.Ledger == ledger {
		return ""
	}
	return fmt.Sprintf("; %s was settled into the ledger %s: check it with `%s ledger check --date %s --ledger %s`",
		date, stores.Redact(p.Ledger), env.Name, date, stores.Redact(p.Ledger))
}

// partitionedOutcomes returns the recorded outcome of every transfer of
// date's settle run when its post step ran in more than one partition
// (their guards saw commit order, so the ID-order replay of Check does
// not apply), or nil: no such run in the checkpoint store (--db), one
// partition, or no checkpoint store to read.
func partitionedOutcomes(env *cmd.Env, date string) map[string]string {
	st, err := env.ExistingStore()
	if err != nil {
		return nil
	}
	runID := jobs.RunID(settlement.Job.Name(), date)
	parts, err := st.Partitions(env.Ctx, runID, "post")
	if err != nil || len(parts) < 2 {
		return nil
	}
	outcome := map[string]string{}
	err = st.Items(env.Ctx, checkpoint.ItemQuery{RunID: runID, Step: "post"}, func(it checkpoint.Item) error {
		outcome[it.Key] = it.Status
		return nil
	})
	if err != nil {
		return nil
	}
	return outcome
}
