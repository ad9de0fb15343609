package jobs_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

type ledgerParams struct {
	Date   string `param:"date,key" format:"date"`
	Ledger string `param:"ledger"`
}

func limitNoop(context.Context, *steps.Run, ledgerParams) error { return nil }

func TestLimitKeys(t *testing.T) {
	byLedger := jobs.Define("settle", limitNoop, jobs.LimitBy(1, func(p ledgerParams) string { return p.Ledger }))
	whole := jobs.Define("report", limitNoop, jobs.Limit(3))
	free := jobs.Define("free", limitNoop)
	for _, c := range []struct {
		job    jobs.Job
		ledger string
		want   checkpoint.Limit
	}{
		{byLedger, "main", checkpoint.Limit{Key: "settle:main", Max: 1}},
		{byLedger, "", checkpoint.Limit{Key: "job:settle", Max: 1}}, // no resource key: the job's
		{whole, "main", checkpoint.Limit{Key: "job:report", Max: 3}},
		{free, "main", checkpoint.Limit{}},
	} {
		dec, err := c.job.Decode(map[string]string{"date": "2026-11-28", "ledger": c.ledger}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if dec.Limit != c.want {
			t.Errorf("%s with ledger %q: limit %+v; want %+v", c.job.Name(), c.ledger, dec.Limit, c.want)
		}
	}
	if got := whole.Settings().Limit; got != 3 {
		t.Errorf("Settings().Limit = %d; want 3", got)
	}
}

func TestLimitByOtherParamsPanics(t *testing.T) {
	defer func() {
		v := recover()
		if s, _ := v.(string); !strings.Contains(s, "LimitBy's function") {
			t.Fatalf("Define with a LimitBy of another type: panic %v; want one naming LimitBy's function", v)
		}
	}()
	jobs.Define("bad", limitNoop, jobs.LimitBy(1, func(p struct{ X int }) string { return "" }))
}
