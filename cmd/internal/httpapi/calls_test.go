package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner/ops"
	"github.com/stepwise-run/stepwise/steps"
)

// payReceipt is the pay job's call output.
type payReceipt struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
}

// payments counts the pay job's outside calls by idempotency key.
var payments = struct {
	sync.Mutex
	by map[string]int
}{by: map[string]int{}}

func paid(key string) int {
	payments.Lock()
	defer payments.Unlock()
	return payments.by[key]
}

// payJob makes one outside call (pay: counted, then with fail its answer
// is lost, so its outcome is unknown) and records its receipt (record).
var payJob = jobs.Define("pay", func(ctx context.Context, run *steps.Run, p dayParams) error {
	r, err := steps.Call(ctx, run, "pay", func(ctx context.Context, key string) (payReceipt, error) {
		payments.Lock()
		payments.by[key]++
		payments.Unlock()
		if p.Fail {
			return payReceipt{}, steps.OutcomeUnknown(errors.New("the provider's answer was lost"))
		}
		return payReceipt{ID: "r-" + key, Amount: 1200}, nil
	})
	if err != nil {
		return err
	}
	_, err = steps.Do(ctx, run, "record", func(ctx context.Context) (string, error) {
		return fmt.Sprintf("recorded %s for %d", r.ID, r.Amount), nil
	})
	return err
})

// commandsOf is the run's audit trail as "COMMAND | DETAILS" lines.
func (a *testAPI) commandsOf(runID string) []string {
	a.t.Helper()
	as, err := a.st.Audits(context.Background(), runID)
	if err != nil {
		a.t.Fatal(err)
	}
	var out []string
	for _, au := range as {
		out = append(out, au.Command+" | "+au.Details)
	}
	return out
}

// Over the API as on the command line, clearing an outside call that was
// made is refused naming its key and result unless "force": true, and
// the audit names what was cleared.
func TestAPIClearingAMadeCallNeedsForce(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	const runID, key = "pay/2026-11-28", "pay/2026-11-28/pay"
	expect(t, "start", a.do("POST", "/api/v1/runs", operateToken, start("pay", "2026-11-28")), http.StatusCreated)
	a.wait(runID)
	const run = "/api/v1/runs/" + runID
	named := []string{"idempotency key " + key, `completed, result {"id":"r-` + key + `","amount":1200}`, `"force": true`}

	reset := a.do("POST", run+"/steps/pay/reset", operateToken, reason("redo"))
	expect(t, "reset a made call", reset, http.StatusConflict, "needs_decision")
	_, want := ops.Reset(ctx, a.st, ops.Who{Reason: "redo"}, runID, "pay", false, time.Now())
	var refusal *ops.Refusal
	if !errors.As(want, &refusal) || refusal.Kind != ops.ResetCalled || !strings.HasPrefix(reset.str("error"), want.Error()) {
		t.Errorf("reset refusal %q; want the CLI's %v", reset.str("error"), want)
	}
	rerun := a.do("POST", run+"/rerun", operateToken, reason("redo", "from_step", "pay"))
	expect(t, "rerun from a made call", rerun, http.StatusConflict, "needs_decision")
	for _, s := range named {
		if !strings.Contains(reset.str("error"), s) || !strings.Contains(rerun.str("error"), s) {
			t.Errorf("the refusals do not say %q:\n%s\n%s", s, reset.str("error"), rerun.str("error"))
		}
	}
	if n := paid(key); n != 1 {
		t.Fatalf("%d payments after the refusals; want 1", n)
	}
	if got := a.commandsOf(runID); len(got) != 0 {
		t.Errorf("audit after refusals: %q; want nothing", got)
	}

	expect(t, "reset forced", a.do("POST", run+"/steps/pay/reset", operateToken, reason("provider lost it", "force", true)), http.StatusOK)
	got := a.commandsOf(runID)
	if len(got) != 1 || !strings.HasPrefix(got[0], "reset --step pay | outside calls cleared") || !strings.Contains(got[0], key) ||
		!strings.Contains(got[0], `"amount":1200`) {
		t.Errorf("audit after a forced reset: %q; want the call cleared with its key and result", got)
	}
	expect(t, "resume", a.do("POST", run+"/resume", operateToken, reason("pay again")), http.StatusOK)
	a.wait(runID)
	if n := paid(key); n != 2 {
		t.Errorf("%d payments after the forced reset and a resume; want 2", n)
	}
}

// Over the API, resolve refuses an output that does not fit the step's
// output type (400 on "output", naming the shape), and "replace": true
// corrects a resolution until a later attempt used it.
func TestAPIResolveChecksShapeAndReplacesUntilUsed(t *testing.T) {
	a := newAPI(t)
	const runID, key = "pay/2026-11-29", "pay/2026-11-29/pay"
	expect(t, "start", a.do("POST", "/api/v1/runs", operateToken, start("pay", "2026-11-29", "fail", "true")), http.StatusCreated)
	a.wait(runID)
	const step = "/api/v1/runs/" + runID + "/steps/pay"

	bad := a.do("POST", step+"/resolve", operateToken, reason("seen in the dashboard", "as", "done", "output", map[string]any{"id": "rcpt-77", "receipt": 1}))
	expect(t, "resolve with an output that does not fit", bad, http.StatusBadRequest, "bad_request", "output")
	if e := bad.str("error"); !strings.Contains(e, `does not fit its output type {"id": string, "amount": integer (int64)}`) ||
		!strings.Contains(e, `has no field "receipt"`) {
		t.Errorf("the refusal %q does not name the shape and the field", e)
	}
	show := a.do("GET", "/api/v1/runs/"+runID, readToken, nil)
	if !strings.Contains(show.Raw, `"output_shape": "{\"id\": string, \"amount\": integer (int64)}"`) || !strings.Contains(show.Raw, `"key": "`+key+`"`) {
		t.Errorf("the run's view does not give the call's key and shape: %s", show.Raw)
	}
	expect(t, "resolve", a.do("POST", step+"/resolve", operateToken, reason("seen", "as", "done", "output", map[string]any{"id": "rcpt-7", "amount": 1200})), http.StatusOK)
	expect(t, "resolve again", a.do("POST", step+"/resolve", operateToken, reason("typo", "as", "done", "output", map[string]any{"id": "rcpt-77", "amount": 1200})),
		http.StatusConflict, "needs_decision")
	rep := a.do("POST", step+"/resolve", operateToken, reason("typo", "as", "done", "replace", true, "output", map[string]any{"id": "rcpt-77", "amount": 1200}))
	expect(t, "replace", rep, http.StatusOK)
	if rep.str("result") != "resolution replaced: resolved as done" {
		t.Errorf("replace answered %s", rep.Raw)
	}
	expect(t, "resume", a.do("POST", "/api/v1/runs/"+runID+"/resume", operateToken, reason("settled")), http.StatusOK)
	a.wait(runID)
	used := a.do("POST", step+"/resolve", operateToken, reason("late", "as", "done", "replace", true, "output", map[string]any{"id": "rcpt-78", "amount": 1200}))
	expect(t, "replace a used resolution", used, http.StatusConflict, "needs_decision")
	if !strings.Contains(used.str("error"), "was used: record was recorded by a later attempt") {
		t.Errorf("the refusal %q does not name the step that used it", used.str("error"))
	}
	if n := paid(key); n != 1 {
		t.Errorf("%d payments; want the 1 whose answer was lost", n)
	}
	got := a.commandsOf(runID)
	var cmds []string
	for _, g := range got {
		cmds = append(cmds, strings.SplitN(g, " | ", 2)[0])
	}
	if strings.Join(cmds, ", ") != "resolve --step pay --as done, resolve --step pay --as done --replace, resume" {
		t.Errorf("audit %q; want the resolve, its replacement and the resume", got)
	}
	if !strings.Contains(got[1], `output {"amount":1200,"id":"rcpt-77"}`) {
		t.Errorf("the replacement's audit %q does not name its output", got[1])
	}
}
