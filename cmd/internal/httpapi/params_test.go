package httpapi_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestUnknownQueryParametersAre400: a query parameter an endpoint does not
// take is refused, naming it and the ones the endpoint takes, instead of
// being ignored (items?after=KEY answered the first page for ever); a
// refused start creates nothing.
func TestUnknownQueryParametersAre400(t *testing.T) {
	a := newAPI(t)
	expect(t, "start settle", a.do("POST", "/api/v1/runs", operateToken, start("settle", "2026-11-28")), http.StatusCreated)
	a.wait("settle/2026-11-28")

	items := "/api/v1/runs/settle/2026-11-28/steps/post/items"
	after := a.do("GET", items+"?status=completed&limit=2&after=T2", readToken, nil)
	expect(t, "items?after=", after, http.StatusBadRequest, "bad_request", "after")
	for _, want := range []string{`unknown query parameter "after"`, "takes status, limit, cursor", `cursor=NEXT`, `"next"`} {
		if !strings.Contains(after.str("error"), want) {
			t.Errorf("items?after= says %q; want it to contain %q", after.str("error"), want)
		}
	}
	for _, c := range []struct{ method, path, field, takes string }{
		{"GET", "/api/v1/runs?job=settle&state=failed", "state", "takes job, status, key_prefix, since, until, limit, cursor"},
		{"GET", "/api/v1/runs/settle/2026-11-28?effects=1", "effects", "takes limit"},
		{"GET", "/api/v1/schedules?count=3", "count", "takes next, from"},
		{"GET", "/api/v1/outbox?state=dead", "state", "takes status, run, limit"},
		{"GET", "/api/v1/session?x=1", "x", "takes no query parameters"},
		{"POST", "/api/v1/runs?dry_run=1", "dry_run", "takes no query parameters"},
	} {
		tok := readToken
		var body any
		if c.method == "POST" {
			tok, body = operateToken, start("settle", "2026-11-29")
		}
		got := a.do(c.method, c.path, tok, body)
		expect(t, c.method+" "+c.path, got, http.StatusBadRequest, "bad_request", c.field)
		if !strings.Contains(got.str("error"), c.takes) {
			t.Errorf("%s %s says %q; want %q", c.method, c.path, got.str("error"), c.takes)
		}
	}
	if got := a.do("GET", "/api/v1/runs/settle/2026-11-29", readToken, nil); got.Status != http.StatusNotFound {
		t.Errorf("the refused POST ?dry_run=1 created its run: %d %s", got.Status, got.Raw)
	}
	// What an endpoint takes still works, the cursor paging on.
	page := a.do("GET", items+"?status=completed&limit=2", readToken, nil)
	expect(t, "first page", page, http.StatusOK)
	next := a.do("GET", items+"?status=completed&limit=2&cursor="+page.str("next"), readToken, nil)
	expect(t, "next page", next, http.StatusOK)
	if got := next.Body["items"].([]any); len(got) != 1 || got[0].(map[string]any)["key"] != "T4" {
		t.Errorf("the cursor's page: %s", next.Raw)
	}
}

// TestAPIErrorsCarryNoGoPackagePrefixes: the API's errors say what is
// wrong without the Go packages' prefixes ("jobs: ", "checkpoint: ").
func TestAPIErrorsCarryNoGoPackagePrefixes(t *testing.T) {
	a := newAPI(t)
	bad := a.do("POST", "/api/v1/runs", operateToken, start("settle", "yesterday"))
	expect(t, "a bad date", bad, http.StatusBadRequest, "bad_params")
	if msg := bad.str("error"); !strings.HasPrefix(msg, "bad parameters: ") || strings.Contains(msg, "jobs: ") {
		t.Errorf("a bad date: %q; want it without the Go package prefix", msg)
	}
	expect(t, "start settle", a.do("POST", "/api/v1/runs", operateToken, start("settle", "2026-11-28")), http.StatusCreated)
	a.wait("settle/2026-11-28")
	ab := a.do("POST", "/api/v1/runs/settle/2026-11-28/abandon", operateToken, map[string]any{"reason": "wrong day"})
	expect(t, "abandon a succeeded run", ab, http.StatusConflict, "needs_decision")
	if msg := ab.str("error"); !strings.Contains(msg, "run already succeeded") || strings.Contains(msg, "checkpoint: ") || strings.Contains(msg, "--") {
		t.Errorf("abandon a succeeded run: %q; want it without a Go package prefix or CLI flags", msg)
	}
}
