package ops

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// StoreCollectorConfig configures NewStoreCollector.
type StoreCollectorConfig struct {
	// Store is the deployment's store, read at scrape time. Required.
	Store checkpoint.Backend
	// Jobs are job names reported even without a run (at 0 in every
	// status), e.g. the registered jobs, so an alert on them finds its
	// series from the start.
	Jobs []string
	// Timeout bounds one read of the store; past it the scrape reports
	// stepwise_store_up 0 and no store series. Defaults to 5s (under
	// Prometheus' default scrape timeout of 10s).
	Timeout time.Duration
	// MaxAge is how long one read serves the scrapes that follow it:
	// however many Prometheus servers scrape, the store is read at most
	// once per MaxAge. Defaults to 5s.
	MaxAge time.Duration
	// Now is the clock staleness is judged at when the store keeps none
	// (checkpoint.Inspector.StoreNow), and reads are aged by. Defaults to
	// time.Now.
	Now func() time.Time
}

// storeCollector is the prometheus.Collector of NewStoreCollector.
type storeCollector struct {
	cfg                         StoreCollectorConfig
	lastSuccess, runs, up, took *prometheus.Desc

	mu     sync.Mutex
	readAt time.Time // when the cached read was made; zero: none yet
	jobs   []JobRuns
	err    error
	dur    time.Duration
}

// NewStoreCollector returns a prometheus.Collector of what the store
// holds for the whole deployment, however many processes share it, read
// at scrape time (one CountJobRuns, at most once per MaxAge, under Timeout):
//
//	stepwise_job_last_success_timestamp_seconds{job}  unix time the job's latest succeeded run ended
//	stepwise_runs{job,status}                         runs in the store by status (running and stale apart)
//	stepwise_store_up                                 1 if the last read of the store succeeded, else 0
//	stepwise_store_read_duration_seconds              how long that read took
//
// The last-success gauge is what "settlement did not finish by 06:00"
// alerts read: time() - stepwise_job_last_success_timestamp_seconds{job="settle"}
// > 86400. A job that never succeeded has no series (alert on absent()).
func NewStoreCollector(cfg StoreCollectorConfig) (prometheus.Collector, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("ops: StoreCollectorConfig.Store is nil; give the store to read")
	case cfg.Timeout < 0 || cfg.MaxAge < 0:
		return nil, errors.New("ops: StoreCollectorConfig.Timeout and MaxAge cannot be negative")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.MaxAge == 0 {
		cfg.MaxAge = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &storeCollector{cfg: cfg,
		lastSuccess: prometheus.NewDesc("stepwise_job_last_success_timestamp_seconds",
			"Unix time at which the job's latest succeeded run ended, read from the store (every process's runs).", []string{"job"}, nil),
		runs: prometheus.NewDesc("stepwise_runs",
			"Runs in the store by job and status, read from the store; stale: marked running, but its lease expired or its runner is gone.",
			[]string{"job", "status"}, nil),
		up: prometheus.NewDesc("stepwise_store_up",
			"1 if the latest read of the store for these metrics succeeded within its timeout, else 0 (the store series are then left out).", nil, nil),
		took: prometheus.NewDesc("stepwise_store_read_duration_seconds",
			"How long the latest read of the store for these metrics took.", nil, nil),
	}, nil
}

// Describe implements prometheus.Collector.
func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.lastSuccess
	ch <- c.runs
	ch <- c.up
	ch <- c.took
}

// Collect implements prometheus.Collector: it reads the store unless a
// read younger than MaxAge is at hand.
func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := c.cfg.Now(); c.readAt.IsZero() || now.Sub(c.readAt) >= c.cfg.MaxAge || now.Before(c.readAt) {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
		c.jobs, c.err = CountJobRuns(ctx, c.cfg.Store, c.cfg.Jobs, Now(ctx, c.cfg.Store, now))
		c.dur = c.cfg.Now().Sub(now)
		cancel()
		c.readAt = now
	}
	ch <- prometheus.MustNewConstMetric(c.took, prometheus.GaugeValue, c.dur.Seconds())
	if c.err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	for _, j := range c.jobs {
		if !j.LastSuccess.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.lastSuccess, prometheus.GaugeValue, float64(j.LastSuccess.UnixNano())/1e9, j.Job)
		}
		for _, s := range RunStatuses {
			ch <- prometheus.MustNewConstMetric(c.runs, prometheus.GaugeValue, float64(j.ByStatus[s]), j.Job, s)
		}
	}
}
