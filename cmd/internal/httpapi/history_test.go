package httpapi_test

import (
	"net/http"
	"testing"
)

// GET /api/v1/jobs/{job}/history: the job's latest runs, oldest first,
// with their durations and batch items, and its runs counted by status,
// as the dashboard's job page draws them.
func TestJobHistory(t *testing.T) {
	a := newAPI(t)
	for _, p := range []map[string]any{start("settle", "2026-11-27"), start("settle", "2026-11-28")} {
		got := a.do("POST", "/api/v1/runs", operateToken, p)
		expect(t, "start", got, http.StatusCreated)
		a.wait(got.str("id"))
	}
	got := a.do("GET", "/api/v1/jobs/settle/history?limit=5", readToken, nil)
	expect(t, "history", got, http.StatusOK)
	runs, _ := got.Body["runs"].([]any)
	if len(runs) != 2 || got.Body["batch"] != true {
		t.Fatalf("history = %s; want 2 runs with batch items", got.Raw)
	}
	first := runs[0].(map[string]any)
	if first["id"] != "settle/2026-11-27" || first["status"] != "succeeded" || first["posted"] != 3.0 || first["rejected"] != 1.0 {
		t.Errorf("oldest run = %v; want settle/2026-11-27 succeeded, 3 posted, 1 rejected", first)
	}
	counts := got.Body["run_counts"].(map[string]any)
	if counts["total"] != 2.0 {
		t.Errorf("run_counts = %v; want 2 runs", counts)
	}
	expect(t, "bad limit", a.do("GET", "/api/v1/jobs/settle/history?limit=0", readToken, nil), http.StatusBadRequest, "bad_request", "limit")
	expect(t, "unknown parameter", a.do("GET", "/api/v1/jobs/settle/history?after=x", readToken, nil), http.StatusBadRequest)
	expect(t, "no token", a.do("GET", "/api/v1/jobs/settle/history", "", nil), http.StatusUnauthorized)
	got = a.do("GET", "/api/v1/jobs/none/history", readToken, nil)
	expect(t, "history of a job without runs", got, http.StatusOK)
	if runs, _ := got.Body["runs"].([]any); runs == nil || len(runs) != 0 {
		t.Errorf("history of a job without runs = %s; want an empty list", got.Raw)
	}
}
