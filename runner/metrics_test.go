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

// TestMetricsDurations runs a job on a fake clock whose steps take known
// times and checks the duration histograms: steps by their ID's name,
// replayed steps not observed.
func TestMetricsDurations(t *testing.T) {
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
	)
	wantHistogram(t, reg, stepHist, map[string]string{"job": "job", "step": "load"}, 1, 5)
	wantHistogram(t, reg, stepHist, map[string]string{"job": "job", "step": "post"}, 2, 5)
	wantHistogram(t, reg, attemptHist, map[string]string{"job": "job", "status": "succeeded"}, 1, 10)

	// A forced rerun replays every step: no step is observed again.
	clock.Advance(time.Hour)
	if _, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues, Force: true}); err != nil {
		t.Fatal(err)
	}
	wantHistogram(t, reg, stepHist, map[string]string{"job": "job", "step": "load"}, 1, 5)
	wantHistogram(t, reg, attemptHist, map[string]string{"job": "job", "status": "succeeded"}, 2, 10)
}

// counter is the value of a counter series of reg, or -1 without one.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	if m := series(t, reg, name, labels); m != nil {
		return m.GetCounter().GetValue()
	}
	return -1
}

// TestMetricsCountEveryWayARunExecutes counts the runs a runner executes
// however they were started, not only a scheduler's fires: Run, Claim
// and Execute (the API's start), Resume, and a Worker taking the queue.
// Each counts as started once and as ended by its status, with its steps;
// the job's counters exist at zero before any run.
func TestMetricsCountEveryWayARunExecutes(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	reg := prometheus.NewRegistry()
	m, err := runner.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error { return h.step(ctx, run, "one") }
	job := map[string]string{"job": "job"}
	r := h.runner(func(c *runner.Config) { c.Metrics = m })
	if got := counter(t, reg, "stepwise_runs_started_total", job); got != 0 {
		t.Fatalf("before any run, runs started = %v; want a series at 0", got)
	}
	ctx := context.Background()
	if _, err := r.Run(ctx, runner.Request{Job: "job", Values: map[string]string{"date": "2026-11-01"}}); err != nil {
		t.Fatal(err)
	}
	c, err := r.Claim(ctx, runner.Request{Job: "job", Values: map[string]string{"date": "2026-11-02"}, CreateOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Execute(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Resume(ctx, "job/2026-11-02", runner.Request{Force: true}); err != nil {
		t.Fatal(err)
	}
	enqueueDates(t, h, func(string) string { return "" }, "2026-11-03", "2026-11-04")
	done := make(chan runner.Result, 2)
	stop := startWorker(t, h, func(c *runner.WorkerConfig) {
		c.Runner.Metrics = m
		c.OnDone = func(res runner.Result, _ error) { done <- res }
	})
	for range 2 {
		select {
		case res := <-done:
			if res.Status != "succeeded" {
				t.Fatalf("a queued run ended %s", res.Status)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the worker did not end two queued runs within 30s")
		}
	}
	stop()
	for name, want := range map[string]float64{
		"stepwise_runs_started_total":   5,
		"stepwise_runs_succeeded_total": 5,
		"stepwise_runs_failed_total":    0,
		"stepwise_steps_executed_total": 4, // the forced resume replays
		"stepwise_steps_skipped_total":  1,
	} {
		if got := counter(t, reg, name, job); got != want {
			t.Errorf("%s = %v; want %v", name, got, want)
		}
	}
	if a := series(t, reg, "stepwise_attempt_duration_seconds", map[string]string{"job": "job", "status": "succeeded"}); a.GetHistogram().GetSampleCount() != 5 {
		t.Errorf("attempts observed: %v; want 5", a)
	}
}

// TestMetricsCountPartitionsWorked: a process that works a partition of
// another runner's run counts it as worked, and not as a run it started
// or ended; the run's owner counts the run.
func TestMetricsCountPartitionsWorked(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	gate, ownerIn := h.gatedPartitions(5)
	newMetrics := func() (*prometheus.Registry, *runner.Metrics) {
		reg := prometheus.NewRegistry()
		m, err := runner.NewMetrics(reg)
		if err != nil {
			t.Fatal(err)
		}
		return reg, m
	}
	ownerReg, ownerM := newMetrics()
	workerReg, workerM := newMetrics()
	owner := h.runner(func(c *runner.Config) { c.Owner, c.PartitionSlots, c.Metrics = "owner", 1, ownerM })
	ownerDone := make(chan error, 1)
	go func() {
		_, err := owner.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
		ownerDone <- err
	}()
	select {
	case <-ownerIn:
	case err := <-ownerDone:
		t.Fatalf("the owner ended before working its partition: %v", err)
	}
	w := h.runner(func(c *runner.Config) { c.Owner, c.Metrics = "worker", workerM })
	worked, err := w.WorkPartition(context.Background(), "")
	close(gate)
	if !worked || err != nil {
		t.Fatalf("WorkPartition = %v, %v; want partition 1 worked", worked, err)
	}
	if err := <-ownerDone; err != nil {
		t.Fatalf("owner: %v", err)
	}
	job := map[string]string{"job": "job"}
	for _, c := range []struct {
		reg  *prometheus.Registry
		name string
		want float64
	}{
		{workerReg, "stepwise_partitions_worked_total", 1},
		{workerReg, "stepwise_partitions_released_total", 0},
		{workerReg, "stepwise_runs_started_total", 0},
		{workerReg, "stepwise_runs_succeeded_total", 0},
		{ownerReg, "stepwise_partitions_worked_total", 0},
		{ownerReg, "stepwise_runs_started_total", 1},
		{ownerReg, "stepwise_runs_succeeded_total", 1},
	} {
		who := "worker"
		if c.reg == ownerReg {
			who = "owner"
		}
		if got := counter(t, c.reg, c.name, job); got != c.want {
			t.Errorf("%s: %s = %v; want %v", who, c.name, got, c.want)
		}
	}
}
