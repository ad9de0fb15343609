package runner_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// series finds the metric of family name whose labels include labels, or
// nil.
func series(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue metrics
				}
			}
			return m
		}
	}
	return nil
}

func wantHistogram(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string, count uint64, sum float64) {
	t.Helper()
	m := series(t, reg, name, labels)
	if m == nil {
		t.Errorf("no series %s%v", name, labels)
		return
	}
	if h := m.GetHistogram(); h.GetSampleCount() != count || h.GetSampleSum() != sum {
		t.Errorf("%s%v: count %d, sum %v; want %d, %v", name, labels, h.GetSampleCount(), h.GetSampleSum(), count, sum)
	}
}

// TestMetricsDurationsAndLastSuccess runs a job on a fake clock whose
// steps take known times and checks the duration histograms (steps by
// their ID's name, replayed steps not observed) and the last-success
// gauge, then seeds a fresh process's gauge from the store.
func TestMetricsDurationsAndLastSuccess(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	start := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	clock := &fakeClock{now: start}
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
		for _, s := range []struct {
			id   string
			took time.Duration
		}{{"load", 5 * time.Second}, {steps.ID("post", "A"), 2 * time.Second}, {steps.ID("post", "B"), 3 * time.Second}} {
			if _, err := steps.Do(ctx, run, s.id, func(context.Context) (int, error) { clock.Advance(s.took); return 1, nil }); err != nil {
				return err
			}
		}
		return nil
	}
	reg := prometheus.NewRegistry()
	m, err := runner.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	r := h.runner(func(c *runner.Config) { c.Clock, c.Metrics = clock, m })
	if _, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues}); err != nil {
		t.Fatal(err)
	}
	const (
		stepHist    = "stepwise_step_duration_seconds"
		attemptHist = "stepwise_attempt_duration_seconds"
		lastSuccess = "stepwise_job_last_success_timestamp_seconds"
	)
	wantHistogram(t, reg, stepHist, map[string]string{"job": "job", "step": "load"}, 1, 5)
	wantHistogram(t, reg, stepHist, map[string]string{"job": "job", "step": "post"}, 2, 5)
	wantHistogram(t, reg, attemptHist, map[string]string{"job": "job", "status": "succeeded"}, 1, 10)
	if g := series(t, reg, lastSuccess, map[string]string{"job": "job"}); g.GetGauge().GetValue() != float64(start.Add(10*time.Second).Unix()) {
		t.Errorf("last success = %v, want %d", g.GetGauge().GetValue(), start.Add(10*time.Second).Unix())
	}

	// A forced rerun replays every step: no step is observed again.
	clock.Advance(time.Hour)
	if _, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues, Force: true}); err != nil {
		t.Fatal(err)
	}
	wantHistogram(t, reg, stepHist, map[string]string{"job": "job", "step": "load"}, 1, 5)
	wantHistogram(t, reg, attemptHist, map[string]string{"job": "job", "status": "succeeded"}, 2, 10)
	finished := h.info().Run.FinishedAt
	if g := series(t, reg, lastSuccess, map[string]string{"job": "job"}); g.GetGauge().GetValue() != float64(finished.Unix()) {
		t.Errorf("last success after the rerun = %v, want %d", g.GetGauge().GetValue(), finished.Unix())
	}

	// A restarted process seeds the gauge from the store; a job that
	// never succeeded gets no series.
	reg2 := prometheus.NewRegistry()
	m2, err := runner.NewMetrics(reg2)
	if err != nil {
		t.Fatal(err)
	}
	if err := m2.LoadLastSuccess(context.Background(), h.st, []string{"job", "other"}); err != nil {
		t.Fatal(err)
	}
	if g := series(t, reg2, lastSuccess, map[string]string{"job": "job"}); g == nil || g.GetGauge().GetValue() != float64(finished.UnixNano())/1e9 {
		t.Errorf("seeded last success = %v, want %d", g, finished.Unix())
	}
	if g := series(t, reg2, lastSuccess, map[string]string{"job": "other"}); g != nil {
		t.Errorf("a job that never succeeded has last success %v", g)
	}
}
