package cmd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Tokens of the serve tests' tokens files.
const (
	serveReadToken  = "9c1f4e7a2b8d05f3c6e9a1d4b7f20c5e"
	serveAliceToken = "3e8a1c6f9b2d47e0a5c8f1b4d7e2a9c6"
	serveBobToken   = "b5d2f8a1e4c7093b6e1f4a8d2c5b9e7f"
)

// writeTokens writes a tokens file of lines, 0600.
func writeTokens(t *testing.T, path string, lines ...string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

var metricsAddr = regexp.MustCompile(`/metrics also on http://(127\.0\.0\.1:\d+)`)

// request sends method path to addr with a bearer token (none if "") and
// more headers, within a few seconds.
func request(t *testing.T, method, url, token string, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestServeReloadsTokensOnHangup: kill -HUP makes a running serve read
// its tokens file again (a removed token and its dashboard session end at
// once, the counts logged) instead of killing it; a refused file (0644)
// keeps the tokens in use. With --tokens, /metrics needs a read token,
// and the loopback --metrics-listen serves it without one, Host-guarded.
func TestServeReloadsTokensOnHangup(t *testing.T) {
	t.Parallel()
	db, side := testFiles(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, tokens, "reader:read:"+serveReadToken, "alice:operate:"+serveAliceToken, "bob:operate:"+serveBobToken)
	c := startServe(t, db, side, "--listen", "127.0.0.1:0", "--tokens", tokens, "--metrics-listen", "127.0.0.1:0")
	c.WaitFor("the listen addresses", func() bool { return metricsAddr.MatchString(c.Stdout()) })
	base := "http://" + serveAddr.FindStringSubmatch(c.Stdout())[1]
	metrics := "http://" + metricsAddr.FindStringSubmatch(c.Stdout())[1]

	login, body := request(t, "POST", base+"/api/v1/login", "", `{"token":"`+serveBobToken+`"}`)
	cookie, _, _ := strings.Cut(login.Header.Get("Set-Cookie"), ";")
	if login.StatusCode != http.StatusOK || cookie == "" || strings.Contains(cookie, serveBobToken) {
		t.Fatalf("bob's login: %d %s, cookie %q", login.StatusCode, body, cookie)
	}
	if resp, body := request(t, "GET", base+"/api/v1/session", "", "", "Cookie", cookie); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"bob"`) {
		t.Fatalf("bob's session: %d %s", resp.StatusCode, body)
	}

	// /healthz on --listen answers anyone (a load balancer), whatever the
	// Host, but says only whether serve is up: the schedules are for
	// --metrics-listen (loopback) and the API.
	if resp, body := request(t, "GET", base+"/healthz", "", "", "Host", "evil.example"); resp.StatusCode != http.StatusOK ||
		strings.TrimSpace(body) != `{"status":"ok"}` {
		t.Errorf("GET /healthz with tokens, another Host: %d %s; want 200 and only the status", resp.StatusCode, body)
	}
	if resp, body := request(t, "GET", metrics+"/healthz", "", ""); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"schedules"`) {
		t.Errorf("GET --metrics-listen's /healthz: %d %s; want 200 with the schedules", resp.StatusCode, body)
	}

	// /metrics: a read token on --listen, none on --metrics-listen.
	request(t, "GET", base+"/api/v1/runs", "wrong-token-wrong-token-wrong-token", "")
	if resp, _ := request(t, "GET", base+"/metrics", "", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /metrics without a token: %d; want 401", resp.StatusCode)
	}
	if resp, body := request(t, "GET", base+"/metrics", serveReadToken, ""); resp.StatusCode != http.StatusOK ||
		!strings.Contains(body, `stepwise_http_auth_failures_total{reason="unknown_token"} 1`) {
		t.Errorf("GET /metrics with a read token: %d; want 200 counting the wrong token:\n%.3000s", resp.StatusCode, body)
	}
	if resp, body := request(t, "GET", metrics+"/metrics", "", ""); resp.StatusCode != http.StatusOK || !strings.Contains(body, "stepwise_http_auth_failures_total") {
		t.Errorf("GET --metrics-listen's /metrics: %d; want 200", resp.StatusCode)
	}
	if resp, _ := request(t, "GET", metrics+"/metrics", "", "", "Host", "rebind.attacker.example"); resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("GET --metrics-listen's /metrics with another Host: %d; want 421", resp.StatusCode)
	}

	// Bob leaves the file; SIGHUP.
	writeTokens(t, tokens, "reader:read:"+serveReadToken, "alice:operate:"+serveAliceToken)
	if err := c.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	c.WaitFor("the reload logged", func() bool {
		return strings.Contains(c.Stderr(), "tokens reloaded: 2 tokens, 1 removed, 1 sessions ended")
	})
	if resp, body := request(t, "GET", base+"/api/v1/runs", serveBobToken, ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("bob's token after the reload: %d %s; want 401", resp.StatusCode, body)
	}
	if resp, body := request(t, "GET", base+"/api/v1/session", "", "", "Cookie", cookie); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("bob's session after the reload: %d %s; want 401", resp.StatusCode, body)
	}
	if resp, body := request(t, "GET", base+"/api/v1/runs", serveAliceToken, ""); resp.StatusCode != http.StatusOK {
		t.Errorf("alice's token after the reload: %d %s; want 200", resp.StatusCode, body)
	}

	// A file others may read is refused: the tokens in use stay.
	writeTokens(t, tokens, "reader:read:"+serveReadToken)
	if err := os.Chmod(tokens, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	c.WaitFor("the refused reload logged", func() bool {
		return strings.Contains(c.Stderr(), "tokens not reloaded") && strings.Contains(c.Stderr(), "chmod 600")
	})
	if resp, body := request(t, "GET", base+"/api/v1/runs", serveAliceToken, ""); resp.StatusCode != http.StatusOK {
		t.Errorf("alice's token after a refused reload: %d %s; want 200", resp.StatusCode, body)
	}
	if strings.Contains(c.Stderr(), serveBobToken) || strings.Contains(c.Stderr(), serveAliceToken) {
		t.Error("serve's log shows a token")
	}
	stopServe(t, c)
}

// TestServeAnswersUnderAFloodOfIdleConnections: a serve limited to 256
// descriptors (as the was) holds 300 connections, most idle
// between keep-alive requests, the others never sending one, and answers
// a fresh authenticated request within a second: at its --max-conns cap
// it closes the longest-idle connection for the new one.
func TestServeAnswersUnderAFloodOfIdleConnections(t *testing.T) {
	t.Parallel()
	db, side := testFiles(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, tokens, "reader:read:"+serveReadToken)
	c := startWrappedChild(t, []string{"prlimit", "--nofile=256:256", "--"}, []string{serveChildEnv + "=1", serveSideEnv + "=" + side}, nil,
		"--db", db, "--log-format", "json", "serve", "--grace", "5s", "--listen", "127.0.0.1:0", "--tokens", tokens)
	c.WaitFor("the listen address", func() bool { return serveAddr.MatchString(c.Stdout()) })
	addr := serveAddr.FindStringSubmatch(c.Stdout())[1]

	var held []net.Conn
	defer func() {
		for _, nc := range held {
			nc.Close()
		}
	}()
	// 300 connections: two in three send one request and keep the
	// connection open after its answer (idle keep-alive), one in three
	// sends nothing.
	for i := range 300 {
		nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		held = append(held, nc)
		if i%3 != 2 {
			fmt.Fprintf(nc, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
		}
	}
	answered, deadline := 0, time.Now().Add(2*time.Second)
	for i, nc := range held {
		if i%3 == 2 {
			continue
		}
		nc.SetReadDeadline(deadline)
		// The server may have closed it already, for a newer one.
		if resp, err := http.ReadResponse(bufio.NewReader(nc), nil); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			answered++
		}
	}
	t.Logf("%d of 200 keep-alive requests answered before the fresh one", answered)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/api/v1/runs", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+serveReadToken)
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := fresh.Do(req)
	if err != nil {
		t.Fatalf("a fresh authenticated request with 300 connections held: %v; want it answered within 1s\nstderr:\n%s", err, c.Stderr())
	}
	defer resp.Body.Close()
	var runs map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&runs); resp.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("a fresh authenticated request with 300 connections held: %d, %v; want 200 with the runs", resp.StatusCode, err)
	}
	for _, nc := range held {
		nc.Close()
	}
	held = nil
	stopServe(t, c)
}

// Serve refuses, before opening the store, tokens files and flags that
// would weaken it, naming what to do.
func TestServeRefusesWeakTokensAndOpenMetrics(t *testing.T) {
	db, side := testFiles(t)
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	writeTokens(t, short, "ops:operate:0123456789abcdef")
	same := filepath.Join(dir, "same")
	writeTokens(t, same, "ops:operate:"+strings.Repeat("ab", 20))
	open := filepath.Join(dir, "open")
	writeTokens(t, open, "ops:operate:"+serveAliceToken)
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--listen", "127.0.0.1:0", "--tokens", short}, "the token of ops is 16 characters; use at least 32 random ones: make one with `openssl rand -hex 32`"},
		{[]string{"serve", "--listen", "127.0.0.1:0", "--tokens", same}, "the token of ops does not look random"},
		{[]string{"serve", "--listen", "127.0.0.1:0", "--tokens", open}, "has mode 0644: its group or others may read it"},
		{[]string{"serve", "--listen", "127.0.0.1:0", "--metrics-listen", "0.0.0.0:9091"}, "--metrics-listen 0.0.0.0:9091 is not a loopback address"},
		{[]string{"serve", "--listen", "127.0.0.1:0", "--trusted-proxy", "proxy.example"}, `--trusted-proxy "proxy.example" is neither a CIDR`},
		{[]string{"serve", "--listen", "127.0.0.1:0", "--max-conns", "0"}, "--max-conns 0: give at least 1"},
	} {
		var out, errb bytes.Buffer
		code := Execute(context.Background(), testRegistry(), append([]string{"--db", db}, c.args...), &out, &errb, Schedules(everySecond(side)))
		if code != ExitUsage || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d saying %q", c.args, code, errb.String(), ExitUsage, c.want)
		}
		if strings.Contains(errb.String(), serveAliceToken) || strings.Contains(errb.String(), "0123456789abcdef") {
			t.Errorf("%v: the refusal shows the token: %s", c.args, errb.String())
		}
	}
}
