package web_test

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/cmd/internal/httpapi"
	"github.com/stepwise-run/stepwise/cmd/internal/web"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
)

const testDate = "2026-11-28"

// missingAccount is credited by the transfer failedSettle adds: the
// ledger has no such account, so its chunk fails the run.
const missingAccount = "A-9999999"

func registry() *jobs.Registry {
	var reg jobs.Registry
	reg.MustRegister(settlement.Job)
	return &reg
}

// failedSettle settles a seeded day whose 651st transfer credits an
// account the ledger lacks: the first six chunks post (some transfers
// rejected for overdraft), the seventh fails the run. It returns the store
// and its location.
func failedSettle(t *testing.T) (checkpoint.Backend, string) {
	t.Helper()
	return failedSettleChunks(t, 100)
}

// failedSettleChunks is failedSettle with chunks of the given size.
func failedSettleChunks(t *testing.T, chunk int) (checkpoint.Backend, string) {
	t.Helper()
	ctx := context.Background()
	st, loc := checkpointtest.OpenNew(t)
	db := checkpointtest.SQL(t, loc)
	cfg := settlement.SeedConfig{Accounts: 50, Transfers: 800, Date: testDate, Seed: 7, Balance: 10_000}
	if err := settlement.Seed(ctx, db, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO transfers (id, business_date, from_account, to_account, amount) VALUES ($1, $2, $3, $4, $5)`,
		settlement.TransferID(testDate, 650)+"a", testDate, settlement.AccountID(1), missingAccount, 5); err != nil {
		t.Fatal(err)
	}
	r, err := runner.New(runner.Config{Store: st, Jobs: registry()})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Run(ctx, runner.Request{Job: "settle", Values: map[string]string{"date": testDate, "chunk": strconv.Itoa(chunk)}})
	if err == nil || res.Status != checkpoint.RunFailed {
		t.Fatalf("settle with a missing account: %s, %v; want it failed", res.Status, err)
	}
	return st, loc
}

// serve serves the dashboard of cfg (Store st, Now fixed) on a test server.
func serve(t *testing.T, cfg web.Config) *httptest.Server {
	t.Helper()
	h, err := web.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// get fetches path without following redirects.
func get(t *testing.T, srv *httptest.Server, path string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

func wantIn(t *testing.T, what, body string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(body, w) {
			t.Errorf("%s lacks %q", what, w)
		}
	}
}

// text is the page with its tags dropped and its spaces folded, to match
// what a reader sees.
func text(html string) string {
	s := regexp.MustCompile(`(?s)<[^>]*>`).ReplaceAllString(html, " ")
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == '\n' || r == '\t' }), " ")
}

func TestRunPageShowsAFailedRun(t *testing.T) {
	st, _ := failedSettle(t)
	ctx := context.Background()
	runID := "settle/" + testDate
	srv := serve(t, web.Config{Store: st})
	res, body := get(t, srv, "/runs/"+runID)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET the run page: %s\n%s", res.Status, body)
	}
	seen := text(body)

	// What the store says, through the ops views the API serializes.
	v, err := ops.Show(ctx, st, runID, ops.ShowOptions{Effects: true}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rejected, err := ops.Items(ctx, st, ops.ItemsQuery{RunID: runID, Status: checkpoint.StepRejected, Limit: 50}, v.Batches)
	if err != nil || len(rejected.Items) == 0 {
		t.Fatalf("rejected items: %v, %v; the seeded ledger should overdraw some", rejected, err)
	}
	b := v.Batches[0]
	wantIn(t, "run page", seen, runID, "failed", missingAccount, "Rejected items "+itoa(b.Rejected),
		itoa(b.Done)+" of "+itoa(b.Total)+" items", "completed "+itoa(b.Completed), "No operator has acted on this run.")
	for _, it := range rejected.Items[:3] {
		wantIn(t, "run page", seen, it.ID, it.Reason)
	}
	// Effects: a key's value before the run and after it, from the chunk
	// plans (the first write's old value, the last one's new value).
	var first, last checkpoint.Write
	found := false
	for _, c := range v.ChunkPlans {
		for _, w := range c.Writes {
			if w.Key == settlement.AccountID(7) {
				if !found {
					first, found = w, true
				}
				last = w
			}
		}
	}
	if !found {
		t.Fatalf("no chunk plan wrote %s", settlement.AccountID(7))
	}
	row := regexp.MustCompile(`(?s)<tr data-key="` + settlement.AccountID(7) + `">.*?</tr>`).FindString(body)
	wantIn(t, "effects row of "+settlement.AccountID(7), text(row), groupDigits(first.OldValue), groupDigits(last.NewValue))
	for _, w := range []string{`data-op="resume"`, `data-op="rerun"`, `data-op="abandon"`, `data-op="recover"`, `data-op="reset"`, `data-op="resolve"`,
		`<label for="op-reason">`, `<progress max="100" value="`, `data-live`} {
		wantIn(t, "run page markup", body, w)
	}

	// The effects search keeps the keys containing the text.
	_, body = get(t, srv, "/runs/"+runID+"?key=a-0000001")
	keys := regexp.MustCompile(`<tr data-key="([^"]+)">`).FindAllStringSubmatch(body, -1)
	if len(keys) != 1 || keys[0][1] != settlement.AccountID(1) {
		t.Errorf("effects searched for a-0000001 list %v; want only %s", keys, settlement.AccountID(1))
	}

	// A page of rejected items goes on after the last one listed.
	if rejected.Next != "" {
		last := rejected.Items[len(rejected.Items)-1]
		_, body = get(t, srv, "/runs/"+runID+"?rejected_step="+last.Step+"&rejected_key="+url.QueryEscape(last.Key))
		if strings.Contains(body, ">"+rejected.Items[0].ID+"<") {
			t.Errorf("the next page of rejected items still lists %s", rejected.Items[0].ID)
		}
	}
}

// TestEffectsSearchReadsEveryChunkPlan: the page lists the first chunk
// plans' effects; a search reads them all; the page's own refreshes leave
// the effects out.
func TestEffectsSearchReadsEveryChunkPlan(t *testing.T) {
	st, _ := failedSettleChunks(t, 5) // 130 chunks posted before the failing one
	ctx := context.Background()
	runID := "settle/" + testDate
	v, err := ops.Show(ctx, st, runID, ops.ShowOptions{Effects: true}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key := settlement.AccountID(7)
	all := 0
	for _, c := range v.ChunkPlans {
		for _, w := range c.Writes {
			if w.Key == key {
				all++
			}
		}
	}
	if len(v.ChunkPlans) <= 100 {
		t.Fatalf("%d chunk plans; the test needs more than the page reads without a search", len(v.ChunkPlans))
	}
	srv := serve(t, web.Config{Store: st})
	writes := regexp.MustCompile(`<tr data-key="` + key + `">(?s:.*?)<summary>(\d+) writes</summary>`)
	_, body := get(t, srv, "/runs/"+runID)
	m := writes.FindStringSubmatch(body)
	if m == nil || m[1] == strconv.Itoa(all) {
		t.Errorf("without a search %s lists %v writes; want fewer than all %d (from the first chunk plans only)", key, m, all)
	}
	wantIn(t, "run page", text(body), "search for a key to read them all")
	_, body = get(t, srv, "/runs/"+runID+"?key="+key)
	if m := writes.FindStringSubmatch(body); m == nil || m[1] != strconv.Itoa(all) {
		t.Errorf("searching for %s lists %v writes; want all %d", key, m, all)
	}
	_, body = get(t, srv, "/runs/"+runID, web.RefreshHeader, "1")
	if strings.Contains(body, `id="effects"`) || !strings.Contains(body, `id="progress"`) {
		t.Errorf("a refresh of the run page: effects included %v, progress %v; want only the live sections",
			strings.Contains(body, `id="effects"`), strings.Contains(body, `id="progress"`))
	}
}

func itoa(n int64) string { return groupDigits(n) }

// groupDigits is how the pages write an integer: thin spaces between
// groups of three digits.
func groupDigits(n int64) string {
	s := strings.TrimPrefix(strconv.FormatInt(n, 10), "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteRune('\u202f')
		}
		b.WriteRune(c)
	}
	if n < 0 {
		return "−" + b.String()
	}
	return b.String()
}

func TestRunsListFilters(t *testing.T) {
	st, _ := failedSettle(t)
	srv := serve(t, web.Config{Store: st})
	runID := "settle/" + testDate
	for _, c := range []struct {
		query string
		lists bool
	}{{"", true}, {"?status=failed", true}, {"?status=succeeded", false}, {"?status=stale", false}, {"?job=settle", true}, {"?job=report", false}, {"?key=2026-11", true}, {"?key=2025", false}} {
		res, body := get(t, srv, "/"+c.query)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET /%s: %s", c.query, res.Status)
		}
		if got := strings.Contains(body, `href="/runs/settle/2026-11-28"`); got != c.lists {
			t.Errorf("GET /%s lists %s: %v; want %v", c.query, runID, got, c.lists)
		}
	}
	res, body := get(t, srv, "/?status=bogus")
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, "There is no run status &#34;bogus&#34;; choose one of running, stale") {
		t.Errorf("GET /?status=bogus: %s\n%s", res.Status, text(body))
	}
	res, body = get(t, srv, "/runs/settle/1999-01-01")
	if res.StatusCode != http.StatusNotFound || !strings.Contains(text(body), "There is no run &#34;settle/1999-01-01&#34; in this store") {
		t.Errorf("GET an unknown run: %s\n%s", res.Status, text(body))
	}
}

// TestPagesSitBehindTheAPIsAuth: with the API's tokens, a page without a
// credential sends the browser to the login page (and back after it),
// with one it shows who is signed in; no page leaves this origin.
func TestPagesSitBehindTheAPIsAuth(t *testing.T) {
	st := checkpointtest.Open(t)
	tokens, err := httpapi.ParseTokens([]byte("alice:operate:56531e6824b0640f320bff27a9efc20ca600026a8acd1f68\nbob:read:8f25ece68cd10e0c7a029eec2044c9b981191e9f18b43616\n"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := runner.New(runner.Config{Store: st, Jobs: registry()})
	if err != nil {
		t.Fatal(err)
	}
	api, err := httpapi.New(httpapi.Config{Store: st, Jobs: registry(), Starter: httpapi.NewLocal(r), Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, web.Config{Store: st, Auth: apiAuth{api}})
	res, _ := get(t, srv, "/runs/settle/2026-11-28?key=A-1")
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/login?next="+url.QueryEscape("/runs/settle/2026-11-28?key=A-1") {
		t.Errorf("a page without a token: %s to %q; want 303 to the login page", res.Status, res.Header.Get("Location"))
	}
	res, _ = get(t, srv, "/", "Authorization", "Bearer wrong-token-wrong-token")
	if res.StatusCode != http.StatusSeeOther {
		t.Errorf("a page with a wrong token: %s; want 303 to the login page", res.Status)
	}
	res, body := get(t, srv, "/", "Authorization", "Bearer 8f25ece68cd10e0c7a029eec2044c9b981191e9f18b43616")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("a page with a read token: %s", res.Status)
	}
	wantIn(t, "runs page for bob", text(body), "Signed in as bob read only")
	// Alice logs in through the API; its session cookie opens the pages.
	login := httptest.NewRecorder()
	api.ServeHTTP(login, httptest.NewRequest(http.MethodPost, "/api/v1/login", strings.NewReader(`{"token":"56531e6824b0640f320bff27a9efc20ca600026a8acd1f68"}`)))
	cookie, _, _ := strings.Cut(login.Header().Get("Set-Cookie"), ";")
	if login.Code != http.StatusOK || strings.Contains(cookie, "56531e6824b0640f320b") {
		t.Fatalf("login: %d, cookie %q; want 200 and a session ID, not the token", login.Code, cookie)
	}
	_, body = get(t, srv, "/", "Cookie", cookie)
	wantIn(t, "runs page for alice's cookie", text(body), "Signed in as alice operate")
	if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("Content-Security-Policy %q; want everything from this origin only", csp)
	}

	// The login page returns only to a path on this server.
	for next, want := range map[string]string{"/runs/x/y": "/runs/x/y", "//evil.example/": "/", "https://evil.example/": "/", `/\evil.example`: "/",
		"/runs/x/y?key=A-1": "/runs/x/y?key=A-1", "/\x7f/evil.example": "/", "javascript:alert(1)": "/"} {
		res, body := get(t, srv, "/login?next="+url.QueryEscape(next))
		if res.StatusCode != http.StatusOK || !strings.Contains(body, `data-next="`+want+`"`) {
			t.Errorf("login?next=%s: %s; want it to return to %s", next, res.Status, want)
		}
	}
	// Assets are served from the binary, to anyone (they hold no data).
	for _, p := range []string{"/static/app.css", "/static/app.js"} {
		if res, body := get(t, srv, p); res.StatusCode != http.StatusOK || len(body) < 1000 {
			t.Errorf("GET %s: %s, %d bytes", p, res.Status, len(body))
		}
	}
}

// apiAuth is cmd's join of the dashboard to the API's authentication.
type apiAuth struct{ api *httpapi.Server }

func (a apiAuth) Require(next http.Handler) http.Handler { return a.api.Auth(httpapi.RoleRead, next) }

func (a apiAuth) Caller(r *http.Request) (web.Caller, bool) {
	id, ok := httpapi.Caller(r)
	return web.Caller{Name: id.Name, CanOperate: id.Role == httpapi.RoleOperate}, ok
}

// TestSchedulesPage shows the next fires around New York's spring-forward
// night, which skips 02:30, and the fires missed since the settle mark.
func TestSchedulesPage(t *testing.T) {
	st := checkpointtest.Open(t)
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	s := runner.Schedule{Name: "settle-nightly", Job: "settle", Spec: "30 2 * * *", Location: ny,
		Key: runner.PreviousBusinessDate("date", runner.Weekdays), Misfire: runner.MisfireRunOnce}
	ctx := context.Background()
	served := time.Date(2026, 3, 1, 12, 0, 0, 0, ny)
	claim, err := st.ClaimSchedule(ctx, checkpoint.ScheduleClaimRequest{Name: s.Name, Owner: "gone-host:1", Now: served, LeaseFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	fire := time.Date(2026, 3, 4, 2, 30, 0, 0, ny)
	if err := st.SettleSchedule(ctx, claim.Lease, fire, fire); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 3, 7, 12, 0, 0, 0, ny)
	srv := serve(t, web.Config{Store: st, Logger: zerolog.New(zerolog.NewTestWriter(t)), Schedules: func() ([]runner.Schedule, error) { return []runner.Schedule{s}, nil },
		Now: func() time.Time { return now }})
	res, body := get(t, srv, "/schedules")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /schedules: %s\n%s", res.Status, body)
	}
	wantIn(t, "schedules page", text(body), "settle-nightly", "run-once : of the missed fires, only the latest runs",
		"Last fire Wed 2026-03-04 02:30:00 EST",
		"3 missed fires not yet settled: Thu 2026-03-05 02:30:00 EST, Fri 2026-03-06 02:30:00 EST, Sat 2026-03-07 02:30:00 EST",
		"Sun 2026-03-08 03:00:00 EDT", "skipped the wall time does not exist that day: fires at the change", "offset EST -&gt; EDT",
		"no scheduler holds it")
}

// A partitioned batch step shows each partition with its state, its count
// and a bar of its own, from the partitions the store recorded.
func TestRunPageShowsPartitions(t *testing.T) {
	ctx := context.Background()
	st, loc := checkpointtest.OpenNew(t)
	db := checkpointtest.SQL(t, loc)
	cfg := settlement.SeedConfig{Accounts: 50, Transfers: 400, Date: testDate, Seed: 7, Balance: 10_000}
	if err := settlement.Seed(ctx, db, cfg); err != nil {
		t.Fatal(err)
	}
	r, err := runner.New(runner.Config{Store: st, Jobs: registry()})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Run(ctx, runner.Request{Job: "settle", Values: map[string]string{"date": testDate, "chunk": "50", "partitions": "4"}})
	if err != nil || res.Status != checkpoint.RunSucceeded {
		t.Fatalf("partitioned settle: %s, %v", res.Status, err)
	}
	runID := "settle/" + testDate
	v, err := ops.Show(ctx, st, runID, ops.ShowOptions{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Partitions) != 4 {
		t.Fatalf("the run has %d partitions recorded; want 4", len(v.Partitions))
	}
	srv := serve(t, web.Config{Store: st})
	resp, body := get(t, srv, "/runs/"+runID)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET the run page: %s\n%s", resp.Status, body)
	}
	if n := strings.Count(body, `data-testid="partition"`); n != 4 {
		t.Fatalf("the run page shows %d partition rows; want 4", n)
	}
	var sum int64
	for _, p := range v.Partitions {
		sum += p.Done
		wantIn(t, "partition row", text(body), groupDigits(p.Done)+" of "+groupDigits(p.Total))
	}
	if sum != 400 {
		t.Errorf("the partitions finished %d items; want all 400", sum)
	}
	wantIn(t, "partition bars", body, `aria-label="partition 0"`, `aria-label="partition 3"`)
}

// Browsers drop ASCII tab and newline from a URL before parsing it
// (WHATWG URL), so "/\t/evil.example/" is "//evil.example/": the login
// page's script would then location.assign() the user to another site:
// such a next is refused (the page returns to "/").
func TestLoginNextRefusesWhatBrowsersStrip(t *testing.T) {
	st, _ := checkpointtest.OpenNew(t)
	h, err := web.New(web.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, next := range []string{"/\t/evil.example/", "/\n/evil.example/", "/\r\\evil.example/"} {
		res, err := srv.Client().Get(srv.URL + "/login?next=" + url.QueryEscape(next))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		m := regexp.MustCompile(`data-next="([^"]*)"`).FindStringSubmatch(string(b))
		if m == nil {
			t.Fatal("no data-next on the login page")
		}
		got := html.UnescapeString(m[1])
		resolved, _ := url.Parse("http://127.0.0.1:9090/login")
		if u, err := url.Parse(regexp.MustCompile(`[\t\n\r]`).ReplaceAllString(got, "")); err == nil {
			resolved = resolved.ResolveReference(u)
		}
		if resolved.Host != "127.0.0.1:9090" {
			t.Errorf("login?next=%q: data-next %q, which a browser resolves to %s", next, got, resolved)
		}
	}
}
