package httpapi_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/cmd/internal/httpapi"
	"github.com/stepwise-run/stepwise/runner"
)

// POST /api/v1/schedules/{name}/pause and /unpause: audited under the
// token's name, refused with 400 or 404 naming the field, 409 when it does
// not apply, 403 for a read token, and a cookie write needs its CSRF token.
func TestSchedulePauseThroughTheAPI(t *testing.T) {
	clk := newClock()
	sched := runner.Schedule{Name: "nightly", Job: "report", Spec: "0 2 * * *", Location: time.UTC}
	a := newAPI(t, func(c *httpapi.Config) {
		c.Now = clk.Now
		c.Schedules = func() ([]runner.Schedule, error) { return []runner.Schedule{sched}, nil }
	})
	// A serve fired it (and stopped).
	if _, err := a.st.ClaimSchedule(context.Background(), checkpoint.ScheduleClaimRequest{Name: "nightly", Owner: "serve:1", Now: clk.Now(), LeaseFor: time.Minute}); err != nil {
		t.Fatal(err)
	}
	pause := "/api/v1/schedules/nightly/pause"
	expect(t, "read token", a.do("POST", pause, readToken, map[string]any{"reason": "x"}), http.StatusForbidden, "forbidden")
	expect(t, "no reason", a.do("POST", pause, operateToken, map[string]any{}), http.StatusBadRequest, "bad_request", "reason")
	expect(t, "control character", a.do("POST", pause, operateToken, map[string]any{"reason": "x\u001b[2J"}), http.StatusBadRequest, "bad_text", "reason")
	expect(t, "catch_up on pause", a.do("POST", pause, operateToken, map[string]any{"reason": "x", "catch_up": true}), http.StatusBadRequest, "bad_request", "catch_up")
	expect(t, "unknown field", a.do("POST", pause, operateToken, map[string]any{"reason": "x", "force": true}), http.StatusBadRequest, "bad_json", "force")
	expect(t, "unknown schedule", a.do("POST", "/api/v1/schedules/weekly/pause", operateToken, map[string]any{"reason": "x"}), http.StatusNotFound, "not_found", "name")
	expect(t, "bad text in the name", a.do("POST", "/api/v1/schedules/night%07ly/pause", operateToken, map[string]any{"reason": "x"}), http.StatusBadRequest, "bad_text", "path")
	expect(t, "unknown verb", a.do("POST", "/api/v1/schedules/nightly/stop", operateToken, map[string]any{"reason": "x"}), http.StatusNotFound)

	cookie, csrf := a.login(operateToken)
	expect(t, "cookie write without CSRF", a.do("POST", pause, "", map[string]any{"reason": "x"}, "Cookie", cookie), http.StatusForbidden, "csrf")
	got := a.do("POST", pause, "", map[string]any{"reason": "bank holiday"}, "Cookie", cookie, httpapi.CSRFHeader, csrf)
	expect(t, "pause", got, http.StatusOK)
	if got.str("operator") != "ops-alice" || got.str("operation") != "pause" || got.str("reason") != "bank holiday" {
		t.Errorf("pause answered %s; want it done by ops-alice", got.Raw)
	}
	expect(t, "pause again", a.do("POST", pause, operateToken, map[string]any{"reason": "x"}), http.StatusConflict, "needs_decision")

	clk.advance(3 * 24 * time.Hour)
	got = a.do("GET", "/api/v1/schedules?next=0", readToken, nil)
	expect(t, "list", got, http.StatusOK)
	if !strings.Contains(got.Raw, `"by": "ops-alice"`) || !strings.Contains(got.Raw, `"reason": "bank holiday"`) || !strings.Contains(got.Raw, `"held_by_pause"`) {
		t.Errorf("schedules while paused = %s; want who paused it and the fires held", got.Raw)
	}
	got = a.do("POST", "/api/v1/schedules/nightly/unpause", operateToken, map[string]any{"reason": "holiday over"})
	expect(t, "unpause", got, http.StatusOK)
	if !strings.Contains(got.str("result"), "skipped") {
		t.Errorf("unpause answered %s; want it to say the held fires are skipped", got.Raw)
	}
	expect(t, "unpause again", a.do("POST", "/api/v1/schedules/nightly/unpause", operateToken, map[string]any{"reason": "x", "catch_up": true}),
		http.StatusConflict, "needs_decision")
	as, err := a.st.Audits(context.Background(), checkpoint.ScheduleAuditID("nightly"))
	if err != nil || len(as) != 2 || as[0].Operator != "ops-alice" || !strings.Contains(as[0].Details, "HTTP API, request ") || as[1].Command != "schedules unpause" {
		t.Errorf("audit = %+v, %v; want ops-alice's pause and unpause, through the API", as, err)
	}
	got = a.do("GET", "/api/v1/schedules?next=0", readToken, nil)
	if strings.Contains(got.Raw, `"paused"`) || !strings.Contains(got.Raw, `"skipped_for_pause"`) {
		t.Errorf("schedules after unpause = %s; want not paused, the skipped fires listed", got.Raw)
	}
}
