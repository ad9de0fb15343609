package httpapi_test

import (
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepwise-run/stepwise/cmd/internal/httpapi"
	"github.com/stepwise-run/stepwise/runner"
)

// clock is a settable clock for the server's Now.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *clock) advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// A session ends after SessionIdle unused and SessionMax after its login
// however much it is used; its cookie is then refused and cleared.
func TestSessionsExpire(t *testing.T) {
	clk := newClock()
	a := newAPI(t, func(c *httpapi.Config) { c.Now = clk.Now; c.SessionIdle = 10 * time.Minute; c.SessionMax = time.Hour })
	read := func(what, cookie string, status int) answer {
		t.Helper()
		got := a.do("GET", "/api/v1/session", "", nil, "Cookie", cookie)
		expect(t, what, got, status)
		return got
	}

	idle, _ := a.login(readToken)
	clk.advance(9 * time.Minute)
	read("9m idle", idle, http.StatusOK)
	clk.advance(9 * time.Minute) // 18m after login, 9m after its last use
	read("9m idle again", idle, http.StatusOK)
	clk.advance(10*time.Minute + time.Second)
	got := read("over 10m idle", idle, http.StatusUnauthorized)
	if !strings.Contains(got.str("error"), "expired") || !strings.Contains(got.Header.Get("Set-Cookie"), "Max-Age=0") {
		t.Errorf("an expired session answered %s, Set-Cookie %q; want it named expired and the cookie cleared", got.Raw, got.Header.Get("Set-Cookie"))
	}

	busy, _ := a.login(readToken)
	for range 6 {
		clk.advance(9*time.Minute + 59*time.Second)
		read("a busy session", busy, http.StatusOK)
	}
	clk.advance(2 * time.Minute) // 61m54s after login, 2m idle
	read("a busy session past SessionMax", busy, http.StatusUnauthorized)
}

// Reloading the tokens ends at once the sessions of the tokens removed;
// their bearer use ends too, the others go on.
func TestReloadTokensEndsTheirSessions(t *testing.T) {
	a := newAPI(t, twoOperators(t))
	bob, _ := a.login(bobToken)
	a.login(bobToken) // a second browser
	alice, _ := a.login(operateToken)
	expect(t, "bob's session", a.do("GET", "/api/v1/runs", "", nil, "Cookie", bob), http.StatusOK)
	fewer, err := httpapi.ParseTokens([]byte("reader:read:" + readToken + "\nops-alice:operate:" + operateToken + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.api.ReloadTokens(fewer)
	if err != nil || got.SessionsEnded != 2 || got.Tokens != 2 || len(got.Removed) != 1 || got.Removed[0] != "ops-bob" {
		t.Fatalf("ReloadTokens = %+v, %v; want ops-bob removed, its two sessions ended, 2 tokens left", got, err)
	}
	expect(t, "bob's session after the reload", a.do("GET", "/api/v1/runs", "", nil, "Cookie", bob), http.StatusUnauthorized, "unauthenticated")
	expect(t, "bob's bearer token after the reload", a.do("GET", "/api/v1/runs", bobToken, nil), http.StatusUnauthorized, "unauthenticated")
	expect(t, "alice's session after the reload", a.do("GET", "/api/v1/runs", "", nil, "Cookie", alice), http.StatusOK)
	expect(t, "alice's bearer token after the reload", a.do("GET", "/api/v1/runs", operateToken, nil), http.StatusOK)
	if _, err := a.api.ReloadTokens(nil); err == nil {
		t.Error("ReloadTokens(nil) took no tokens at all")
	}
}

// With SecureCookies, or from a trusted proxy saying X-Forwarded-Proto:
// https, the session cookie is Secure and __Host-; from any other peer
// the header is not believed.
func TestSecureCookies(t *testing.T) {
	for _, c := range []struct {
		what   string
		opt    option
		hdr    []string
		secure bool
	}{
		{"plain HTTP", func(*httpapi.Config) {}, nil, false},
		{"--secure-cookies", func(c *httpapi.Config) { c.SecureCookies = true }, nil, true},
		{"a trusted proxy over TLS", func(c *httpapi.Config) { c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")} },
			[]string{"X-Forwarded-Proto", "https"}, true},
		{"an untrusted peer claiming TLS", func(c *httpapi.Config) { c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")} },
			[]string{"X-Forwarded-Proto", "https"}, false},
	} {
		a := newAPI(t, c.opt)
		cookie, _ := a.login(readToken, c.hdr...)
		login := a.do("POST", "/api/v1/login", "", map[string]any{"token": readToken}, c.hdr...)
		sc := login.Header.Get("Set-Cookie")
		isSecure := strings.HasPrefix(sc, httpapi.SecureCookieName+"=") && strings.Contains(sc, "; Secure")
		if isSecure != c.secure || (!c.secure && strings.Contains(sc, "Secure")) {
			t.Errorf("%s: Set-Cookie %q; want secure %v", c.what, sc, c.secure)
		}
		expect(t, c.what+": the session", a.do("GET", "/api/v1/session", "", nil, append([]string{"Cookie", cookie}, c.hdr...)...), http.StatusOK)
	}
}

// Failed authentication is logged (address, never the token), counted in
// stepwise_http_auth_failures_total and throttled per client address:
// past the limit every attempt is 429, the right token included, until
// the window ends.
func TestFailedAuthIsLoggedCountedAndThrottled(t *testing.T) {
	clk := newClock()
	var logged strings.Builder
	reg := prometheus.NewRegistry()
	a := newAPI(t, func(c *httpapi.Config) {
		c.Now, c.Registerer, c.Logger = clk.Now, reg, c.Logger.Output(&logged)
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	})
	const wrong = "guess-0000-wrong-token-9f8e7d6c5b4a"
	for i := range httpapi.DefaultAuthFailures {
		if i%2 == 0 {
			expect(t, "a wrong login", a.do("POST", "/api/v1/login", "", map[string]any{"token": wrong}), http.StatusUnauthorized, "unauthenticated")
		} else {
			expect(t, "a wrong bearer token", a.do("GET", "/api/v1/runs", wrong, nil), http.StatusUnauthorized, "unauthenticated")
		}
	}
	for _, c := range []struct {
		what string
		got  answer
	}{
		{"a wrong login past the limit", a.do("POST", "/api/v1/login", "", map[string]any{"token": wrong})},
		{"a wrong bearer token past the limit", a.do("GET", "/api/v1/runs", wrong, nil)},
		{"a bad Authorization header past the limit", a.do("GET", "/api/v1/runs", "", nil, "Authorization", "Basic x")},
	} {
		expect(t, c.what, c.got, http.StatusTooManyRequests, "throttled")
		if c.got.Header.Get("Retry-After") == "" {
			t.Errorf("%s: 429 without Retry-After", c.what)
		}
	}
	// The right token is never throttled: anyone sharing the address (a
	// NAT, a proxy) could otherwise lock the operators out.
	expect(t, "the right login past the limit", a.do("POST", "/api/v1/login", "", map[string]any{"token": readToken}), http.StatusOK)
	expect(t, "the right bearer token past the limit", a.do("GET", "/api/v1/runs", readToken, nil), http.StatusOK)
	// Another client behind the trusted proxy is its own address.
	expect(t, "another client", a.do("GET", "/api/v1/runs", readToken, nil, "X-Forwarded-For", "203.0.113.7"), http.StatusOK)

	log := logged.String()
	if strings.Contains(log, wrong) || strings.Contains(log, readToken) {
		t.Errorf("the log shows a token:\n%s", log)
	}
	if n := strings.Count(log, `"message":"authentication failed"`); n != httpapi.DefaultAuthFailures ||
		!strings.Contains(log, `"remote":"127.0.0.1"`) || !strings.Contains(log, `"reason":"unknown_token"`) {
		t.Errorf("%d authentication failures logged; want %d with the remote address and reason:\n%s", n, httpapi.DefaultAuthFailures, log)
	}
	if !strings.Contains(log, `"reason":"throttled"`) {
		t.Errorf("the 429s are not logged:\n%s", log)
	}
	mf, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	for _, f := range mf {
		if f.GetName() == "stepwise_http_auth_failures_total" {
			for _, m := range f.GetMetric() {
				counts[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if counts["unknown_token"] != float64(httpapi.DefaultAuthFailures) || counts["throttled"] != 3 {
		t.Errorf("stepwise_http_auth_failures_total = %v; want %d unknown_token, 3 throttled", counts, httpapi.DefaultAuthFailures)
	}

	clk.advance(httpapi.DefaultAuthWindow)
	expect(t, "the right token after the window", a.do("GET", "/api/v1/runs", readToken, nil), http.StatusOK)
	// Dead session cookies (every open tab after a restart) are logged and
	// counted, not throttled: a session ID cannot be guessed.
	for range 2 * httpapi.DefaultAuthFailures {
		expect(t, "a dead session cookie", a.do("GET", "/api/v1/runs", "", nil, "Cookie", httpapi.CookieName+"=gone"), http.StatusUnauthorized, "unauthenticated")
	}
	expect(t, "the right token after dead sessions", a.do("GET", "/api/v1/runs", readToken, nil), http.StatusOK)
	if !strings.Contains(logged.String(), `"reason":"unknown_session"`) {
		t.Errorf("dead session cookies are not logged:\n%s", logged.String())
	}
}

// A from so late that the next fires are past year 9999 (which JSON
// cannot hold) answers a JSON document: the fires it can list, and a
// note; never 200 with an empty body.
func TestSchedulesFromTheEndOfTime(t *testing.T) {
	sched := runner.Schedule{Name: "nightly", Job: "report", Spec: "30 2 * * *", Location: time.UTC}
	a := newAPI(t, func(c *httpapi.Config) {
		c.Schedules = func() ([]runner.Schedule, error) { return []runner.Schedule{sched}, nil }
	})
	got := a.do("GET", "/api/v1/schedules?from=9999-12-31T00:00:00Z", readToken, nil)
	expect(t, "schedules from 9999-12-31", got, http.StatusOK)
	if got.Body == nil || !strings.Contains(got.str("note"), "9999") {
		t.Fatalf("schedules from 9999-12-31 answered %q; want a JSON document with a note", got.Raw)
	}
	next := got.Body["schedules"].([]any)[0].(map[string]any)["next"].([]any)
	if len(next) != 1 || next[0].(map[string]any)["at"] != "9999-12-31T02:30:00Z" {
		t.Errorf("fires from 9999-12-31: %v; want the one at 02:30 that day only", next)
	}
}
