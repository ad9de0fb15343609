package cmd

import (
	"context"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/steps/crashtest"
)

var workerAddr = regexp.MustCompile(`/metrics and /healthz on http://(127\.0\.0\.1:\d+)`)

// scrape GETs addr's /metrics with token (none if "") and fails the test
// unless it is 200.
func scrape(t *testing.T, addr, token string) string {
	t.Helper()
	resp, body := request(t, "GET", "http://"+addr+"/metrics", token, "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/metrics: %d %s", addr, resp.StatusCode, body)
	}
	return body
}

// stopWorker sends SIGTERM and expects a clean exit.
func stopWorker(t *testing.T, c *crashtest.Child) {
	t.Helper()
	if err := c.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.WantExit(c.Wait(), exited0)
}

// TestWorkerRunShowsInEveryMetrics: a run started through serve's API
// under --enqueue and finished by a separate worker process moves serve's
// last-success gauge and its runs by status (read from the store), and is
// counted by the worker on its own --listen /metrics (not by serve, which
// did not execute it). The worker's --listen guards Host without tokens.
func TestWorkerRunShowsInEveryMetrics(t *testing.T) {
	t.Parallel()
	db, side := testFiles(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, tokens, "reader:read:"+serveReadToken, "alice:operate:"+serveAliceToken)
	serve := startChild(t, nil, nil, "--db", db, "--log-format", "json", "serve", "--listen", "127.0.0.1:0", "--tokens", tokens,
		"--enqueue", "--grace", "5s")
	serve.WaitFor("serve's address", func() bool { return serveAddr.MatchString(serve.Stdout()) })
	saddr := serveAddr.FindStringSubmatch(serve.Stdout())[1]
	const last = `stepwise_job_last_success_timestamp_seconds{job="crashy"}`
	body := scrape(t, saddr, serveReadToken)
	if v := metricValue(t, body, last); v != -1 {
		t.Fatalf("before any run, serve reports %s %v", last, v)
	}
	if v := metricValue(t, body, `stepwise_runs{job="crashy",status="succeeded"}`); v != 0 {
		t.Fatalf("before any run, serve reports %v succeeded runs of crashy; want a series at 0", v)
	}

	began := time.Now()
	resp, rbody := request(t, "POST", "http://"+saddr+"/api/v1/runs", serveAliceToken,
		`{"job":"crashy","params":{"key":"api-1","side":"`+side+`","steps":"2"}}`, "Content-Type", "application/json")
	if resp.StatusCode/100 != 2 || !strings.Contains(rbody, `"queued"`) {
		t.Fatalf("POST /api/v1/runs: %d %s; want it queued", resp.StatusCode, rbody)
	}
	worker := startChild(t, nil, nil, workerArgs(db, "10s", "--listen", "127.0.0.1:0")...)
	worker.WaitFor("the worker's address", func() bool { return workerAddr.MatchString(worker.Stdout()) })
	waddr := workerAddr.FindStringSubmatch(worker.Stdout())[1]

	// serve reads the store at most every 5s: wait for the success.
	var at float64
	serve.WaitFor("serve's last success of crashy", func() bool {
		body = scrape(t, saddr, serveReadToken)
		at = metricValue(t, body, last)
		return at > 0
	})
	if got := time.Unix(0, int64(at*1e9)); got.Before(began.Add(-time.Second)) || got.After(time.Now()) {
		t.Errorf("serve's last success %s is not between the start %s and now", got, began)
	}
	for series, want := range map[string]float64{
		`stepwise_runs{job="crashy",status="succeeded"}`: 1,
		`stepwise_runs{job="crashy",status="queued"}`:    0,
		`stepwise_runs{job="crashy",status="stale"}`:     0,
		`stepwise_runs_succeeded_total{job="crashy"}`:    0, // serve executed nothing
		`stepwise_store_up`:                              1,
	} {
		if got := metricValue(t, body, series); got != want {
			t.Errorf("serve: %s = %v; want %v", series, got, want)
		}
	}

	wbody := scrape(t, waddr, "")
	for series, want := range map[string]float64{
		`stepwise_runs_started_total{job="crashy"}`:                                1,
		`stepwise_runs_succeeded_total{job="crashy"}`:                              1,
		`stepwise_steps_executed_total{job="crashy"}`:                              2,
		`stepwise_attempt_duration_seconds_count{job="crashy",status="succeeded"}`: 1,
		`stepwise_step_duration_seconds_count{job="crashy",step="step"}`:           2,
	} {
		if got := metricValue(t, wbody, series); got != want {
			t.Errorf("worker: %s = %v; want %v", series, got, want)
		}
	}
	if strings.Contains(wbody, "stepwise_runs{") || strings.Contains(wbody, "stepwise_job_last_success") {
		t.Errorf("the worker serves the store's gauges too (a sum over processes would count them twice):\n%.2000s", wbody)
	}
	if resp, _ := request(t, "GET", "http://"+waddr+"/metrics", "", "", "Host", "rebind.attacker.example"); resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("worker /metrics without tokens, another Host: %d; want 421", resp.StatusCode)
	}
	if resp, body := request(t, "GET", "http://"+waddr+"/healthz", "", ""); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"status":"ok"`) {
		t.Errorf("worker /healthz: %d %s; want 200 ok", resp.StatusCode, body)
	}
	stopWorker(t, worker)
	stopServe(t, serve)
}

// TestWorkerListenTokens: worker --listen with --tokens takes serve's
// rules: /metrics needs a read token (401 without, 200 with), /healthz
// answers anyone with the status only; an address other than loopback
// without --tokens, and --tokens without --listen, are refused at start.
func TestWorkerListenTokens(t *testing.T) {
	t.Parallel()
	db, _ := testFiles(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"worker", "--listen", ":0"}, "give --tokens FILE"},
		{[]string{"worker", "--tokens", filepath.Join("testdata", "nope")}, "--tokens"},
	} {
		var out, errb syncBuffer
		if code := Execute(context.Background(), testRegistry(), append([]string{"--db", db}, tc.args...), &out, &errb); code != ExitUsage ||
			!strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d naming %q", tc.args, code, errb.String(), ExitUsage, tc.want)
		}
	}
	tokens := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, tokens, "reader:read:"+serveReadToken)
	var out, errb syncBuffer
	if code := Execute(context.Background(), testRegistry(), []string{"--db", db, "worker", "--tokens", tokens}, &out, &errb); code != ExitUsage ||
		!strings.Contains(errb.String(), "give --listen ADDR too") {
		t.Errorf("--tokens without --listen: exit %d, stderr %q; want %d", code, errb.String(), ExitUsage)
	}

	worker := startChild(t, nil, nil, workerArgs(db, "10s", "--listen", "127.0.0.1:0", "--tokens", tokens)...)
	worker.WaitFor("the worker's address", func() bool { return workerAddr.MatchString(worker.Stdout()) })
	base := "http://" + workerAddr.FindStringSubmatch(worker.Stdout())[1]
	if resp, _ := request(t, "GET", base+"/metrics", "", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("worker /metrics without a token: %d; want 401", resp.StatusCode)
	}
	if resp, _ := request(t, "GET", base+"/metrics", "wrong-token-wrong-token-wrong-token", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("worker /metrics with a wrong token: %d; want 401", resp.StatusCode)
	}
	if resp, body := request(t, "GET", base+"/metrics", serveReadToken, "", "Host", "stepwise.internal:9092"); resp.StatusCode != http.StatusOK ||
		!strings.Contains(body, `stepwise_http_auth_failures_total{reason="unknown_token"} 1`) ||
		!strings.Contains(body, `stepwise_runs_started_total{job="crashy"} 0`) {
		t.Errorf("worker /metrics with a read token: %d; want 200 with the worker's counters:\n%.2000s", resp.StatusCode, body)
	}
	if resp, body := request(t, "GET", base+"/healthz", "", "", "Host", "lb.example"); resp.StatusCode != http.StatusOK ||
		strings.TrimSpace(body) != `{"status":"ok"}` {
		t.Errorf("worker /healthz with tokens: %d %s; want 200 and only the status", resp.StatusCode, body)
	}
	stopWorker(t, worker)
}
