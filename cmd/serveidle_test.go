package cmd

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

var idleServeAddr = regexp.MustCompile(`on http://(127\.0\.0\.1:\d+)`)

// TestServeWithoutSchedules: a program embedding the CLI with no
// schedules (cmd.Main(&reg) alone) still has serve, and it serves the
// API, the dashboard, /metrics and /healthz, and with --enqueue puts the
// API's runs in the queue for workers; --help lists serve but not
// schedules, and serve with nothing to serve says what to give it.
func TestServeWithoutSchedules(t *testing.T) {
	db, side := testFiles(t)
	var help, herr syncBuffer
	if code := Execute(context.Background(), testRegistry(), []string{"--help"}, &help, &herr); code != ExitOK {
		t.Fatalf("--help: exit %d: %s", code, herr.String())
	}
	if !strings.Contains(help.String(), "\n  serve ") || strings.Contains(help.String(), "\n  schedules ") {
		t.Errorf("--help of a program without schedules should list serve and not schedules:\n%s", help.String())
	}
	var nout, nerr syncBuffer
	if code := Execute(context.Background(), testRegistry(), []string{"--db", db, "serve"}, &nout, &nerr); code != ExitUsage ||
		!strings.Contains(nerr.String(), "defines no schedules, so serve has nothing to do without --listen ADDR") {
		t.Errorf("serve without --listen: exit %d, stderr %q; want %d naming --listen", code, nerr.String(), ExitUsage)
	}
	// cmd.Schedules() with none is the same program, not "Schedules is empty".
	nerr = syncBuffer{}
	if code := Execute(context.Background(), testRegistry(), []string{"--db", db, "serve"}, &nout, &nerr, Schedules()); code != ExitUsage ||
		!strings.Contains(nerr.String(), "defines no schedules") {
		t.Errorf("serve with cmd.Schedules(): exit %d, stderr %q; want %d naming --listen", code, nerr.String(), ExitUsage)
	}

	tokens := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, tokens, "alice:operate:"+serveAliceToken)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- Execute(ctx, testRegistry(), []string{"--db", db, "--log-format", "json", "serve",
			"--listen", "127.0.0.1:0", "--tokens", tokens, "--enqueue", "--grace", "2s"}, &out, &errb)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for !idleServeAddr.MatchString(out.String()) {
		select {
		case code := <-done:
			t.Fatalf("serve exited %d before listening:\n%s\n%s", code, out.String(), errb.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not print its address:\n%s\n%s", out.String(), errb.String())
		}
	}
	if !strings.Contains(out.String(), "no schedules to fire") {
		t.Errorf("serve's first line should say it fires no schedules: %q", out.String())
	}
	base := "http://" + idleServeAddr.FindStringSubmatch(out.String())[1]

	resp, body := request(t, "POST", base+"/api/v1/runs", serveAliceToken,
		`{"job":"crashy","params":{"key":"api-1","side":"`+side+`","steps":"1"}}`, "Content-Type", "application/json")
	if resp.StatusCode/100 != 2 {
		t.Fatalf("POST /api/v1/runs: %d %s", resp.StatusCode, body)
	}
	resp, body = request(t, "GET", base+"/api/v1/runs/crashy/api-1", serveAliceToken, "")
	var run struct {
		Run struct {
			Status string `json:"status"`
		} `json:"run"`
	}
	if err := json.Unmarshal([]byte(body), &run); err != nil || resp.StatusCode != http.StatusOK || run.Run.Status != "queued" {
		t.Errorf("GET the API's run: %d %s (%v); want it queued for workers", resp.StatusCode, body, err)
	}
	for path, want := range map[string]string{
		"/":            "crashy",
		"/metrics":     "go_goroutines",
		"/healthz":     `"status":"ok"`,
		"/api/v1/runs": `"crashy/api-1"`,
	} {
		resp, body := request(t, "GET", base+path, serveAliceToken, "")
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d, want 200 with %q:\n%.400s", path, resp.StatusCode, want, body)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != ExitOK || !strings.Contains(out.String(), "serve: stopped") {
			t.Errorf("serve stopped with exit %d:\n%s\n%s", code, out.String(), errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop when its context ended")
	}
}
