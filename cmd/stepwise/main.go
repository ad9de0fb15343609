// Command stepwise is the stock Stepwise binary, with the example jobs
// compiled in: settle (nightly settlement over a ledger, the main job) and
// report. Run `stepwise --help` for its commands, `stepwise demo` to see it
// work.
package main

import (
	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/examples/report"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
)

// registry holds the example jobs.
func registry() *jobs.Registry {
	var reg jobs.Registry
	reg.MustRegister(settlement.Job, report.Job)
	return &reg
}

// extraCommands are the stock binary's commands beyond the generic CLI.
func extraCommands() []cmd.Option {
	return []cmd.Option{
		cmd.Command("demo", "Seed a demo ledger (if absent) and settle a day on it, with progress; start here.", &demoCmd{}),
		cmd.Command("ledger", "The example ledger: seed one, or audit a settled day.", &ledgerCmd{}),
		scheduleCommands(), // serve, schedules: schedule.go
		cmd.Command("bench", "Measure per-step commits, chunked settlement, reruns and memory against raw SQL on the --db store (SQLite, or PostgreSQL for a postgres:// URL), side by side.", &benchCmd{}),
	}
}

func main() {
	opts := extraCommands()
	if self := invokedAs(); self != "" {
		// Under `go run` the binary is a temporary file: its hints name the
		// command that starts it again, so they can be pasted as printed.
		opts = append(opts, cmd.Name(self))
	}
	cmd.Main(registry(), opts...)
}
