package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/cmd/internal/httpapi"
	"github.com/stepwise-run/stepwise/cmd/internal/web"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
)

// ServeCmd runs the scheduler until SIGTERM or SIGINT.
type ServeCmd struct {
	Listen           string        `placeholder:"ADDR" help:"Serve the web dashboard (/), /healthz, Prometheus /metrics and the HTTP API (/api/v1/...) on this address, e.g. 127.0.0.1:9090 (port 0 picks a free one; the address is printed). An address other than loopback needs --tokens."`
	Tokens           string        `type:"existingfile" placeholder:"FILE" help:"Bearer tokens of the HTTP API, one NAME:ROLE:TOKEN a line (ROLE read or operate; TOKEN at least 32 random characters, e.g. from 'openssl rand -hex 32'); the file must not be readable by group or others (chmod 600). 'kill -HUP' reloads it: removed tokens and their sessions end at once. Without it the API and the dashboard serve reads only, only on loopback, and only to requests addressed to localhost, 127.0.0.1 or [::1] (others are 421: no other site can read them by DNS rebinding)."`
	Grace            time.Duration `default:"20s" help:"After SIGTERM or SIGINT, how long running runs may take to finish before they are interrupted, resumably: the next serve fires them again as missed fires (under the misfire policy), or resume them by hand. Keep it under STEPWISE_GRACE, after which the process exits anyway."`
	Lease            time.Duration `default:"30s" nonzero:"" help:"Lease length of the runs started and of the schedules fired; a standby serve takes a schedule over when its lease expires (at once if its owner ran on this host and is gone)."`
	MisfireThreshold time.Duration `name:"misfire-threshold" default:"1m" help:"How late a fire may be noticed and still count as on time; later ones follow the schedule's misfire policy."`
	Enqueue          bool          `help:"Queue each fire's run for a pool of workers ('${name} worker', on any host) instead of running it in this process; the fire is settled once its run is queued."`
	Queue            string        `default:"default" help:"With --enqueue: the queue the fires' runs go to."`
	targetFlags

	// The HTTP server's defences (servesec.go).
	ServeHTTPFlags

	schedules func() ([]runner.Schedule, error)
}

// Run implements the serve command.
func (c *ServeCmd) Run(env *Env) error {
	f, err := c.check()
	if err != nil {
		return usageError{err}
	}
	env.ownTargetCredentials = true // only the targets carry credentials
	env.lease = c.Lease
	st, err := env.DaemonStore()
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := runner.NewMetrics(reg)
	if err != nil {
		return err
	}
	if err := registerStoreMetrics(env, reg, st); err != nil {
		return err
	}
	sched, err := newFiring(runner.SchedulerConfig{
		Runner: runner.Config{Store: st, Jobs: env.Registry, Logger: env.Logger(), Lease: c.Lease,
			TracerProvider: env.tracing(false), Targets: f.targets},
		Schedules:        f.scheds,
		Grace:            c.Grace,
		MisfireThreshold: c.MisfireThreshold,
		Metrics:          metrics,
		Enqueue:          c.Enqueue,
		Queue:            c.Queue,
	})
	if err != nil {
		return usageError{err}
	}
	var served atomic.Pointer[httpapi.Server] // the API, once it serves
	stopHangup := onHangup(func() {
		api := served.Load()
		if api == nil {
			log := env.Logger()
			log.Warn().Msg("SIGHUP: serve has no --listen, so no tokens to reload; ignored")
			return
		}
		_ = reloadTokens(env, c.Tokens, api)
	})
	defer stopHangup()
	where := ""
	if c.MetricsListen != "" {
		msrv, maddr, err := serveMetrics(env, c.MetricsListen, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}),
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { healthz(w, sched.Status()) }))
		if err != nil {
			return usageError{err}
		}
		defer msrv.Close()
		where = "; /metrics also on http://" + maddr + " (no token, loopback only)"
	}
	if c.Listen != "" {
		addr, stop, err := c.serveAPI(env, st, f, sched, reg, metrics, &served)
		if err != nil {
			return err
		}
		defer stop()
		auth := "reads only: no --tokens"
		if f.tokens != nil {
			auth = fmt.Sprintf("%d tokens", f.tokens.Len())
		}
		where = "; /healthz and /metrics on http://" + addr + ", the API under /api/v1/ (" + auth + "), the dashboard at /" + where
	}
	if c.Enqueue {
		where += "; runs go to queue " + c.Queue + " for '" + env.Name + " worker'"
	}
	fmt.Fprintf(env.Stdout, "%s serve: %s from %s%s\n", env.Name, firingText(len(f.scheds)), env.storeName(), where)
	if err := sched.Run(env.Ctx); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s serve: stopped\n", env.Name)
	return nil
}

// serveFlags is what serve's flags give, once checked.
type serveFlags struct {
	scheds  []runner.Schedule
	tokens  *httpapi.Tokens
	proxies []netip.Prefix
	targets *jobs.Targets
}

// check checks serve's flags, each naming what is wrong, before anything is
// opened; with no schedules and nothing to listen on, serve has nothing to
// do.
func (c *ServeCmd) check() (f serveFlags, err error) {
	if f.scheds, err = c.schedules(); err != nil {
		return f, err
	}
	if err := checkGrace(c.Grace); err != nil {
		return f, err
	}
	if c.Tokens != "" {
		if f.tokens, err = httpapi.ReadTokens(c.Tokens); err != nil {
			return f, fmt.Errorf("--tokens: %w", err)
		}
	}
	if err := c.checkServeHTTPFlags(); err != nil {
		return f, err
	}
	if f.proxies, err = trustedProxies(c.TrustedProxy); err != nil {
		return f, err
	}
	if f.targets, err = c.targets(); err != nil {
		return f, err
	}
	if len(f.scheds) == 0 && c.Listen == "" && c.MetricsListen == "" {
		return f, errNothingToServe
	}
	return f, nil
}

// serveAPI serves the API and the dashboard (with /healthz and /metrics) on
// --listen, until stop: it returns the address it listens on, and stop,
// which shuts the server down and gives the runs the API started the grace
// the schedules' runs get.
func (c *ServeCmd) serveAPI(env *Env, st checkpoint.Backend, f serveFlags, sched firing, reg *prometheus.Registry,
	metrics *runner.Metrics, served *atomic.Pointer[httpapi.Server]) (addr string, stop func(), err error) {
	r, err := runner.New(runner.Config{Store: st, Jobs: env.Registry, Logger: env.Logger(), Lease: c.Lease,
		TracerProvider: env.tracing(false), Metrics: metrics, Targets: f.targets})
	if err != nil {
		return "", nil, usageError{err}
	}
	local := httpapi.NewLocal(r)
	// With --enqueue the API's new runs go to the workers too; an
	// operator's resume of one run is executed here.
	var starter httpapi.Starter = local
	if c.Enqueue {
		starter = &httpapi.Queued{Runner: r, Local: local, Queue: c.Queue}
	}
	api, err := httpapi.New(httpapi.Config{Store: st, Jobs: env.Registry, Starter: starter, Tokens: f.tokens, Targets: f.targets,
		Schedules: c.schedules, MisfireThreshold: c.MisfireThreshold, Logger: env.Logger(), Now: env.now,
		NoTokensHint: "start serve with --tokens FILE", SessionIdle: c.SessionIdle, SessionMax: c.SessionMax,
		SecureCookies: c.SecureCookies, TrustedProxies: f.proxies, Registerer: reg})
	if err != nil {
		return "", nil, err
	}
	dash, err := web.New(web.Config{Store: st, Auth: apiAuth{api}, API: httpapi.Prefix, Schedules: c.schedules,
		MisfireThreshold: c.MisfireThreshold, Logger: env.Logger(), Now: env.now})
	if err != nil {
		return "", nil, err
	}
	served.Store(api)
	srv, addr, err := serveHTTP(env, "serve", c.Listen, c.MaxConns, sched.Status, reg, api, func(mux *http.ServeMux) {
		mux.Handle(httpapi.Prefix, api)
		mux.Handle("/", dash)
	})
	if err != nil {
		return "", nil, usageError{err}
	}
	return addr, func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(env.Ctx), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		// The runs the API started get the grace the schedules' runs
		// get, then are interrupted (resumable).
		gctx, gcancel := context.WithTimeout(context.WithoutCancel(env.Ctx), c.Grace)
		defer gcancel()
		local.Shutdown(gctx)
	}, nil
}

// loopback reports whether a listen address is on loopback only:
// localhost or a loopback IP (an empty host listens on every interface).
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkGrace refuses a grace period Main's own would cut short: after the
// signal, Main ends the process once STEPWISE_GRACE has passed.
func checkGrace(grace time.Duration) error {
	process := 30 * time.Second
	if v := os.Getenv(GraceEnv); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			process = d
		}
	}
	if grace >= process {
		return fmt.Errorf("--grace %s is not under %s (%s), after which the process exits regardless; "+
			"lower --grace or raise %s", grace, GraceEnv, process, GraceEnv)
	}
	return nil
}

// serveHTTP serves /healthz, /metrics and what routes adds (serve's API
// and dashboard) on addr in the background for the command named what
// (serve, worker), and returns the server and the address it listens on.
// /metrics needs a read token when api has tokens. Without tokens
// (anonymous reads), only requests addressed to loopback or to the listen
// address are answered, on every path: others are 421, so a page that
// points its own name at this machine (DNS rebinding) reads nothing.
func serveHTTP(env *Env, what, addr string, maxConns int, status func() runner.SchedulerStatus, reg *prometheus.Registry,
	api *httpapi.Server, routes func(*http.ServeMux)) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("--listen %s: %w", addr, err)
	}
	tokenless := !api.HasTokens()
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", api.Auth(httpapi.RoleRead, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if tokenless {
			healthz(w, status())
			return
		}
		// Answered to anyone (a load balancer sends no token, and may
		// name any Host), so it says only whether the process is up:
		// the schedules are the API's, for a read token.
		healthzBrief(w, status())
	})
	if routes != nil {
		routes(mux)
	}
	var h http.Handler = mux
	if tokenless {
		h = httpapi.GuardHost(mux, addr, ln.Addr().String())
	}
	srv, lln := newHTTPServer(h, ln, maxConns)
	go func() {
		if err := srv.Serve(lln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(env.Stderr, "%s %s: http: %v\n", env.Name, what, err)
		}
	}()
	return srv, ln.Addr().String(), nil
}

// healthView is the JSON body of /healthz.
type healthView struct {
	Status    string             `json:"status"` // ok, or stopping (503)
	Schedules []scheduleHealthVw `json:"schedules"`
}

type scheduleHealthVw struct {
	Name    string     `json:"name"`
	Job     string     `json:"job"`
	Leader  bool       `json:"leader"` // this process fires it
	Settled *time.Time `json:"settled,omitempty"`
	Next    *time.Time `json:"next,omitempty"`
	Running int        `json:"running"`
	Queued  int        `json:"queued"`
}

// healthzBrief is healthz without the schedules: {"status": "ok"} (200),
// or "stopping" (503).
func healthzBrief(w http.ResponseWriter, st runner.SchedulerStatus) {
	v, code := struct {
		Status string `json:"status"`
	}{"ok"}, http.StatusOK
	if st.Stopping {
		v.Status, code = "stopping", http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// healthz answers 200 while the scheduler fires and 503 once it is
// stopping, with what each schedule is doing.
func healthz(w http.ResponseWriter, st runner.SchedulerStatus) {
	v := healthView{Status: "ok", Schedules: []scheduleHealthVw{}}
	for _, s := range st.Schedules {
		v.Schedules = append(v.Schedules, scheduleHealthVw{Name: s.Name, Job: s.Job, Leader: s.Leader,
			Settled: optTime(s.Settled), Next: optTime(s.Next), Running: s.Running, Queued: s.Queued})
	}
	code := http.StatusOK
	if st.Stopping {
		v.Status, code = "stopping", http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}
