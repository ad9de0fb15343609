package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/stepwise-run/stepwise/checkpoint/stores"
	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/cmd/internal/bench"
)

// benchCmd measures Stepwise against hand-written SQL on the store --db
// names, in the same run: SQLite (files in --dir, with the same pragmas)
// or, for a postgres:// URL, fresh schemas in that database. The absolute
// rates depend on the disk and the load; the ratios are what the goals
// (ANCHORS.md) are stated in. The workloads and raw baselines live in
// package bench.
type benchCmd struct {
	JSON  bool `name:"json" help:"Print the results as JSON."`
	Items int  `default:"200000" help:"Transfers settled by the chunked posting and rerun workloads (the goals are stated at 1000000)."`
	Steps int  `default:"2000" help:"Steps in each per-step workload."`
	// Accounts is fixed by the goals' workload; tests make it small.
	Accounts  int      `default:"10000" help:"Accounts in the benchmark ledger."`
	Claims    int      `default:"5000" help:"Runs claimed (and raw queue rows) per claimer count (1, 4, 16) by the claims workload, on each side (fewer make the 16-claimer ratio noisy: each side then runs for well under a second)."`
	Drain     int      `default:"5000" help:"Queued runs (and raw queue rows) drained per slot count by the drain workload, on each side, each as two fresh queues of half as many."`
	Slots     []int    `sep:"," default:"4,16,64" placeholder:"N" help:"Worker slot counts the drain workload measures, comma-separated (a stock PostgreSQL allows 100 connections: each slot takes one)."`
	Workloads []string `sep:"," placeholder:"NAME" help:"Workloads to run, comma-separated: steps, effects, chunked, claims, drain; all when omitted."`
	Dir       string   `help:"Directory for the temporary SQLite databases; defaults to the system's temporary directory. With a postgres:// --db the benchmark works in fresh schemas of that database, dropped at the end." type:"path"`
}

func (c *benchCmd) Run(env *cmd.Env) error {
	if c.Items < 1 || c.Steps < 1 || c.Accounts < 2 || c.Claims < 1 || c.Drain < 2 || slices.ContainsFunc(c.Slots, func(s int) bool { return s < 1 }) {
		return cmd.UsageError(fmt.Errorf("--items (%d), --steps (%d) and --claims (%d) must be at least 1, --drain (%d) and --accounts (%d) at least 2, every --slots (%v) at least 1",
			c.Items, c.Steps, c.Claims, c.Drain, c.Accounts, c.Slots))
	}
	cfg := bench.Config{Dir: c.Dir, Synchronous: env.Globals.Synchronous, Items: c.Items, Steps: c.Steps,
		Accounts: c.Accounts, Claims: c.Claims, Drain: c.Drain, Slots: c.Slots, Workloads: c.Workloads, Log: env.Stderr}
	if stores.IsURL(env.Globals.DB) {
		cfg.DB = env.Globals.DB
	}
	rep, err := bench.Run(env.Ctx, cfg)
	if errors.Is(err, bench.ErrBadConfig) {
		return cmd.UsageError(fmt.Errorf("%w; check --dir and --db", err))
	}
	if err != nil {
		return err
	}
	if c.JSON {
		out, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintln(env.Stdout, string(out))
		return nil
	}
	rep.Print(env.Stdout)
	return nil
}
