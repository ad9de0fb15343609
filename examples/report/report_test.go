package report_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/examples/report"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
)

func TestReportIsTheSameAfterARerun(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(t.TempDir(), "s.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var reg jobs.Registry
	reg.MustRegister(report.Job)
	r, err := runner.New(runner.Config{Store: st, Jobs: &reg})
	if err != nil {
		t.Fatal(err)
	}
	req := runner.Request{Job: "report", Values: map[string]string{"date": "2026-11-28", "orders": "4"}}
	res, err := r.Run(ctx, req)
	if err != nil || res.Stats.Executed != 6 {
		t.Fatalf("first run: %+v, %v; want 6 steps (load, 4 prices, summary)", res, err)
	}
	summary := func() string {
		var out string
		st.Steps(ctx, "report/2026-11-28", func(s checkpoint.Step) error {
			if s.ID == "summary" {
				out = string(s.Output)
			}
			return nil
		})
		return out
	}
	first := summary()
	if !strings.Contains(first, `"orders":4`) {
		t.Fatalf("summary %s", first)
	}
	req.Force = true
	res, err = r.Run(ctx, req)
	if err != nil || res.Stats.Executed != 0 || res.Stats.Skipped != 6 || summary() != first {
		t.Fatalf("forced rerun: %+v, %v, summary %s (was %s)", res, err, summary(), first)
	}
	// Bad parameters name the field.
	_, err = r.Run(ctx, runner.Request{Job: "report", Values: map[string]string{"date": "2026-11-28", "orders": "0"}})
	if err == nil || !strings.Contains(err.Error(), `"orders"`) {
		t.Fatalf("orders=0: %v", err)
	}
	_, err = r.Run(ctx, runner.Request{Job: "report", Values: map[string]string{"date": "28/11/2026"}})
	if err == nil || !strings.Contains(err.Error(), "YYYY-MM-DD") {
		t.Fatalf("bad date: %v", err)
	}
}
