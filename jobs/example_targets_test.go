package jobs_test

import (
	"context"
	"fmt"
	"log"

	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// SettleParams name a ledger database: a path or URL at the shell, a
// configured target's name over the HTTP API.
type SettleParams struct {
	Date   string `param:"date,key" format:"date" help:"business date"`
	Ledger string `param:"ledger" format:"database" help:"ledger database"`
}

// A request names the ledger by a target the operator configured: the run
// stores the name, and the job function sees the location the executing
// process configures for it.
func ExampleRequestValues() {
	settle := jobs.Define("settle", func(ctx context.Context, run *steps.Run, p SettleParams) error {
		fmt.Println("the job opens", p.Ledger)
		return nil
	})
	targets, err := jobs.NewTargets(map[string]string{"ledger": "/srv/stepwise/ledger.db"})
	if err != nil {
		log.Fatal(err)
	}

	_, err = jobs.RequestValues(settle, map[string]string{"date": "2026-11-28", "ledger": "../../etc/passwd"}, targets)
	fmt.Println(err)

	values, err := jobs.RequestValues(settle, map[string]string{"date": "2026-11-28", "ledger": "ledger"}, targets)
	if err != nil {
		log.Fatal(err)
	}
	dec, err := settle.Decode(values, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("stored:", string(dec.JSON))
	// What the runner does with its Config.Targets.
	if err := settle.Execute(jobs.WithTargets(context.Background(), targets), nil, dec.JSON); err != nil {
		log.Fatal(err)
	}
	// Output:
	// jobs: bad parameters: parameter "ledger" is a path with ..; over the API a parameter naming a file or a database is the name of a target the server's operator configured: give one of: ledger
	// stored: {"date":"2026-11-28","ledger":"target:ledger"}
	// the job opens /srv/stepwise/ledger.db
}
