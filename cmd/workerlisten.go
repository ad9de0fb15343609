package cmd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/cmd/internal/httpapi"
	"github.com/stepwise-run/stepwise/runner"
)

// workerListenFlags are worker's flags of its /metrics and /healthz.
type workerListenFlags struct {
	Listen string `placeholder:"ADDR" help:"Serve Prometheus /metrics (the runs, steps and durations this worker executes) and /healthz on this address, e.g. 127.0.0.1:9092 (port 0 picks a free one; the address is printed). As serve's --listen: an address other than loopback needs --tokens; without tokens only requests addressed to localhost, 127.0.0.1 or [::1] are answered (others 421)."`
	Tokens string `type:"existingfile" placeholder:"FILE" help:"Bearer tokens, as serve's --tokens (NAME:ROLE:TOKEN lines, chmod 600): with them /metrics on --listen needs a read token, and /healthz says only whether the worker is up. 'kill -HUP' reloads it."`
}

// check checks the flags before anything is opened; the tokens read, if
// any.
func (f workerListenFlags) check() (*httpapi.Tokens, error) {
	if f.Tokens != "" && f.Listen == "" {
		return nil, errors.New("--tokens guards --listen's /metrics: give --listen ADDR too, or drop --tokens")
	}
	if err := checkListen(f.Listen, f.Tokens); err != nil {
		return nil, err
	}
	if f.Tokens == "" {
		return nil, nil
	}
	t, err := httpapi.ReadTokens(f.Tokens)
	if err != nil {
		return nil, fmt.Errorf("--tokens: %w", err)
	}
	return t, nil
}

// workerMetrics are a worker's Prometheus registry and series.
type workerMetrics struct {
	reg     *prometheus.Registry
	metrics *runner.Metrics
}

// newWorkerMetrics makes the worker's series (none without --listen: no
// one could read them).
func (f workerListenFlags) newWorkerMetrics() (workerMetrics, error) {
	if f.Listen == "" {
		return workerMetrics{}, nil
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := runner.NewMetrics(reg)
	return workerMetrics{reg: reg, metrics: m}, err
}

// serve serves /metrics and /healthz on --listen until stop, with serve's
// rules (serveHTTP): a read token for /metrics when there are tokens,
// the Host guard when there are none. SIGHUP reloads the tokens. It
// returns where it listens, for the start line.
func (f workerListenFlags) serve(env *Env, st checkpoint.Backend, tokens *httpapi.Tokens, wm workerMetrics) (where string, stop func(), err error) {
	if f.Listen == "" {
		return "", func() {}, nil
	}
	// The API server is only the token check here: no API route is
	// mounted, so nothing is ever started through it.
	api, err := httpapi.New(httpapi.Config{Store: st, Jobs: env.Registry, Starter: noStarts{}, Tokens: tokens,
		Logger: env.Logger(), Now: env.now, NoTokensHint: "start the worker with --tokens FILE", Registerer: wm.reg})
	if err != nil {
		return "", nil, err
	}
	status := func() runner.SchedulerStatus { return runner.SchedulerStatus{Stopping: env.Ctx.Err() != nil} }
	srv, addr, err := serveHTTP(env, "worker", f.Listen, 16, status, wm.reg, api, nil)
	if err != nil {
		return "", nil, usageError{err}
	}
	stopHangup := onHangup(func() { _ = reloadTokens(env, f.Tokens, api) })
	return "; /metrics and /healthz on http://" + addr, func() {
		stopHangup()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(env.Ctx), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}, nil
}

// noStarts is the Starter of a worker's token check, which serves no API.
type noStarts struct{}

var errNoStarts = errors.New("a worker serves no API: start runs through serve or enqueue")

// Start implements httpapi.Starter; it is never called.
func (noStarts) Start(context.Context, runner.Request) (httpapi.Started, error) {
	return httpapi.Started{}, errNoStarts
}

// Resume implements httpapi.Starter; it is never called.
func (noStarts) Resume(context.Context, string, runner.Request) (httpapi.Started, error) {
	return httpapi.Started{}, errNoStarts
}

var _ httpapi.Starter = noStarts{}
