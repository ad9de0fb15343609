package httpapi_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// Every text field of a request is valid UTF-8 without control
// characters (newlines allowed in a reason), checked as it is read: a
// 400 naming the field, on either store (PostgreSQL refuses a NUL in
// text, which was a 500), and nothing changes.
func TestRequestTextIsCheckedNamingTheField(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	expect(t, "start", a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28", "fail", "true")), http.StatusCreated)
	a.wait("report/2026-11-28")
	run := "/api/v1/runs/report/2026-11-28"
	before, err := a.st.Run(ctx, "report/2026-11-28")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		method, path, body, field string
	}{
		{"POST", run + "/abandon", `{"reason":"gone\u0000"}`, "reason"},
		{"POST", run + "/abandon", "{\"reason\":\"caf\xe9\"}", "reason"},
		{"POST", run + "/abandon", `{"reason":"\u001b[2Jcleared"}`, "reason"},
		{"POST", run + "/resume", `{"reason":"ok\u0085"}`, "reason"},
		{"POST", run + "/rerun", `{"reason":"redo","from_step":"load\u0000"}`, "from_step"},
		{"POST", run + "/steps/load/resolve", `{"reason":"checked","as":"done\u0000"}`, "as"},
		{"POST", run + "/steps/load/reset", `{"reason":"one\u0000two"}`, "reason"},
		{"POST", "/api/v1/runs", `{"job":"report","params":{"date":"2026-11-29","note":"x\u0000"}}`, "params.note"},
		{"POST", "/api/v1/runs", "{\"job\":\"rep\xffort\",\"params\":{\"date\":\"2026-11-29\"}}", "job"},
		{"POST", "/api/v1/outbox/requeue", `{"keys":["notify/x\u0000"],"reason":"fixed"}`, "keys[0]"},
		{"POST", "/api/v1/outbox/requeue", `{"run":"report/2026-11-28","reason":"fixed\u0000"}`, "reason"},
		{"GET", "/api/v1/runs?job=re%00port", "", "job"},
		{"GET", "/api/v1/runs?status=%FF", "", "status"},
		{"GET", "/api/v1/outbox?run=report%2F2026%00", "", "run"},
		{"GET", "/api/v1/runs/report/2026-11-28%00", "", "path"},
		{"GET", "/api/v1/runs/report/caf%E9", "", "path"},
		{"POST", "/api/v1/runs/report/2026-11-28%00/abandon", `{"reason":"x"}`, "path"},
	} {
		var body any
		if c.body != "" {
			body = c.body
		}
		got := a.do(c.method, c.path, operateToken, body)
		expect(t, c.method+" "+c.path+" "+c.body, got, http.StatusBadRequest, "bad_text", c.field)
	}
	after, err := a.st.Run(ctx, "report/2026-11-28")
	if err != nil {
		t.Fatal(err)
	}
	if after.Run.Status != checkpoint.RunFailed || after.Run.Fence != before.Run.Fence || len(after.Attempts) != len(before.Attempts) {
		t.Errorf("after the refused requests the run is %+v with %d attempts; want it as it was", after.Run, len(after.Attempts))
	}
	if as, err := a.st.Audits(ctx, "report/2026-11-28"); err != nil || len(as) != 0 {
		t.Errorf("audit after the refused requests: %+v, %v; want none", as, err)
	}
	if _, err := a.st.Run(ctx, "report/2026-11-29"); err == nil {
		t.Errorf("a refused start created its run")
	}
	// A reason may span lines.
	expect(t, "abandon with a reason on two lines", a.do("POST", run+"/abandon", operateToken, reason("wrong day\nsee ticket 42")), http.StatusOK)
	if as, err := a.st.Audits(ctx, "report/2026-11-28"); err != nil || len(as) != 1 || as[0].Reason != "wrong day\nsee ticket 42" {
		t.Errorf("audit of the abandon: %+v, %v; want its reason as given", as, err)
	}
}
