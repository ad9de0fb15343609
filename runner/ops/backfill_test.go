package ops_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
	"github.com/stepwise-run/stepwise/steps"
)

type dailyParams struct {
	Date string `param:"date,key" format:"date" help:"business date"`
}

type undatedParams struct {
	Ledger string `param:"ledger,key" help:"ledger"`
}

func day(s string) time.Time {
	d, err := time.Parse(time.DateOnly, s)
	if err != nil {
		panic(err)
	}
	return d
}

// The CLI and the API plan a backfill and run it through ops: dates
// without a run start, a succeeded date is skipped unless reprocessing
// all (then rerun, forced), and the pool runs each started date once.
func TestBackfillPlansAndRuns(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	var (
		mu  sync.Mutex
		ran []string
	)
	reg := &jobs.Registry{}
	reg.MustRegister(jobs.Define("daily", func(ctx context.Context, run *steps.Run, p dailyParams) error {
		_, err := steps.Do(ctx, run, "work", func(context.Context) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			ran = append(ran, p.Date)
			return p.Date, nil
		})
		return err
	}))
	reg.MustRegister(jobs.Define("undated", func(context.Context, *steps.Run, undatedParams) error { return nil }))
	r, err := runner.New(runner.Config{Store: st, Jobs: reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(ctx, runner.Request{Job: "daily", Values: map[string]string{"date": "2026-01-02"}}); err != nil {
		t.Fatal(err)
	}
	job, _ := reg.Lookup("daily")
	req := ops.BackfillRequest{Job: job, From: day("2026-01-01"), To: day("2026-01-03"), Reprocess: ops.ReprocessNone}
	plans, err := ops.PlanBackfill(ctx, st, req, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range plans {
		got = append(got, p.Date+" "+string(p.Action)+" "+p.Why)
	}
	if want := []string{"2026-01-01 start ", "2026-01-02 skip succeeded", "2026-01-03 start "}; !slices.Equal(got, want) {
		t.Errorf("plans = %q; want %q", got, want)
	}

	ran = nil
	var ends []string
	ops.RunBackfill(ctx, r, plans, 2, func(ops.BackfillPlan) runner.Request { return runner.Request{} },
		func(i int, res runner.Result, err error) {
			if err != nil || res.Status != checkpoint.RunSucceeded {
				t.Errorf("%s: %s, %v; want succeeded", plans[i].Date, res.Status, err)
			}
			ends = append(ends, res.RunID)
		})
	slices.Sort(ran)
	slices.Sort(ends)
	if want := []string{"2026-01-01", "2026-01-03"}; !slices.Equal(ran, want) {
		t.Errorf("ran %v; want %v (the succeeded date skipped)", ran, want)
	}
	if want := []string{"daily/2026-01-01", "daily/2026-01-03"}; !slices.Equal(ends, want) {
		t.Errorf("outcomes of %v; want %v", ends, want)
	}

	req.Reprocess = ops.ReprocessAll
	plans, err = ops.PlanBackfill(ctx, st, req, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plans {
		if p.Action != ops.BackfillRerun || !p.Force() || p.Existing != checkpoint.RunSucceeded {
			t.Errorf("%s with reprocess all: %+v; want a forced rerun of a succeeded run", p.Date, p)
		}
	}

	undated, _ := reg.Lookup("undated")
	for _, bad := range []ops.BackfillRequest{
		{Job: undated, From: day("2026-01-01"), To: day("2026-01-01")},
		{Job: job, From: day("2026-01-02"), To: day("2026-01-01")},
		{Job: job, From: day("2000-01-01"), To: day("2026-01-01")},
	} {
		if _, err := ops.PlanBackfill(ctx, st, bad, time.Now()); !errors.Is(err, ops.ErrBadBackfill) {
			t.Errorf("PlanBackfill(%s, %s..%s) = %v; want ErrBadBackfill", bad.Job.Name(), bad.From.Format(time.DateOnly), bad.To.Format(time.DateOnly), err)
		}
	}
}
