package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/cmd/internal/httpapi"
)

func TestAuth(t *testing.T) {
	a := newAPI(t)
	none := a.do("GET", "/api/v1/runs", "", nil)
	expect(t, "no token", none, http.StatusUnauthorized, "unauthenticated")
	if none.Header.Get("WWW-Authenticate") == "" {
		t.Error("401 without WWW-Authenticate")
	}
	expect(t, "wrong token", a.do("GET", "/api/v1/runs", "not-a-token-of-this-server", nil), http.StatusUnauthorized, "unauthenticated")
	expect(t, "a token one byte off", a.do("GET", "/api/v1/runs", readToken[:len(readToken)-1]+"X", nil), http.StatusUnauthorized)
	expect(t, "basic auth", a.do("GET", "/api/v1/runs", "", nil, "Authorization", "Basic eDp5"), http.StatusUnauthorized)
	expect(t, "read token reads", a.do("GET", "/api/v1/runs", readToken, nil), http.StatusOK)
	w := a.do("POST", "/api/v1/runs", readToken, start("report", "2026-11-28"))
	expect(t, "read token writes", w, http.StatusForbidden, "forbidden")
	if !strings.Contains(w.str("error"), "reader") {
		t.Errorf("403 says %q; want it to name the token", w.str("error"))
	}
	expect(t, "read token operates", a.do("POST", "/api/v1/runs/report/2026-11-28/abandon", readToken, reason("x")), http.StatusForbidden)
	expect(t, "no token operates", a.do("POST", "/api/v1/runs/report/2026-11-28/abandon", "", reason("x")), http.StatusUnauthorized)
	if runs, _ := a.st.Runs(context.Background(), checkpoint.RunFilter{}); len(runs) != 0 {
		t.Errorf("refused writes made %d runs", len(runs))
	}

	// Without tokens: reads, never writes.
	open := newAPI(t, func(c *httpapi.Config) { c.Tokens = nil; c.NoTokensHint = "start serve with --tokens FILE" })
	expect(t, "anonymous read", open.do("GET", "/api/v1/runs", "", nil), http.StatusOK)
	anon := open.do("POST", "/api/v1/runs", "", start("report", "2026-11-28"))
	expect(t, "anonymous write", anon, http.StatusUnauthorized, "unauthenticated")
	if !strings.Contains(anon.str("error"), "--tokens FILE") {
		t.Errorf("anonymous write refused with %q; want the hint", anon.str("error"))
	}
}

func TestParseTokensNamesTheBadLine(t *testing.T) {
	const good, good2 = "5f0c9a1e7b3d28c4f6a0e9b1d7c35a82", "c41e8b2f9d6a03e7b5c1f8a4d2e960b3"
	for _, c := range []struct{ file, want string }{
		{"a:read:" + good + "\nb:admin:" + good2 + "\n", "line 2: role \"admin\" of b"},
		{"# c\n\na:read:short\n", "line 3: the token of a is 5 characters; use at least 32 random ones: make one with `openssl rand -hex 32`"},
		{"a:read:0123456789abcdef\n", "the token of a is 16 characters"},
		{"a:read:" + strings.Repeat("ab", 20) + "\n", "the token of a does not look random"},
		{"a:read:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa0123456789\n", "does not look random"},
		{"a:read:passwordpassword1234567890Password!\n", "does not look random"},
		{"a:read:0123456789abcdefghijklmnopqrstuvwxyz\n", "does not look random"},
		{"a:read:" + strings.Repeat("0123456789abcdef", 2) + "\n", "does not look random (few distinct characters, a run repeated, or characters in sequence); make one with `openssl rand -hex 32`"},
		{"a:read\n", "line 1: want NAME:ROLE:TOKEN"},
		{"a:read:" + good + "\na:operate:" + good2 + "\n", "line 2: name a is already used on line 1"},
		{"a:read:" + good + "\nb:operate:" + good + "\n", "line 2: the token of b is the token of line 1"},
		{"# nothing\n", "no token"},
	} {
		_, err := httpapi.ParseTokens([]byte(c.file))
		if !errors.Is(err, httpapi.ErrBadTokens) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseTokens(%q) = %v; want ErrBadTokens saying %q", c.file, err, c.want)
		}
		for _, tok := range []string{good, good2, "0123456789abcdef", "ababab"} {
			if err != nil && strings.Contains(err.Error(), tok) {
				t.Errorf("the error shows a token: %v", err)
			}
		}
	}
	if _, err := httpapi.ParseTokens([]byte("a:read:" + good + "\nb:operate:" + good2 + "\n")); err != nil {
		t.Errorf("two good tokens refused: %v", err)
	}
}

// A tokens file its group or others may read is refused, as ssh refuses
// such a private key; at 0600 it is read.
func TestReadTokensRefusesAReadableFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("a:read:"+readToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := httpapi.ReadTokens(path); err != nil {
		t.Fatalf("a 0600 tokens file: %v", err)
	}
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o660} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		_, err := httpapi.ReadTokens(path)
		if !errors.Is(err, httpapi.ErrBadTokens) || !strings.Contains(err.Error(), fmt.Sprintf("mode %04o", mode)) ||
			!strings.Contains(err.Error(), "chmod 600 "+path) {
			t.Errorf("a %04o tokens file: %v; want it refused naming its mode and chmod 600", mode, err)
		}
	}
}

func TestCookieLoginAndCSRF(t *testing.T) {
	a := newAPI(t)
	expect(t, "login with a wrong token", a.do("POST", "/api/v1/login", "", map[string]any{"token": "nope"}), http.StatusUnauthorized, "unauthenticated", "token")
	expect(t, "cross-site login", a.do("POST", "/api/v1/login", "", map[string]any{"token": operateToken}, "Sec-Fetch-Site", "cross-site"),
		http.StatusForbidden, "cross_origin")
	login := a.do("POST", "/api/v1/login", "", map[string]any{"token": operateToken})
	expect(t, "login", login, http.StatusOK)
	csrf := login.str("csrf_token")
	if login.str("name") != "ops-alice" || len(csrf) != 64 {
		t.Fatalf("login answered %s", login.Raw)
	}
	setCookie := login.Header.Get("Set-Cookie")
	for _, want := range []string{httpapi.CookieName + "=", "HttpOnly", "SameSite=Strict", "Path=/"} {
		if !strings.Contains(setCookie, want) {
			t.Errorf("Set-Cookie %q lacks %s", setCookie, want)
		}
	}
	// The cookie holds a random session ID, never the token.
	cookie, _, _ := strings.Cut(setCookie, ";")
	if sid := strings.TrimPrefix(cookie, httpapi.CookieName+"="); len(sid) != 64 || strings.Contains(setCookie, operateToken) {
		t.Fatalf("Set-Cookie %q; want a 64-hex-digit session ID and not the token", setCookie)
	}
	expect(t, "the token as the cookie", a.do("GET", "/api/v1/runs", "", nil, "Cookie", httpapi.CookieName+"="+operateToken), http.StatusUnauthorized)
	expect(t, "cookie read", a.do("GET", "/api/v1/runs", "", nil, "Cookie", cookie), http.StatusOK)
	sess := a.do("GET", "/api/v1/session", "", nil, "Cookie", cookie)
	if sess.str("csrf_token") != csrf {
		t.Errorf("session answered %s; want the login's csrf token", sess.Raw)
	}
	expect(t, "cookie write without the CSRF header", a.do("POST", "/api/v1/runs", "", start("report", "2026-11-28"), "Cookie", cookie),
		http.StatusForbidden, "csrf")
	expect(t, "cookie write with a wrong CSRF header", a.do("POST", "/api/v1/runs", "", start("report", "2026-11-28"), "Cookie", cookie,
		httpapi.CSRFHeader, strings.Repeat("0", 64)), http.StatusForbidden, "csrf")
	expect(t, "cross-site cookie write with the header", a.do("POST", "/api/v1/runs", "", start("report", "2026-11-28"), "Cookie", cookie,
		httpapi.CSRFHeader, csrf, "Sec-Fetch-Site", "cross-site"), http.StatusForbidden, "cross_origin")
	expect(t, "cookie write from another origin", a.do("POST", "/api/v1/runs", "", start("report", "2026-11-28"), "Cookie", cookie,
		httpapi.CSRFHeader, csrf, "Origin", "https://evil.example"), http.StatusForbidden, "cross_origin")
	if runs, _ := a.st.Runs(context.Background(), checkpoint.RunFilter{}); len(runs) != 0 {
		t.Fatalf("refused cookie writes made %d runs", len(runs))
	}
	ok := a.do("POST", "/api/v1/runs", "", start("report", "2026-11-28"), "Cookie", cookie, httpapi.CSRFHeader, csrf, "Sec-Fetch-Site", "same-origin")
	expect(t, "same-origin cookie write", ok, http.StatusCreated)
	a.wait("report/2026-11-28")
	if audit := a.do("POST", "/api/v1/runs/report/2026-11-28/resume", "", reason("cookie op"), "Cookie", cookie, httpapi.CSRFHeader, csrf); audit.Status != 200 || audit.str("operator") != "ops-alice" {
		t.Errorf("cookie operation answered %s", audit.Raw)
	}
	// A bearer request needs no CSRF header: a browser never adds one.
	expect(t, "bearer write", a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-29")), http.StatusCreated)
	a.wait("report/2026-11-29")
	out := a.do("POST", "/api/v1/logout", "", nil)
	if out.Status != http.StatusNoContent || !strings.Contains(out.Header.Get("Set-Cookie"), "Max-Age=0") {
		t.Errorf("logout: %d, Set-Cookie %q", out.Status, out.Header.Get("Set-Cookie"))
	}
	// Logging a session out is a cookie write too: another site cannot.
	for _, c := range []struct {
		what string
		hdr  []string
		code string
	}{
		{"cookie logout without the CSRF header", []string{"Cookie", cookie}, "csrf"},
		{"cookie logout with a wrong CSRF header", []string{"Cookie", cookie, httpapi.CSRFHeader, strings.Repeat("0", 64)}, "csrf"},
		{"cross-site cookie logout with the header", []string{"Cookie", cookie, httpapi.CSRFHeader, csrf, "Sec-Fetch-Site", "cross-site"}, "cross_origin"},
	} {
		out := a.do("POST", "/api/v1/logout", "", nil, c.hdr...)
		expect(t, c.what, out, http.StatusForbidden, c.code)
		if sc := out.Header.Get("Set-Cookie"); sc != "" {
			t.Errorf("%s: Set-Cookie %q; want the session kept", c.what, sc)
		}
	}
	expect(t, "the session after refused logouts", a.do("GET", "/api/v1/runs", "", nil, "Cookie", cookie), http.StatusOK)
	out = a.do("POST", "/api/v1/logout", "", nil, "Cookie", cookie, httpapi.CSRFHeader, csrf, "Sec-Fetch-Site", "same-origin")
	if out.Status != http.StatusNoContent || !strings.Contains(out.Header.Get("Set-Cookie"), "Max-Age=0") {
		t.Errorf("same-origin cookie logout: %d, Set-Cookie %q", out.Status, out.Header.Get("Set-Cookie"))
	}
	// Logout ended the session on the server: the cookie, kept or stolen,
	// opens nothing.
	expect(t, "the cookie after logout", a.do("GET", "/api/v1/runs", "", nil, "Cookie", cookie), http.StatusUnauthorized, "unauthenticated")
}

func TestOversizedBodyIs413(t *testing.T) {
	a := newAPI(t, func(c *httpapi.Config) { c.MaxBody = 1024 })
	big := `{"job":"report","params":{"date":"2026-11-28","note":"` + strings.Repeat("x", 2000) + `"}}`
	expect(t, "oversized start", a.do("POST", "/api/v1/runs", operateToken, big), http.StatusRequestEntityTooLarge, "too_large")
	expect(t, "oversized operation", a.do("POST", "/api/v1/runs/report/2026-11-28/abandon", operateToken, `{"reason":"`+strings.Repeat("y", 2000)+`"}`),
		http.StatusRequestEntityTooLarge, "too_large")
}

// failingRuns is a real store whose Runs fails as a driver would, with
// SQL in the error.
type failingRuns struct{ checkpoint.Backend }

func (failingRuns) Runs(context.Context, checkpoint.RunFilter) ([]checkpoint.Run, error) {
	return nil, errors.New(`SQL logic error: no such column: lease_untill (SELECT id FROM runs WHERE lease_untill < ?)`)
}

func TestUnexpectedErrorsLeakNothing(t *testing.T) {
	var logged strings.Builder
	a := newAPI(t, func(c *httpapi.Config) {
		c.Store = failingRuns{c.Store}
		c.Logger = c.Logger.Output(&logged)
	})
	got := a.do("GET", "/api/v1/runs", readToken, nil)
	expect(t, "a failing store", got, http.StatusInternalServerError, "internal")
	id := got.str("request_id")
	if strings.Contains(got.Raw, "SELECT") || strings.Contains(got.Raw, "column") || strings.Contains(got.Raw, "goroutine") {
		t.Errorf("the answer leaks the error: %s", got.Raw)
	}
	if !strings.Contains(got.str("error"), id) || got.Header.Get("X-Request-Id") != id {
		t.Errorf("the answer %s (X-Request-Id %q) does not give its request id", got.Raw, got.Header.Get("X-Request-Id"))
	}
	if !strings.Contains(logged.String(), id) || !strings.Contains(logged.String(), "lease_untill") {
		t.Errorf("the log %q lacks the request id and the error", logged.String())
	}
}

// On loopback without tokens every read is anonymous: were the Host header
// never looked at, a page the operator opens on any site could rebind its
// name to 127.0.0.1 and read every run (params, balances, audit)
// same-origin (DNS rebinding). Only loopback Hosts are answered.
func TestNoTokensRefusesOtherHosts(t *testing.T) {
	a := newAPI(t, func(c *httpapi.Config) { c.Tokens = nil })
	expect(t, "start", a.do("POST", "/api/v1/runs", "", start("report", "2026-11-28")), http.StatusUnauthorized)
	req, _ := http.NewRequest("GET", a.srv.URL+"/api/v1/runs", nil)
	req.Host = "rebind.attacker.example:9090"
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	if got := a.send(req); got.Status == http.StatusOK {
		t.Fatalf("GET /api/v1/runs with Host %s: 200; want it refused (421/403): only a loopback Host may read anonymously", req.Host)
	}
	for _, host := range []string{"localhost:9090", "LOCALHOST", "127.0.0.1:1", "[::1]:9090", "127.0.0.2:80"} {
		req, _ := http.NewRequest("GET", a.srv.URL+"/api/v1/runs", nil)
		req.Host = host
		expect(t, "GET /api/v1/runs with Host "+host, a.send(req), http.StatusOK)
	}
	for _, host := range []string{"rebind.attacker.example", "127.0.0.1.attacker.example:9090", "localhost.attacker.example", "[::2]:9090"} {
		req, _ := http.NewRequest("GET", a.srv.URL+"/api/v1/runs", nil)
		req.Host = host
		expect(t, "GET /api/v1/runs with Host "+host, a.send(req), http.StatusMisdirectedRequest, "misdirected")
	}
	// With tokens, a token is needed anyway: the Host is not looked at.
	b := newAPI(t)
	req, _ = http.NewRequest("GET", b.srv.URL+"/api/v1/runs", nil)
	req.Host = "stepwise.internal.example:443"
	req.Header.Set("Authorization", "Bearer "+readToken)
	expect(t, "GET /api/v1/runs with a token through a proxy", b.send(req), http.StatusOK)
}
