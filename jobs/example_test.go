package jobs_test

import (
	"context"
	"fmt"
	"log"

	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// ReportParams are the parameters of the example report job. The key
// parameter names the run.
type ReportParams struct {
	Date   string `param:"date,key" format:"date" help:"business date, YYYY-MM-DD"`
	Orders int    `param:"orders" default:"20" help:"how many orders the day has"`
	Note   string `param:"note" help:"free text"`
}

func Example() {
	report := jobs.Define("report", func(ctx context.Context, run *steps.Run, p ReportParams) error {
		_, err := steps.Do(ctx, run, steps.ID("load"), func(ctx context.Context) (int, error) { return p.Orders, nil })
		return err
	}, jobs.Help("builds the daily report"))

	var registry jobs.Registry
	registry.MustRegister(report)

	// What `stepwise run report -p date=2026-11-28 -p note=eod` decodes.
	job, err := registry.Lookup("report")
	if err != nil {
		log.Fatal(err)
	}
	dec, err := job.Decode(map[string]string{"date": "2026-11-28", "note": "eod"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("run key:", dec.RunKey)
	fmt.Println("run ID: ", jobs.RunID(job.Name(), dec.RunKey))
	fmt.Println("params: ", string(dec.JSON))

	// The same parameters from a params file give the same bytes.
	fromFile, err := job.Decode(nil, []byte(`{"note": "eod", "orders": 20, "date": "2026-11-28"}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("same run:", fromFile.Hash == dec.Hash)

	_, err = job.Decode(map[string]string{"date": "28.11.2026"}, nil)
	fmt.Println(err)
	// Output:
	// run key: 2026-11-28
	// run ID:  report/2026-11-28
	// params:  {"date":"2026-11-28","orders":20,"note":"eod"}
	// same run: true
	// jobs: bad parameters: parameter "date" is "28.11.2026"; want a date as YYYY-MM-DD
}
