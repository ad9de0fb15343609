package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/checkpoint/stores"
	"github.com/stepwise-run/stepwise/cmd/internal/httpapi"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// loadParams has one parameter of each resource format.
type loadParams struct {
	Date   string `param:"date,key" format:"date"`
	Ledger string `param:"ledger" format:"database" help:"ledger database"`
	Input  string `param:"input" format:"existingfile" help:"input file"`
	Out    string `param:"out" format:"path" help:"output file"`
}

// targetRegistry has load: a fee moved in the ledger's accounts (when a
// ledger is given), then a step recording the input and output paths the
// job function saw.
func targetRegistry() *jobs.Registry {
	var reg jobs.Registry
	reg.MustRegister(jobs.Define("load", func(ctx context.Context, run *steps.Run, p loadParams) error {
		if p.Ledger != "" {
			if _, err := steps.Apply(ctx, run, steps.ID("fee"), steps.Target{Location: p.Ledger, Table: accounts},
				func(ctx context.Context, e *steps.Effects) (int, error) {
					e.Add("a", -5)
					e.Add("b", 5)
					return 1, nil
				}); err != nil {
				return err
			}
		}
		_, err := steps.Do(ctx, run, steps.ID("seen"), func(ctx context.Context) (string, error) {
			return p.Input + "|" + p.Out, nil
		})
		return err
	}))
	return &reg
}

// feeOpening is the ledger the load tests open: a pays each run's fee.
var feeOpening = map[string]int64{"a": 100, "b": 0}

// feesPaid is the ledger after the fees of the given runs of load (by
// their run IDs), each moved once from a to b.
func feesPaid(runIDs ...string) checkpointtest.LedgerCheck {
	c := checkpointtest.LedgerCheck{Opening: feeOpening}
	for _, id := range runIDs {
		c.Applied = append(c.Applied, checkpointtest.Transfer{ID: id + "/fee", From: "a", To: "b", Amount: 5})
	}
	return c
}

// newTargetAPI starts a server running load on st, whose runs (in the
// server, or queued for workers) name targets.
func newTargetAPI(t *testing.T, st checkpoint.Backend, loc string, targets *jobs.Targets, queued bool) *testAPI {
	t.Helper()
	reg := targetRegistry()
	r, err := runner.New(runner.Config{Store: st, Jobs: reg, Targets: targets})
	if err != nil {
		t.Fatal(err)
	}
	a := &testAPI{t: t, st: st, loc: loc, ended: map[string]chan struct{}{}}
	a.local = httpapi.NewLocal(r)
	a.local.OnDone = func(res runner.Result, err error) { close(a.endOf(res.RunID)) }
	tokens, err := httpapi.ParseTokens([]byte("ops-alice:operate:" + operateToken + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	var starter httpapi.Starter = a.local
	if queued {
		starter = &httpapi.Queued{Runner: r, Local: a.local}
	}
	api, err := httpapi.New(httpapi.Config{Store: st, Jobs: reg, Starter: starter, Tokens: tokens, Targets: targets})
	if err != nil {
		t.Fatal(err)
	}
	a.srv = httptest.NewServer(api)
	t.Cleanup(func() {
		a.srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a.local.Shutdown(ctx)
	})
	return a
}

func mustTargets(t *testing.T, m map[string]string) *jobs.Targets {
	t.Helper()
	ts, err := jobs.NewTargets(m)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// A start over the API names files and databases only by the targets
// the operator configured: every URL, connection string, absolute path,
// path with .. and unknown name is 400 naming the configured targets, and
// a PostgreSQL server of the caller's choosing receives no connection at
// all. A configured name runs, resolved in the server, and the run
// stores the name, never the location.
func TestStartNamesOnlyConfiguredTargets(t *testing.T) {
	fake := pgtest.NewFakeServer(t)
	st, loc := checkpointtest.OpenNew(t)
	checkpointtest.CreateTable(t, loc, accounts, feeOpening)
	dir := t.TempDir()
	input := filepath.Join(dir, "in.csv")
	if err := os.WriteFile(input, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.csv")
	a := newTargetAPI(t, st, loc, mustTargets(t, map[string]string{"ledger": loc, "inputs": input, "report": out}), false)

	port := fake.Port()
	bad := []struct{ param, value, what string }{
		{"ledger", "postgres://stepwise@127.0.0.1:" + port + "/x", "is a URL"},
		{"ledger", "postgresql://stepwise@127.0.0.1:" + port + "/x?sslmode=disable", "is a URL"},
		{"ledger", "postgres:///x?host=127.0.0.1&port=" + port, "is a URL"},
		{"ledger", "host=127.0.0.1 port=" + port + " user=stepwise dbname=x", "is a connection string"},
		{"ledger", "target:postgres://stepwise@127.0.0.1:" + port + "/x", "is a URL"},
		{"ledger", "/etc/passwd", "is an absolute path"},
		{"ledger", "/no/such/file.db", "is an absolute path"},
		{"ledger", "../../../../etc/passwd", "is a path with .."},
		{"ledger", "..", "is a path with .."},
		{"ledger", "target:../x", "is a path with .."},
		{"ledger", "ledger.db", "is not a target name"},
		{"input", "/etc/passwd", "is an absolute path"},
		{"input", "../in.csv", "is a path with .."},
		{"out", "/tmp/stepwise-out.csv", "is an absolute path"},
		{"out", "sub/../../out.csv", "is a path with .."},
	}
	for _, c := range bad {
		got := a.do("POST", "/api/v1/runs", operateToken, start("load", "2026-11-28", c.param, c.value))
		expect(t, c.param+"="+c.value, got, http.StatusBadRequest, "bad_params", "params."+c.param)
		msg := got.str("error")
		if !strings.Contains(msg, c.what) || !strings.Contains(msg, "inputs, ledger, report") {
			t.Errorf("%s=%s refused with %q; want it to say it %s and name the configured targets", c.param, c.value, msg, c.what)
		}
		for _, leak := range []string{"exist", "SQLite", "refused", "dial", dir} {
			if strings.Contains(msg, leak) {
				t.Errorf("%s=%s refused with %q, which tells %q about the server", c.param, c.value, msg, leak)
			}
		}
	}
	// Not a string at all: refused by the parameter's type.
	for _, body := range []string{
		`{"job":"load","params":{"date":"2026-11-28","ledger":["postgres://stepwise@127.0.0.1:` + port + `/x"]}}`,
		`{"job":"load","params":{"date":"2026-11-28","ledger":{"host":"127.0.0.1","port":` + port + `}}}`,
		`{"job":"load","params":{"date":"2026-11-28","ledger":"\u002fetc/passwd"}}`,
	} {
		got := a.do("POST", "/api/v1/runs", operateToken, body)
		expect(t, body, got, http.StatusBadRequest, "bad_params", "params.ledger")
	}
	unknown := a.do("POST", "/api/v1/runs", operateToken, start("load", "2026-11-28", "ledger", "payroll"))
	expect(t, "an unknown target", unknown, http.StatusBadRequest, "bad_params", "params.ledger")
	if msg := unknown.str("error"); !strings.Contains(msg, `target "payroll"`) || !strings.Contains(msg, "configured: inputs, ledger, report") {
		t.Errorf("an unknown target refused with %q; want it named with the configured ones", msg)
	}
	if runs, err := a.st.Runs(context.Background(), checkpoint.RunFilter{}); err != nil || len(runs) != 0 {
		t.Fatalf("refused starts made runs %v (%v)", runs, err)
	}

	got := a.do("POST", "/api/v1/runs", operateToken, start("load", "2026-11-28", "ledger", "ledger", "input", "target:inputs", "out", "report"))
	expect(t, "configured targets", got, http.StatusCreated)
	a.wait("load/2026-11-28")
	info, err := a.st.Run(context.Background(), "load/2026-11-28")
	if err != nil {
		t.Fatal(err)
	}
	if info.Run.Status != checkpoint.RunSucceeded {
		t.Fatalf("the run is %s (%s); want succeeded", info.Run.Status, info.Run.Error)
	}
	want := `{"date":"2026-11-28","ledger":"target:ledger","input":"target:inputs","out":"target:report"}`
	if string(info.Run.Params) != want {
		t.Errorf("the run stores params %s; want %s (the names, never the locations)", info.Run.Params, want)
	}
	// The fee lands in the ledger the name resolves to.
	checkpointtest.CheckLedger(t, loc, accounts, feesPaid("load/2026-11-28"))
	view := a.do("GET", "/api/v1/runs/load/2026-11-28", operateToken, nil)
	var v struct {
		Params json.RawMessage `json:"params"`
		Steps  []struct {
			ID     string          `json:"id"`
			Output json.RawMessage `json:"output"`
		} `json:"steps"`
	}
	if err := json.Unmarshal([]byte(view.Raw), &v); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(v.Params), loc) || strings.Contains(string(v.Params), dir) {
		t.Errorf("the API shows params %s, with a location", v.Params)
	}
	var seen string
	for _, s := range v.Steps {
		if s.ID == "seen" {
			json.Unmarshal(s.Output, &seen)
		}
	}
	if seen != input+"|"+out {
		t.Errorf("the job saw input|out %q; want %q (resolved in the server)", seen, input+"|"+out)
	}
	if n, pws := fake.Seen(); n != 0 {
		t.Errorf("the caller's PostgreSQL server received %d connections (passwords %q); want none", n, pws)
	}
}

// A target database takes the password its configuration gives it and
// none other: with PGPASSWORD and a passfile set in the serving process
// (for the checkpoint store), a run over a configured target whose URL
// holds no password sends neither to its server, and its error names the
// target by its name.
func TestTargetTakesNoPasswordFromTheEnvironment(t *testing.T) {
	fake := pgtest.NewFakeServer(t)
	const envSecret, fileSecret = "env-secret-hunter2", "passfile-secret-hunter2"
	passfile := filepath.Join(t.TempDir(), "pgpass")
	if err := os.WriteFile(passfile, []byte("*:*:*:*:"+fileSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PGPASSWORD", envSecret)
	t.Setenv("PGPASSFILE", passfile)
	loc := checkpointtest.NewLocation(t)
	// As serve and worker open their store.
	st, err := stores.Open(context.Background(), loc, stores.Settings{CallerClock: true, OwnTargetCredentials: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	fakeURL := "postgres://stepwise@127.0.0.1:" + fake.Port() + "/ledger?sslmode=disable&connect_timeout=5"
	a := newTargetAPI(t, st, loc, mustTargets(t, map[string]string{"ledger": fakeURL}), false)

	got := a.do("POST", "/api/v1/runs", operateToken, start("load", "2026-11-28", "ledger", "ledger"))
	expect(t, "a configured target", got, http.StatusCreated)
	a.wait("load/2026-11-28")
	info, err := a.st.Run(context.Background(), "load/2026-11-28")
	if err != nil {
		t.Fatal(err)
	}
	n, pws := fake.Seen()
	if n == 0 {
		t.Fatalf("the target's server received no connection (run %s: %s); the test shows nothing", info.Run.Status, info.Run.Error)
	}
	for _, pw := range pws {
		if strings.Contains(pw, "hunter2") {
			t.Errorf("the target's server received the password %q, from the environment; want only the target's own (none)", pw)
		}
	}
	if info.Run.Status != checkpoint.RunFailed || !strings.Contains(info.Run.Error, `target "ledger"`) || strings.Contains(info.Run.Error, "postgres://") {
		t.Errorf("the run is %s with error %q; want failed, naming target \"ledger\" and not its URL", info.Run.Status, info.Run.Error)
	}
	if view := a.do("GET", "/api/v1/runs/load/2026-11-28", operateToken, nil); strings.Contains(view.Raw, "postgres://") {
		t.Errorf("the API's view of the run shows the target's URL:\n%s", view.Raw)
	}
}

// A run the API queues for workers (serve --enqueue) stores the target's
// name; a worker resolves it from its own configuration, and one that
// does not configure it refuses the run: failed, the error naming the
// target and the worker's names, not a crash.
func TestQueuedRunResolvesTargetOnWorker(t *testing.T) {
	st, loc := checkpointtest.OpenNew(t)
	checkpointtest.CreateTable(t, loc, accounts, feeOpening)
	a := newTargetAPI(t, st, loc, mustTargets(t, map[string]string{"ledger": loc}), true)

	queue := func(date string) {
		t.Helper()
		got := a.do("POST", "/api/v1/runs", operateToken, start("load", date, "ledger", "ledger"))
		expect(t, "queue "+date, got, http.StatusCreated)
		if got.str("status") != checkpoint.RunQueued {
			t.Fatalf("start answered %s; want queued", got.Raw)
		}
	}
	queue("2026-11-27")
	info, err := st.Run(context.Background(), "load/2026-11-27")
	if err != nil {
		t.Fatal(err)
	}
	if want := `"ledger":"target:ledger"`; !strings.Contains(string(info.Run.Params), want) {
		t.Fatalf("the queued run stores %s; want %s", info.Run.Params, want)
	}

	// A worker without the name takes the first run and refuses it.
	work(t, st, mustTargets(t, map[string]string{"other": "/srv/other.db"}), "load/2026-11-27")
	info, err = st.Run(context.Background(), "load/2026-11-27")
	if err != nil {
		t.Fatal(err)
	}
	if info.Run.Status != checkpoint.RunFailed || !strings.Contains(info.Run.Error, `target "ledger"`) ||
		!strings.Contains(info.Run.Error, "configured: other") {
		t.Fatalf("on a worker without the target the run is %s: %q; want failed naming target \"ledger\" and the worker's targets",
			info.Run.Status, info.Run.Error)
	}
	checkpointtest.CheckLedger(t, loc, accounts, feesPaid()) // the refused run moved nothing
	if t.Failed() {
		t.FailNow()
	}

	// A worker with the name (its own location for it) runs the next.
	queue("2026-11-28")
	work(t, st, mustTargets(t, map[string]string{"ledger": loc}), "load/2026-11-28")
	info, err = st.Run(context.Background(), "load/2026-11-28")
	if err != nil {
		t.Fatal(err)
	}
	if info.Run.Status != checkpoint.RunSucceeded {
		t.Fatalf("on a worker with the target the run is %s: %q; want succeeded", info.Run.Status, info.Run.Error)
	}
	// The worker posts into its own ledger target.
	checkpointtest.CheckLedger(t, loc, accounts, feesPaid("load/2026-11-28"))

	// The refused run, resumed over the API, runs in the server, which
	// resolves the stored name from its own targets.
	got := a.do("POST", "/api/v1/runs/load/2026-11-27/resume", operateToken, reason("the ledger worker is back"))
	expect(t, "resume the refused run", got, http.StatusOK)
	a.wait("load/2026-11-27")
	info, err = st.Run(context.Background(), "load/2026-11-27")
	if err != nil {
		t.Fatal(err)
	}
	if info.Run.Status != checkpoint.RunSucceeded || string(info.Run.Params) != `{"date":"2026-11-27","ledger":"target:ledger","input":"","out":""}` {
		t.Fatalf("resumed over the API the run is %s (%q) with params %s; want succeeded, still naming the target", info.Run.Status, info.Run.Error, info.Run.Params)
	}
	// The resumed run's fee lands too, the earlier one not again.
	checkpointtest.CheckLedger(t, loc, accounts, feesPaid("load/2026-11-28", "load/2026-11-27"))
}

// work runs a worker with targets on st until runID has ended.
func work(t *testing.T, st checkpoint.Backend, targets *jobs.Targets, runID string) {
	t.Helper()
	w, err := runner.NewWorker(runner.WorkerConfig{
		Runner: runner.Config{Store: st, Jobs: targetRegistry(), Targets: targets},
		Poll:   20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("worker: %v", err)
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		info, err := st.Run(context.Background(), runID)
		if err == nil && info.Run.Status != checkpoint.RunQueued && info.Run.Status != checkpoint.RunRunning {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the worker did not end %s within 30s", runID)
}
