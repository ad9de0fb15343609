package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/stores"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// The serve tests run `stepwise serve` in real processes: the test binary
// re-executed (as the crash tests do, see TestMain) with serveChildEnv set,
// which makes it the CLI with a schedule firing the crashy job every
// second. init, not TestMain, catches that, so TestMain stays as it is.
const (
	serveChildEnv = "STEPWISE_TEST_SERVE"      // "1": run the CLI with everySecond
	serveSideEnv  = "STEPWISE_TEST_SERVE_SIDE" // the crashy job's side file
)

func init() {
	if os.Getenv(serveChildEnv) != "1" {
		return
	}
	os.Args = append([]string{os.Args[0]}, crashtest.ChildArgs()...)
	Main(testRegistry(), Name("stepwise"), Schedules(everySecond(os.Getenv(serveSideEnv))))
}

// everySecond fires a one-step crashy run every second, one run per fire
// (its key is the fire time); missed fires all run, in order. Each run
// takes 200ms, so a SIGTERM often finds one running.
func everySecond(side string) runner.Schedule {
	return runner.Schedule{
		Name: "every-second", Job: "crashy", Spec: "* * * * * *", Location: time.UTC,
		Key:     func(f time.Time) map[string]string { return map[string]string{"key": f.UTC().Format(secondKey)} },
		Values:  map[string]string{"side": side, "steps": "1", "pace": "200ms"},
		Misfire: runner.MisfireRunAll, Overlap: runner.OverlapQueue,
	}
}

const secondKey = "20060102T150405"

var serveAddr = regexp.MustCompile(`/metrics on http://(127\.0\.0\.1:\d+)`)

// startServe starts `stepwise serve` on db in a new process.
func startServe(t *testing.T, db, side string, args ...string) *crashtest.Child {
	t.Helper()
	return startChild(t, []string{serveChildEnv + "=1", serveSideEnv + "=" + side},
		nil, append([]string{"--db", db, "--log-format", "json", "serve", "--grace", "5s"}, args...)...)
}

// stopServe sends SIGTERM and expects a clean exit.
func stopServe(t *testing.T, c *crashtest.Child) {
	t.Helper()
	if err := c.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.WantExit(c.Wait(), exited0)
	if !strings.Contains(c.Stdout(), "stepwise serve: stopped") {
		t.Errorf("serve did not report a clean stop:\n%s\nstderr:\n%s", c.Stdout(), c.Stderr())
	}
}

// waitRuns waits until the side file shows step/1 started for at least n
// runs.
func waitRuns(t *testing.T, c *crashtest.Child, side string, n int) {
	t.Helper()
	c.WaitFor(strconv.Itoa(n)+" runs", func() bool {
		return readSide(t, side).ran["step/1"] >= n
	})
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestServeRealProcess runs serve with a schedule firing every second,
// scrapes its /healthz and /metrics, stops it with SIGTERM, leaves it down
// for a while, restarts it, stops it again, and then reads the store: every
// second from the first fire to the last has exactly one run, succeeded in
// one attempt whose step ran once, the seconds of the downtime included.
func TestServeRealProcess(t *testing.T) {
	t.Parallel()
	db, side := testFiles(t)

	first := startServe(t, db, side, "--listen", "127.0.0.1:0")
	first.WaitFor("the listen address", func() bool { return serveAddr.MatchString(first.Stdout()) })
	addr := serveAddr.FindStringSubmatch(first.Stdout())[1]
	waitRuns(t, first, side, 3)

	code, body := httpGet(t, "http://"+addr+"/healthz")
	var health struct {
		Status    string `json:"status"`
		Schedules []struct {
			Name   string `json:"name"`
			Leader bool   `json:"leader"`
		} `json:"schedules"`
	}
	if err := json.Unmarshal([]byte(body), &health); err != nil || code != http.StatusOK || health.Status != "ok" ||
		len(health.Schedules) != 1 || !health.Schedules[0].Leader || health.Schedules[0].Name != "every-second" {
		t.Errorf("/healthz = %d %s (%v); want 200, ok, every-second led by this process", code, body, err)
	}
	code, body = httpGet(t, "http://"+addr+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d:\n%s", code, body)
	}
	checkMetrics(t, body)

	stopServe(t, first)
	stoppedAt := time.Now()
	// Down for two seconds: two or three fires are missed.
	time.Sleep(2 * time.Second)
	restartedAt := time.Now()
	second := startServe(t, db, side)
	st := openStore(t, db)
	var polled time.Time
	second.WaitFor("runs after the restart", func() bool {
		if time.Since(polled) < 20*time.Millisecond {
			return false
		}
		polled = time.Now()
		return latestRun(t, st).After(restartedAt.Add(2 * time.Second))
	})
	stopServe(t, second)

	runs, err := st.Runs(context.Background(), checkpoint.RunFilter{Job: "crashy", Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	var fires []time.Time
	for _, r := range runs {
		at, err := time.Parse(secondKey, r.RunKey)
		if err != nil {
			t.Fatalf("run %s: key %q is not a fire time", r.ID, r.RunKey)
		}
		fires = append(fires, at)
		info, err := st.Run(context.Background(), r.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != checkpoint.RunSucceeded || len(info.Attempts) != 1 {
			t.Errorf("run %s: %s in %d attempts; want succeeded in 1", r.ID, r.Status, len(info.Attempts))
		}
	}
	slices.SortFunc(fires, func(a, b time.Time) int { return a.Compare(b) })
	if len(fires) == 0 {
		t.Fatal("no runs")
	}
	firstFire, lastFire := fires[0], fires[len(fires)-1]
	if !firstFire.Before(stoppedAt.Add(-time.Second)) || !lastFire.After(restartedAt.Add(time.Second)) {
		t.Errorf("runs span %s to %s; want them to span the downtime %s to %s",
			firstFire.Format(time.TimeOnly), lastFire.Format(time.TimeOnly), stoppedAt.Format(time.TimeOnly), restartedAt.Format(time.TimeOnly))
	}
	for i := 1; i < len(fires); i++ {
		if gap := fires[i].Sub(fires[i-1]); gap != time.Second {
			t.Errorf("fires %s and %s are %s apart: a fire was lost or run twice", fires[i-1].Format(time.TimeOnly),
				fires[i].Format(time.TimeOnly), gap)
		}
	}
	if ran := readSide(t, side).ran["step/1"]; ran != len(fires) {
		t.Errorf("the job's step ran %d times for %d runs; want once per run", ran, len(fires))
	}
	all, err := st.Schedules(context.Background())
	if err != nil || len(all) != 1 {
		t.Fatalf("stored schedules = %+v (%v); want every-second", all, err)
	}
	if mark := all[0].LastFire; mark.Before(firstFire) || mark.After(lastFire) {
		t.Errorf("settle mark %s is outside the fires %s to %s", mark, firstFire, lastFire)
	}
	if all[0].LeaseOwner != "" {
		t.Errorf("schedule still leased by %s after a clean stop", all[0].LeaseOwner)
	}
	var out, errb bytes.Buffer
	if code := Execute(context.Background(), testRegistry(), []string{"--db", db, "schedules"}, &out, &errb, Schedules(everySecond(side))); code != ExitOK ||
		!strings.Contains(out.String(), "  last fire: "+all[0].LastFire.Format("Mon 2006-01-02 15:04:05 MST")+" (every fire up to it is settled)\n") {
		t.Errorf("schedules after serving: exit %d, output:\n%s%s", code, out.String(), errb.String())
	}
	t.Logf("%d fires from %s to %s; down from %s to %s", len(fires), firstFire.Format(time.TimeOnly),
		lastFire.Format(time.TimeOnly), stoppedAt.Format(time.TimeOnly), restartedAt.Format(time.TimeOnly))
}

// latestRun returns the fire time of the latest succeeded run in the store.
func latestRun(t *testing.T, st checkpoint.Store) time.Time {
	t.Helper()
	runs, err := st.Runs(context.Background(), checkpoint.RunFilter{Job: "crashy", Status: checkpoint.RunSucceeded, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) == 0 {
		return time.Time{}
	}
	at, err := time.Parse(secondKey, runs[0].RunKey)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// checkMetrics checks a /metrics scrape has every series serve promises,
// with the run and leader series counting what happened.
func checkMetrics(t *testing.T, body string) {
	t.Helper()
	for _, series := range []string{
		`stepwise_runs_started_total{job="crashy"}`,
		`stepwise_runs_succeeded_total{job="crashy"}`,
		`stepwise_runs_failed_total{job="crashy"}`,
		`stepwise_runs_interrupted_total{job="crashy"}`,
		`stepwise_steps_executed_total{job="crashy"}`,
		`stepwise_steps_skipped_total{job="crashy"}`,
		`stepwise_effects_applied_total{job="crashy"}`,
		`stepwise_cas_conflicts_total{job="crashy"}`,
		`stepwise_replans_total{job="crashy"}`,
		`stepwise_duplicate_fires_total{schedule="every-second"}`,
		`stepwise_misfires_skipped_total{reason="deadline",schedule="every-second"}`,
		`stepwise_misfires_skipped_total{reason="policy",schedule="every-second"}`,
		`stepwise_overlap_skipped_total{schedule="every-second"}`,
		`stepwise_lease_takeovers_total{kind="run"}`,
		`stepwise_lease_takeovers_total{kind="schedule"}`,
		`stepwise_schedule_lag_seconds{schedule="every-second"}`,
		`stepwise_schedule_leader{schedule="every-second"}`,
		`go_goroutines`,
	} {
		if !strings.Contains(body, "\n"+series+" ") {
			t.Errorf("/metrics has no series %s", series)
		}
	}
	value := func(series string) float64 {
		for line := range strings.SplitSeq(body, "\n") {
			if v, ok := strings.CutPrefix(line, series+" "); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("series %s: value %q: %v", series, v, err)
				}
				return f
			}
		}
		return -1
	}
	if v := value(`stepwise_runs_started_total{job="crashy"}`); v < 3 {
		t.Errorf("runs started = %v; want at least 3", v)
	}
	// Three runs have started; the latest may still be in its step.
	if v := value(`stepwise_steps_executed_total{job="crashy"}`); v < 2 {
		t.Errorf("steps executed = %v; want at least 2", v)
	}
	if v := value(`stepwise_schedule_leader{schedule="every-second"}`); v != 1 {
		t.Errorf("leader = %v; want 1", v)
	}
}

// TestSchedulesCommand lists a New York schedule around the spring DST
// change, as text and as JSON.
func TestSchedulesCommand(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	nightly := runner.Schedule{Name: "settle-nightly", Job: "crashy", Spec: "30 2 * * *", Location: ny,
		Key:              runner.PreviousBusinessDate("key", runner.Weekdays),
		Values:           map[string]string{"side": "side.log"},
		StartingDeadline: 6 * time.Hour}
	db, _ := testFiles(t)
	run := func(args ...string) string {
		var out, errb bytes.Buffer
		code := Execute(context.Background(), testRegistry(), append([]string{"--db", db, "schedules"}, args...), &out, &errb, Schedules(nightly))
		if code != ExitOK {
			t.Fatalf("schedules %v: exit %d\n%s%s", args, code, out.String(), errb.String())
		}
		return out.String()
	}

	text := run("--from", "2026-03-06T12:00:00-05:00", "--next", "3")
	// schedules only reads: a missing SQLite file is not created.
	if stores.IsURL(db) {
		// A PostgreSQL database is never created; its schema was made.
	} else if _, err := os.Stat(db); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("schedules created the missing database %s (stat: %v)", db, err)
	}
	for _, want := range []string{
		`settle-nightly  job crashy  spec "30 2 * * *"  zone America/New_York`,
		"misfire run-once, starting deadline 6h0m0s, overlap forbid",
		"last fire: none yet",
		"Sat 2026-03-07 02:30:00 EST  key=2026-03-06 side=side.log\n",
		"Sun 2026-03-08 03:00:00 EDT  key=2026-03-06 side=side.log  [DST: 02:30:00 does not exist that day (clocks spring forward); fires at the change]  [clocks change: EST -> EDT]\n",
		"Mon 2026-03-09 02:30:00 EDT  key=2026-03-06 side=side.log\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("schedules output lacks %q:\n%s", want, text)
		}
	}

	var got struct {
		Schedules []struct {
			Name string `json:"name"`
			Zone string `json:"zone"`
			Next []struct {
				At     time.Time         `json:"at"`
				DST    string            `json:"dst"`
				Offset string            `json:"offset_change"`
				Params map[string]string `json:"params"`
			} `json:"next"`
		} `json:"schedules"`
	}
	if err := json.Unmarshal([]byte(run("--json", "--from", "2026-10-31T12:00:00Z", "--next", "2")), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Schedules) != 1 || len(got.Schedules[0].Next) != 2 {
		t.Fatalf("schedules --json = %+v; want one schedule with 2 fires", got)
	}
	// 01:30 is repeated on 1 November, 02:30 is not: no DST note, but the
	// offset changed since the previous listed time.
	n := got.Schedules[0].Next
	if !n[0].At.Equal(utc("2026-11-01T07:30:00Z")) || n[0].DST != "" || n[0].Offset != "EDT -> EST" ||
		n[0].Params["key"] != "2026-10-30" {
		t.Errorf("first fire = %+v; want 02:30 EST on 1 November settling 2026-10-30, offset EDT -> EST", n[0])
	}
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// TestServeWithoutTokensAnswersOnlyLoopbackHosts: a serve without
// --tokens reads anonymously, so a request addressed to any other Host (a
// page that pointed its own name at 127.0.0.1: DNS rebinding) is 421 on
// every path, the dashboard's, the API's, /metrics and /healthz.
func TestServeWithoutTokensAnswersOnlyLoopbackHosts(t *testing.T) {
	t.Parallel()
	db, side := testFiles(t)
	c := startServe(t, db, side, "--listen", "127.0.0.1:0")
	c.WaitFor("the listen address", func() bool { return serveAddr.MatchString(c.Stdout()) })
	addr := serveAddr.FindStringSubmatch(c.Stdout())[1]
	_, port, _ := strings.Cut(addr, ":")
	get := func(path, host string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s with Host %s: %v", path, host, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, path := range []string{"/", "/api/v1/runs", "/metrics", "/healthz", "/static/app.js"} {
		for _, host := range []string{addr, "localhost:" + port, "[::1]:" + port} {
			if code, body := get(path, host); code != http.StatusOK {
				t.Errorf("GET %s with Host %s: %d %.200s; want 200", path, host, code, body)
			}
		}
		code, body := get(path, "rebind.attacker.example:"+port)
		if code != http.StatusMisdirectedRequest || !strings.Contains(body, "DNS rebinding") {
			t.Errorf("GET %s with Host rebind.attacker.example: %d %.200s; want 421 naming DNS rebinding", path, code, body)
		}
	}
	stopServe(t, c)
}

func TestServeRefusesBadFlags(t *testing.T) {
	db, side := testFiles(t)
	for _, args := range [][]string{
		{"serve", "--grace", "30s"},     // not under STEPWISE_GRACE's 30s
		{"serve", "--listen", "nope:x"}, // not an address
	} {
		var out, errb bytes.Buffer
		code := Execute(context.Background(), testRegistry(), append([]string{"--db", db}, args...), &out, &errb, Schedules(everySecond(side)))
		if code != ExitUsage {
			t.Errorf("%v: exit %d; want %d\n%s%s", args, code, ExitUsage, out.String(), errb.String())
		}
	}
}

func TestServeRefusesAnOpenAPIAndBadTokens(t *testing.T) {
	db, side := testFiles(t)
	bad := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(bad, []byte("ops:operate:"+serveAliceToken+"\nci:write:"+serveBobToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--listen", "0.0.0.0:0"}, "--listen 0.0.0.0:0 is not a loopback address"},
		{[]string{"serve", "--listen", ":0"}, "give --tokens FILE"},
		{[]string{"serve", "--listen", "127.0.0.1:0", "--tokens", bad}, `line 2: role "write" of ci`},
	} {
		var out, errb bytes.Buffer
		code := Execute(context.Background(), testRegistry(), append([]string{"--db", db}, c.args...), &out, &errb, Schedules(everySecond(side)))
		if code != ExitUsage || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d saying %q", c.args, code, errb.String(), ExitUsage, c.want)
		}
		if _, err := os.Stat(db); err == nil {
			t.Errorf("%v: the refused serve created %s", c.args, db)
		}
	}
}
