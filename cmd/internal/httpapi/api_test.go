package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/cmd/internal/httpapi"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
	"github.com/stepwise-run/stepwise/steps"
)

func TestStartCreatedThenExisted(t *testing.T) {
	a := newAPI(t)
	got := a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"))
	expect(t, "first start", got, http.StatusCreated)
	if got.str("id") != "report/2026-11-28" || got.str("link") != "/api/v1/runs/report/2026-11-28" || got.Body["created"] != true ||
		got.Header.Get("Location") != "/api/v1/runs/report/2026-11-28" {
		t.Fatalf("first start answered %s", got.Raw)
	}
	a.wait("report/2026-11-28")
	again := a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"))
	expect(t, "the same start again", again, http.StatusOK)
	if again.str("status") != checkpoint.RunSucceeded || again.Body["created"] != false {
		t.Fatalf("the same start again answered %s; want the succeeded run, not created", again.Raw)
	}
	// The run key with other parameters: refused as the CLI refuses it.
	other := a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28", "note", "x"))
	expect(t, "the run key with other params", other, http.StatusUnprocessableEntity, "params_mismatch", "params")
	if !strings.Contains(other.str("error"), "a run key always means the same parameters") {
		t.Errorf("params mismatch says %q", other.str("error"))
	}
	info, err := a.st.Run(context.Background(), "report/2026-11-28")
	if err != nil || len(info.Attempts) != 1 {
		t.Fatalf("the run has %d attempts (%v); want 1: a start of an existing run never resumes it", len(info.Attempts), err)
	}
}

func TestStartRefusesBadRequests(t *testing.T) {
	a := newAPI(t)
	for _, c := range []struct {
		name         string
		body         any
		status       int
		code, field  string
		errorHasText string
	}{
		{"malformed JSON", `{"job": "report", `, 400, "bad_json", "", "not JSON"},
		{"two objects", `{"job":"report"} {}`, 400, "bad_json", "", "after the JSON object"},
		{"unknown field", `{"job":"report","parms":{}}`, 400, "bad_json", "parms", "unknown field"},
		{"params not an object", `{"job":"report","params":[1]}`, 400, "bad_json", "params", "must be a object"},
		{"no job", `{"params":{}}`, 400, "bad_request", "job", `needs "job"`},
		{"unknown job", start("nosuch", "2026-11-28"), 404, "not_found", "job", "notify, pay, report, settle"},
		{"bad date", start("report", "28.11.2026"), 400, "bad_params", "params.date", "YYYY-MM-DD"},
		{"unknown parameter", start("report", "2026-11-28", "colour", "red"), 400, "bad_params", "params.colour", "unknown parameter"},
		{"missing key parameter", map[string]any{"job": "report", "params": map[string]any{}}, 400, "bad_params", "params.date", `"date"`},
		{"wrong type", map[string]any{"job": "report", "params": map[string]any{"date": "2026-11-28", "fail": "maybe"}}, 400, "bad_params", "params.fail", "true or false"},
		{"bad Idempotency-Key", start("report", "2026-11-28"), 400, "bad_request", "Idempotency-Key", "printable"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var hdr []string
			if c.field == "Idempotency-Key" {
				hdr = []string{"Idempotency-Key", "has a space"}
			}
			got := a.do("POST", "/api/v1/runs", operateToken, c.body, hdr...)
			expect(t, c.name, got, c.status, c.code, c.field)
			if !strings.Contains(got.str("error"), c.errorHasText) {
				t.Errorf("error %q; want it to say %q", got.str("error"), c.errorHasText)
			}
		})
	}
	if runs, err := a.st.Runs(context.Background(), checkpoint.RunFilter{}); err != nil || len(runs) != 0 {
		t.Errorf("after refused starts: %d runs, %v; want none", len(runs), err)
	}
}

func TestIdempotencyKeyReplaysAndSurvivesARestart(t *testing.T) {
	a := newAPI(t)
	key := []string{"Idempotency-Key", "sched-2026-11-28-a"}
	first := a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), key...)
	expect(t, "first", first, http.StatusCreated)
	a.wait("report/2026-11-28")
	replay := a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), key...)
	expect(t, "replay", replay, http.StatusOK)
	if replay.str("id") != "report/2026-11-28" || replay.Body["replayed"] != true || replay.Body["created"] != false {
		t.Fatalf("replay answered %s", replay.Raw)
	}
	other := a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-29"), key...)
	expect(t, "the key with another body", other, http.StatusUnprocessableEntity, "idempotency_conflict", "Idempotency-Key")
	for _, want := range []string{`"date":"2026-11-28"`, `"date":"2026-11-29"`, "report/2026-11-28"} {
		if !strings.Contains(other.str("error"), want) {
			t.Errorf("422 says %q; want it to name both requests (%s)", other.str("error"), want)
		}
	}
	// A new process on the same store still answers the replay.
	b := newAPIOn(t, a.st, a.loc)
	after := b.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), key...)
	expect(t, "replay after a restart", after, http.StatusOK)
	if after.Body["replayed"] != true {
		t.Fatalf("replay after a restart answered %s", after.Raw)
	}
	if info, _ := a.st.Run(context.Background(), "report/2026-11-28"); len(info.Attempts) != 1 {
		t.Errorf("the run has %d attempts; want 1", len(info.Attempts))
	}
}

// concurrently sends n requests at once and returns their answers.
func concurrently(a *testAPI, n int, body func(i int) any, hdr ...string) []answer {
	out := make([]answer, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-gate
			out[i] = a.do("POST", "/api/v1/runs", operateToken, body(i), hdr...)
		})
	}
	close(gate)
	wg.Wait()
	return out
}

func statusCounts(as []answer) map[int]int {
	m := map[int]int{}
	for _, a := range as {
		m[a.Status]++
	}
	return m
}

func checkOneRun(t *testing.T, a *testAPI, runID string) {
	t.Helper()
	a.wait(runID)
	runs, err := a.st.Runs(context.Background(), checkpoint.RunFilter{})
	if err != nil || len(runs) != 1 {
		t.Fatalf("%d runs (%v); want exactly 1", len(runs), err)
	}
	info, err := a.st.Run(context.Background(), runID)
	if err != nil || len(info.Attempts) != 1 || info.Run.Status != checkpoint.RunSucceeded {
		t.Fatalf("run %s: %d attempts, %s (%v); want 1 attempt, succeeded", runID, len(info.Attempts), info.Run.Status, err)
	}
}

// Ten identical starts at once without a key: the run key dedupes, and
// the create-only claim says exactly which one created it.
func TestTenIdenticalStartsWithoutKeyStartOneRun(t *testing.T) {
	a := newAPI(t)
	got := concurrently(a, 10, func(int) any { return start("report", "2026-11-28") })
	if c := statusCounts(got); c[201] != 1 || c[200] != 9 {
		t.Fatalf("statuses %v; want exactly one 201 and nine 200", c)
	}
	for _, g := range got {
		if g.str("id") != "report/2026-11-28" {
			t.Fatalf("an answer names %q", g.Raw)
		}
	}
	checkOneRun(t, a, "report/2026-11-28")
}

// Ten identical starts at once with one key: one 201; each other one is
// 409 while the first is still being accepted, or 200 once it was.
func TestTenIdenticalStartsWithOneKeyStartOneRun(t *testing.T) {
	a := newAPI(t)
	got := concurrently(a, 10, func(int) any { return start("report", "2026-11-28") }, "Idempotency-Key", "k-10")
	c := statusCounts(got)
	if c[201] != 1 || c[200]+c[409] != 9 {
		t.Fatalf("statuses %v; want exactly one 201 and nine 200 or 409", c)
	}
	for _, g := range got {
		if g.Status == 200 && (g.str("id") != "report/2026-11-28" || g.Body["replayed"] != true) {
			t.Fatalf("a 200 answered %s", g.Raw)
		}
		if g.Status == 409 && g.str("code") != "conflict" {
			t.Fatalf("a 409 answered %s", g.Raw)
		}
	}
	checkOneRun(t, a, "report/2026-11-28")
}

// gate is a Starter that holds each Start until released.
type gate struct {
	httpapi.Starter
	entered chan struct{}
	release chan struct{}
}

func (g *gate) Start(ctx context.Context, req runner.Request) (httpapi.Started, error) {
	g.entered <- struct{}{}
	<-g.release
	return g.Starter.Start(ctx, req)
}

// While the first request with a key is held inside its acceptance, every
// other one with the key is exactly 409; once it is accepted, 200.
func TestKeyStillBeingAcceptedIs409(t *testing.T) {
	g := &gate{entered: make(chan struct{}, 1), release: make(chan struct{})}
	a := newAPI(t, func(c *httpapi.Config) { g.Starter = c.Starter; c.Starter = g })
	key := []string{"Idempotency-Key", "k-held"}
	firstDone := make(chan answer)
	go func() { firstDone <- a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), key...) }()
	<-g.entered
	got := concurrently(a, 9, func(int) any { return start("report", "2026-11-28") }, key...)
	if c := statusCounts(got); c[409] != 9 {
		t.Fatalf("statuses while the first is held %v; want nine 409", c)
	}
	if got[0].Header.Get("Retry-After") == "" || !strings.Contains(got[0].str("error"), "still being accepted") {
		t.Errorf("409 answered %s (Retry-After %q)", got[0].Raw, got[0].Header.Get("Retry-After"))
	}
	close(g.release)
	expect(t, "the first, released", <-firstDone, http.StatusCreated)
	expect(t, "a replay after", a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), key...), http.StatusOK)
	checkOneRun(t, a, "report/2026-11-28")
}

// Ten requests at once with one key and ten different bodies: the first
// to record the key starts its run, and each of the nine others is 422.
func TestOneKeyTenBodiesAt422(t *testing.T) {
	a := newAPI(t)
	got := concurrently(a, 10, func(i int) any { return start("report", fmt.Sprintf("2026-11-%02d", i+1)) }, "Idempotency-Key", "k-bodies")
	c := statusCounts(got)
	if c[201] != 1 || c[422] != 9 {
		t.Fatalf("statuses %v; want one 201 and nine 422", c)
	}
	var created string
	for _, g := range got {
		if g.Status == 201 {
			created = g.str("id")
		}
	}
	for _, g := range got {
		if g.Status == 422 && (g.str("code") != "idempotency_conflict" || !strings.Contains(g.str("error"), created)) {
			t.Fatalf("a 422 answered %s; want it to name the run %s", g.Raw, created)
		}
	}
	checkOneRun(t, a, created)
}

func TestReads(t *testing.T) {
	a := newAPI(t)
	for _, d := range []string{"2026-11-27", "2026-11-28"} {
		expect(t, "start settle", a.do("POST", "/api/v1/runs", operateToken, start("settle", d)), http.StatusCreated)
		a.wait("settle/" + d)
	}
	expect(t, "start report", a.do("POST", "/api/v1/runs", operateToken, map[string]any{"job": "report",
		"params": map[string]any{"date": "2026-11-28", "fail": true}}), http.StatusCreated)
	a.wait("report/2026-11-28")

	list := a.do("GET", "/api/v1/runs?job=settle", readToken, nil)
	expect(t, "list settle", list, http.StatusOK)
	if runs, _ := list.Body["runs"].([]any); len(runs) != 2 {
		t.Fatalf("runs of settle: %s", list.Raw)
	}
	failed := a.do("GET", "/api/v1/runs?status=failed", readToken, nil)
	if runs, _ := failed.Body["runs"].([]any); len(runs) != 1 || runs[0].(map[string]any)["id"] != "report/2026-11-28" {
		t.Fatalf("failed runs: %s", failed.Raw)
	}
	prefix := a.do("GET", "/api/v1/runs?key_prefix=2026-11-27", readToken, nil)
	if runs, _ := prefix.Body["runs"].([]any); len(runs) != 1 {
		t.Fatalf("runs with key prefix 2026-11-27: %s", prefix.Raw)
	}
	future := a.do("GET", "/api/v1/runs?since="+time.Now().Add(time.Hour).UTC().Format(time.RFC3339), readToken, nil)
	if runs, _ := future.Body["runs"].([]any); len(runs) != 0 {
		t.Fatalf("runs since an hour from now: %s", future.Raw)
	}
	// Pages of one follow the cursor through all three runs, once each.
	seen := map[string]bool{}
	path := "/api/v1/runs?limit=1"
	for range 5 {
		p := a.do("GET", path, readToken, nil)
		expect(t, "a page", p, http.StatusOK)
		for _, r := range p.Body["runs"].([]any) {
			seen[r.(map[string]any)["id"].(string)] = true
		}
		if p.str("next") == "" {
			break
		}
		path = "/api/v1/runs?limit=1&cursor=" + p.str("next")
	}
	if len(seen) != 3 {
		t.Errorf("paging saw %v; want the 3 runs", seen)
	}
	expect(t, "bad status", a.do("GET", "/api/v1/runs?status=done", readToken, nil), 400, "bad_request", "status")
	expect(t, "bad since", a.do("GET", "/api/v1/runs?since=yesterday", readToken, nil), 400, "bad_request", "since")
	expect(t, "bad cursor", a.do("GET", "/api/v1/runs?cursor=zzz", readToken, nil), 400, "bad_request", "cursor")
	expect(t, "stale is a status", a.do("GET", "/api/v1/runs?status=stale", readToken, nil), 200)

	run := a.do("GET", "/api/v1/runs/settle/2026-11-28", readToken, nil)
	expect(t, "one run", run, http.StatusOK)
	batches, _ := run.Body["batches"].([]any)
	if len(batches) != 1 {
		t.Fatalf("batches: %s", run.Raw)
	}
	b := batches[0].(map[string]any)
	if b["done"] != 4.0 || b["total"] != 4.0 || b["rejected"] != 1.0 || b["completed"] != 3.0 {
		t.Errorf("batch progress %v; want done 4 of 4, 3 completed, 1 rejected", b)
	}
	if plans, _ := run.Body["chunk_plans"].([]any); len(plans) != 2 {
		t.Errorf("chunk plans %v; want the 2 chunks' plans", run.Body["chunk_plans"])
	} else if w := plans[0].(map[string]any)["writes"].([]any); len(w) == 0 {
		t.Errorf("a chunk plan has no writes: %v", plans[0])
	}
	// The escaped form of a run ID names the same run.
	expect(t, "escaped run ID", a.do("GET", "/api/v1/runs/settle%2F2026-11-28", readToken, nil), http.StatusOK)
	report := a.do("GET", "/api/v1/runs/report/2026-11-28", readToken, nil)
	steps := report.Body["steps"].([]any)
	fee := steps[0].(map[string]any)
	if plan, _ := fee["plan"].(map[string]any); plan == nil || plan["applied"] != true {
		t.Errorf("the fee step's effect plan: %v", fee)
	}

	items := a.do("GET", "/api/v1/runs/settle/2026-11-28/steps/post/items?status=rejected", readToken, nil)
	expect(t, "rejected items", items, http.StatusOK)
	list2, _ := items.Body["items"].([]any)
	if len(list2) != 1 || list2[0].(map[string]any)["key"] != "T3" || !strings.Contains(list2[0].(map[string]any)["reason"].(string), "frozen") {
		t.Fatalf("rejected items: %s", items.Raw)
	}
	page := a.do("GET", "/api/v1/runs/settle/2026-11-28/steps/post/items?status=completed&limit=2", readToken, nil)
	if page.str("next") != "T2" || len(page.Body["items"].([]any)) != 2 || page.Body["total"] != 3.0 {
		t.Fatalf("first page of completed items: %s", page.Raw)
	}
	page2 := a.do("GET", "/api/v1/runs/settle/2026-11-28/steps/post/items?status=completed&limit=2&cursor=T2", readToken, nil)
	if got := page2.Body["items"].([]any); len(got) != 1 || got[0].(map[string]any)["key"] != "T4" || page2.str("next") != "" {
		t.Fatalf("second page of completed items: %s", page2.Raw)
	}
	expect(t, "items without status", a.do("GET", "/api/v1/runs/settle/2026-11-28/steps/post/items", readToken, nil), 400, "bad_request", "status")
	expect(t, "items of no step", a.do("GET", "/api/v1/runs/settle/2026-11-28/steps/nope/items?status=rejected", readToken, nil), 404, "not_found")
	nf := a.do("GET", "/api/v1/runs/settle/2030-01-01", readToken, nil)
	expect(t, "no such run", nf, 404, "not_found")
	if strings.Contains(nf.Raw, a.loc) || strings.Contains(nf.Raw, ".db") {
		t.Errorf("404 names the database: %s", nf.Raw)
	}
	expect(t, "no such endpoint", a.do("GET", "/api/v1/nope", readToken, nil), 404, "not_found")
	sch := a.do("GET", "/api/v1/schedules", readToken, nil)
	expect(t, "schedules", sch, http.StatusOK)
}

func TestSchedules(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	sched := runner.Schedule{Name: "nightly", Job: "report", Spec: "30 2 * * *", Location: ny}
	a := newAPI(t, func(c *httpapi.Config) {
		c.Schedules = func() ([]runner.Schedule, error) { return []runner.Schedule{sched}, nil }
	})
	got := a.do("GET", "/api/v1/schedules?next=2&from=2027-03-13T12:00:00-05:00", readToken, nil)
	expect(t, "schedules", got, http.StatusOK)
	s := got.Body["schedules"].([]any)[0].(map[string]any)
	next := s["next"].([]any)
	if len(next) != 2 || next[0].(map[string]any)["dst"] != "skipped" || next[0].(map[string]any)["offset_change"] != "EST -> EDT" {
		t.Fatalf("next fires around the spring DST change: %s", got.Raw)
	}
	expect(t, "bad next", a.do("GET", "/api/v1/schedules?next=-1", readToken, nil), 400, "bad_request", "next")
}

// body of an operation.
func reason(r string, kv ...any) map[string]any {
	m := map[string]any{"reason": r}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

func TestOperationsRefuseAsTheCLIAndAreAudited(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	expect(t, "start", a.do("POST", "/api/v1/runs", operateToken, map[string]any{"job": "report",
		"params": map[string]any{"date": "2026-11-28", "fail": true}}), http.StatusCreated)
	a.wait("report/2026-11-28")
	const run = "/api/v1/runs/report/2026-11-28"

	expect(t, "no reason", a.do("POST", run+"/abandon", operateToken, map[string]any{}), 400, "bad_request", "reason")
	expect(t, "no such run", a.do("POST", "/api/v1/runs/report/2030-01-01/abandon", operateToken, reason("x")), 404, "not_found")
	expect(t, "no such verb", a.do("POST", run+"/explode", operateToken, reason("x")), 404, "not_found")

	// Recover of a run that is not running: the CLI's words.
	rec := a.do("POST", run+"/recover", operateToken, reason("runner gone"))
	expect(t, "recover a failed run", rec, http.StatusConflict, "needs_decision")
	_, want := ops.Recover(ctx, a.st, ops.Who{Operator: "x", Reason: "y"}, "report/2026-11-28", false, time.Now())
	if want == nil || rec.str("error") != ops.UserText(want.Error()) { // the CLI's words, without Go package prefixes
		t.Errorf("recover refusal %q; want the CLI's %v", rec.str("error"), want)
	}
	// Reset of a step whose effects applied: the CLI's words, then the
	// API's way to force it.
	reset := a.do("POST", run+"/steps/fee/reset", operateToken, reason("redo"))
	expect(t, "reset an applied step", reset, http.StatusConflict, "needs_decision")
	_, want = ops.Reset(ctx, a.st, ops.Who{Reason: "redo"}, "report/2026-11-28", "fee", false, time.Now())
	var refusal *ops.Refusal
	if !errors.As(want, &refusal) || !strings.HasPrefix(reset.str("error"), want.Error()) || !strings.Contains(reset.str("error"), `"force": true`) {
		t.Errorf("reset refusal %q; want the CLI's %v and the force field", reset.str("error"), want)
	}
	expect(t, "reset no step", a.do("POST", run+"/steps/nope/reset", operateToken, reason("x")), 404, "not_found")
	res := a.do("POST", run+"/steps/load/resolve", operateToken, reason("checked", "as", "done"))
	expect(t, "resolve a step awaiting nothing", res, http.StatusConflict, "needs_decision")
	expect(t, "resolve without as", a.do("POST", run+"/steps/load/resolve", operateToken, reason("checked")), 400, "bad_request", "as")

	// Resume: the claim answers, the attempt runs here.
	rs := a.do("POST", run+"/resume", operateToken, reason("ledger reopened"))
	expect(t, "resume", rs, http.StatusOK)
	if rs.Body["attempt"] != 2.0 || rs.str("operator") != "ops-alice" {
		t.Fatalf("resume answered %s", rs.Raw)
	}
	a.wait("report/2026-11-28")
	// Abandon, then a rerun is refused unless forced.
	expect(t, "abandon", a.do("POST", run+"/abandon", operateToken, reason("wrong day")), http.StatusOK)
	rr := a.do("POST", run+"/rerun", operateToken, reason("try again"))
	expect(t, "rerun an abandoned run", rr, http.StatusConflict, "needs_decision")
	_, want = ops.PlanRerun(ctx, a.st, "report/2026-11-28", "", false)
	if want == nil || !strings.HasPrefix(rr.str("error"), ops.UserText(want.Error())) {
		t.Errorf("rerun refusal %q; want the CLI's %v", rr.str("error"), want)
	}
	expect(t, "rerun --force", a.do("POST", run+"/rerun", operateToken, reason("it was the right day", "force", true)), http.StatusOK)
	a.wait("report/2026-11-28")
	fr := a.do("POST", run+"/rerun", operateToken, reason("redo the load", "from_step", "load"))
	expect(t, "rerun from a step without effects", fr, http.StatusOK)
	if !strings.Contains(fr.str("result"), "clears 1 checkpoint: load") {
		t.Errorf("rerun from load answered %s", fr.Raw)
	}
	a.wait("report/2026-11-28")
	expect(t, "rerun from an applied step", a.do("POST", run+"/rerun", operateToken, reason("x", "from_step", "fee")), http.StatusConflict, "needs_decision")

	audit, err := a.st.Audits(ctx, "report/2026-11-28")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, au := range audit {
		lines = append(lines, au.Operator+" "+au.Command+" "+au.Reason)
		if au.Operator == "ops-alice" && !strings.Contains(au.Details, "via HTTP API, request ") {
			t.Errorf("audit %+v does not say it came through the API", au)
		}
	}
	wantLines := []string{"ops-alice resume ledger reopened", "ops-alice abandon wrong day", "ops-alice rerun it was the right day",
		"ops-alice rerun --from-step load redo the load"}
	if strings.Join(lines, "\n") != strings.Join(wantLines, "\n") {
		t.Errorf("audit trail:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(wantLines, "\n"))
	}
	// And GET shows it.
	show := a.do("GET", run, readToken, nil)
	if au, _ := show.Body["audit"].([]any); len(au) != len(wantLines) {
		t.Errorf("GET shows %d audit lines; want %d", len(au), len(wantLines))
	}
}

func TestRecoverAStaleRun(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	// A runner that died: its lease (a custom owner, never known gone) expired.
	old := time.Now().Add(-time.Hour)
	if _, err := a.st.Claim(ctx, checkpoint.ClaimRequest{RunID: "report/2026-11-01", Job: "report", RunKey: "2026-11-01",
		Params: []byte(`{}`), ParamsHash: "h", Owner: "gone-host:1", Now: old, LeaseFor: time.Minute}); err != nil {
		t.Fatal(err)
	}
	stale := a.do("GET", "/api/v1/runs?status=stale", readToken, nil)
	if runs, _ := stale.Body["runs"].([]any); len(runs) != 1 {
		t.Fatalf("stale runs: %s", stale.Raw)
	}
	expect(t, "recover", a.do("POST", "/api/v1/runs/report/2026-11-01/recover", operateToken, reason("host died")), http.StatusOK)
	if info, _ := a.st.Run(ctx, "report/2026-11-01"); info.Run.Status != checkpoint.RunFailed {
		t.Errorf("after recover the run is %s; want failed", info.Run.Status)
	}
}

// A rerun or resume of a run a live runner holds is refused before
// anything is recorded in its audit trail.
func TestRerunOfAHeldRunRecordsNothing(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	if _, err := a.st.Claim(ctx, checkpoint.ClaimRequest{RunID: "report/2026-11-02", Job: "report", RunKey: "2026-11-02",
		Params: []byte(`{}`), ParamsHash: "h", Owner: "live-host:1", Now: time.Now(), LeaseFor: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"rerun", "resume"} {
		expect(t, verb+" of a held run", a.do("POST", "/api/v1/runs/report/2026-11-02/"+verb, operateToken, reason("now")), http.StatusConflict, "held")
	}
	if au, err := a.st.Audits(ctx, "report/2026-11-02"); err != nil || len(au) != 0 {
		t.Errorf("audit after refused operations: %v, %v; want none", au, err)
	}
}

// A job with a concurrency limit that is reached: the API must not answer
// 500 "internal error" (the message only in the log) but a refusal naming
// the limit and its holders, as the CLI does (exit 4, with a hint): 409
// limit_reached, for a start, a resume and a rerun alike.
func TestLimitReachedIs409(t *testing.T) {
	st, _ := checkpointtest.OpenNew(t)
	var reg jobs.Registry
	reg.MustRegister(jobs.Define("ledger", func(ctx context.Context, run *steps.Run, p dayParams) error {
		if p.Fail {
			return errors.New("the ledger is closed")
		}
		return nil
	}, jobs.Limit(1)))
	r, err := runner.New(runner.Config{Store: st, Jobs: &reg})
	if err != nil {
		t.Fatal(err)
	}
	tokens, _ := httpapi.ParseTokens([]byte("ops:operate:" + operateToken + "\n"))
	api, err := httpapi.New(httpapi.Config{Store: st, Jobs: &reg, Starter: httpapi.NewLocal(r), Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api)
	defer srv.Close()
	// A failed run of the job, to resume; then a live one holds the limit.
	limit := checkpoint.Limit{Key: "job:ledger", Max: 1}
	if _, err := r.Run(context.Background(), runner.Request{Job: "ledger", Values: map[string]string{"date": "2026-11-02", "fail": "true"}}); err == nil {
		t.Fatal("the failing ledger run succeeded")
	}
	if _, err := st.Claim(context.Background(), checkpoint.ClaimRequest{RunID: "ledger/2026-11-01", Job: "ledger", RunKey: "2026-11-01",
		Params: []byte(`{}`), ParamsHash: "h", Owner: "live-host:1", Now: time.Now(), LeaseFor: time.Hour,
		Limit: limit}); err != nil {
		t.Fatal(err)
	}
	a := &testAPI{t: t, st: st, srv: srv}
	got := a.do("POST", "/api/v1/runs", operateToken, start("ledger", "2026-11-28"))
	if got.Status == http.StatusInternalServerError {
		t.Fatalf("a start over the job's limit: %d %s; want a refusal naming the limit (409/429/503), or the run queued", got.Status, got.Raw)
	}
	check := func(what string, got answer, runID string) {
		t.Helper()
		expect(t, what, got, http.StatusConflict, "limit_reached")
		holders, _ := got.Body["holders"].([]any)
		if got.str("limit") != "job:ledger" || len(holders) != 1 || holders[0] != "ledger/2026-11-01" {
			t.Errorf("%s: limit %q, holders %v; want job:ledger held by ledger/2026-11-01", what, got.str("limit"), holders)
		}
		// The command line's words: the store's error, and what to do.
		want := (&checkpoint.LimitReachedError{RunID: runID, Limit: limit, Holders: []string{"ledger/2026-11-01"}}).Error()
		if !strings.Contains(got.str("error"), want) || !strings.Contains(got.str("error"), "when one of those runs has ended") {
			t.Errorf("%s: error %q; want it to say %q and what to do", what, got.str("error"), want)
		}
	}
	check("a start over the job's limit", got, "ledger/2026-11-28")
	for _, verb := range []string{"resume", "rerun"} {
		check("a "+verb+" over the job's limit", a.do("POST", "/api/v1/runs/ledger/2026-11-02/"+verb, operateToken, map[string]any{"reason": "the ledger is open"}),
			"ledger/2026-11-02")
	}
	if runs, _ := st.Runs(context.Background(), checkpoint.RunFilter{}); len(runs) != 2 {
		t.Errorf("after the refusals, %d runs; want the 2 there were", len(runs))
	}
}
