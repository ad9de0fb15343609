package checkpoint_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// MayClaim is the claim rule every store applies to an existing run.
func TestMayClaim(t *testing.T) {
	now := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	req := checkpoint.ClaimRequest{RunID: "j/k", ParamsHash: "h", Params: []byte(`{"a":1}`), Owner: "b:2"}
	base := checkpoint.Run{ID: "j/k", ParamsHash: "h", Params: []byte(`{"a":1}`)}
	with := func(f func(*checkpoint.Run)) checkpoint.Run { r := base; f(&r); return r }
	gone := func(string) bool { return true }
	var held *checkpoint.LeaseHeldError
	var mismatch *checkpoint.ParamsMismatchError
	for _, c := range []struct {
		name  string
		run   checkpoint.Run
		req   func(*checkpoint.ClaimRequest)
		check func(checkpoint.Takeover, error) bool
	}{
		{"failed run resumes", with(func(r *checkpoint.Run) { r.Status = checkpoint.RunFailed }), nil,
			func(tk checkpoint.Takeover, err error) bool { return err == nil && tk.From == "" }},
		{"pruned is refused even forced", with(func(r *checkpoint.Run) { r.Status = checkpoint.RunSucceeded; r.PrunedAt = now }),
			func(q *checkpoint.ClaimRequest) { q.Force = true },
			func(_ checkpoint.Takeover, err error) bool { return errors.Is(err, checkpoint.ErrPruned) }},
		{"other parameters", with(func(r *checkpoint.Run) { r.Status = checkpoint.RunFailed; r.ParamsHash = "x" }), nil,
			func(_ checkpoint.Takeover, err error) bool { return errors.As(err, &mismatch) }},
		{"succeeded needs force", with(func(r *checkpoint.Run) { r.Status = checkpoint.RunSucceeded }), nil,
			func(_ checkpoint.Takeover, err error) bool { return errors.Is(err, checkpoint.ErrAlreadySucceeded) }},
		{"succeeded forced", with(func(r *checkpoint.Run) { r.Status = checkpoint.RunSucceeded }), func(q *checkpoint.ClaimRequest) { q.Force = true },
			func(_ checkpoint.Takeover, err error) bool { return err == nil }},
		{"abandoned needs force", with(func(r *checkpoint.Run) { r.Status = checkpoint.RunAbandoned }), nil,
			func(_ checkpoint.Takeover, err error) bool { return errors.Is(err, checkpoint.ErrAbandoned) }},
		{"live lease is held, even forced", with(func(r *checkpoint.Run) {
			r.Status, r.LeaseOwner, r.LeaseUntil = checkpoint.RunRunning, "a:1", now.Add(time.Second)
		}), func(q *checkpoint.ClaimRequest) { q.Force = true },
			func(_ checkpoint.Takeover, err error) bool { return errors.As(err, &held) && held.Owner == "a:1" }},
		{"live lease of a gone owner is taken over", with(func(r *checkpoint.Run) {
			r.Status, r.LeaseOwner, r.LeaseUntil = checkpoint.RunRunning, "a:1", now.Add(time.Second)
		}), func(q *checkpoint.ClaimRequest) { q.OwnerGone = gone },
			func(tk checkpoint.Takeover, err error) bool {
				return err == nil && tk.From == "a:1" && tk.LeaseUntil.Equal(now.Add(time.Second))
			}},
		{"expired lease is taken over at its end", with(func(r *checkpoint.Run) {
			r.Status, r.LeaseOwner, r.LeaseUntil = checkpoint.RunRunning, "a:1", now
		}), nil,
			func(tk checkpoint.Takeover, err error) bool { return err == nil && tk.From == "a:1" }},
	} {
		q := req
		if c.req != nil {
			c.req(&q)
		}
		tk, err := checkpoint.MayClaim(c.run, q, now)
		if !c.check(tk, err) {
			t.Errorf("%s: takeover %+v, error %v", c.name, tk, err)
		}
	}
}

// Resolution is the resolve rule every store applies: it settles a call
// of unknown outcome, and replaces only a resolution no later checkpoint
// used.
func TestResolution(t *testing.T) {
	run := checkpoint.Run{ID: "pay/k"}
	at := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	a := checkpoint.Audit{Operator: "alice", Reason: "not at the provider", At: at}
	calling := checkpoint.ResolveState{Run: run, StepID: "pay", Status: checkpoint.StepCalling,
		Call: checkpoint.CallRecord{Key: "pay/k/pay"}.Encode(), LastAttempt: 3}
	st, msg, call, err := checkpoint.Resolution(calling, a, true, false)
	if err != nil || st != checkpoint.StepCompleted || msg != "" {
		t.Errorf("done: %q %q %v", st, msg, err)
	}
	rec, err := checkpoint.DecodeCallRecord(call)
	if err != nil || rec.Key != "pay/k/pay" || rec.Resolved == nil || *rec.Resolved != (checkpoint.CallResolution{As: "done", Operator: "alice", At: at, AfterAttempt: 3}) {
		t.Errorf("done: call record %s (%v)", call, err)
	}
	if st, msg, _, err := checkpoint.Resolution(calling, a, false, false); err != nil || st != checkpoint.StepFailed ||
		msg != "resolved by alice as not done: not at the provider" {
		t.Errorf("retry: %q %q %v", st, msg, err)
	}
	completed := checkpoint.ResolveState{Run: run, StepID: "pay", Status: checkpoint.StepCompleted}
	if _, _, _, err := checkpoint.Resolution(completed, a, true, false); !errors.Is(err, checkpoint.ErrNotUnknown) {
		t.Errorf("a completed step: %v; want ErrNotUnknown", err)
	}
	if _, _, _, err := checkpoint.Resolution(completed, a, true, true); !errors.Is(err, checkpoint.ErrNotResolved) {
		t.Errorf("replace on a step completed by its call: %v; want ErrNotResolved", err)
	}
	resolved := checkpoint.ResolveState{Run: run, StepID: "pay", Status: checkpoint.StepCompleted, Call: call, LastAttempt: 3}
	if _, _, _, err := checkpoint.Resolution(resolved, a, true, false); !errors.Is(err, checkpoint.ErrNotUnknown) ||
		!strings.Contains(err.Error(), "resolved as done by alice") {
		t.Errorf("resolve again without replace: %v; want ErrNotUnknown naming the resolution", err)
	}
	if st, _, _, err := checkpoint.Resolution(resolved, a, false, true); err != nil || st != checkpoint.StepFailed {
		t.Errorf("replace an unused resolution: %q %v", st, err)
	}
	resolved.UsedBy = "report"
	if _, _, _, err := checkpoint.Resolution(resolved, a, true, true); !errors.Is(err, checkpoint.ErrResolutionUsed) ||
		!strings.Contains(err.Error(), "report was recorded by a later attempt") {
		t.Errorf("replace a used resolution: %v; want ErrResolutionUsed naming report", err)
	}
}

// Recovery, Abandonment and Reopening are the operator rules every store
// applies before its own SQL.
func TestOperatorRules(t *testing.T) {
	a := checkpoint.Audit{Operator: "alice", Command: "reset --step s", Reason: "why"}
	running := checkpoint.Run{ID: "j/k", Status: checkpoint.RunRunning}
	var held *checkpoint.LeaseHeldError
	if msg, err := checkpoint.Recovery(running, a, false, false); err != nil || msg != "recovered by alice: why" {
		t.Errorf("recover a stale run: %q, %v", msg, err)
	}
	if _, err := checkpoint.Recovery(running, a, true, false); !errors.Is(err, checkpoint.ErrNotStale) || !errors.As(err, &held) {
		t.Errorf("recover a held run: %v; want ErrNotStale with a *LeaseHeldError", err)
	}
	if _, err := checkpoint.Recovery(running, a, true, true); err != nil {
		t.Errorf("recover a held run, forced: %v", err)
	}
	if _, err := checkpoint.Recovery(checkpoint.Run{Status: checkpoint.RunFailed}, a, false, false); !errors.Is(err, checkpoint.ErrNotStale) || errors.As(err, &held) {
		t.Errorf("recover a run that is not running: %v; want ErrNotStale alone", err)
	}
	for st, want := range map[string]error{checkpoint.RunAbandoned: checkpoint.ErrAbandoned, checkpoint.RunSucceeded: checkpoint.ErrAlreadySucceeded} {
		if _, err := checkpoint.Abandonment(checkpoint.Run{Status: st}, a); !errors.Is(err, want) {
			t.Errorf("abandon a %s run: %v; want %v", st, err, want)
		}
	}
	if msg, err := checkpoint.Abandonment(running, a); err != nil || msg != "abandoned by alice: why" {
		t.Errorf("abandon a running run: %q, %v", msg, err)
	}
	if _, err := checkpoint.Reopening(checkpoint.Run{PrunedAt: time.Unix(1, 0)}, a); !errors.Is(err, checkpoint.ErrPruned) {
		t.Errorf("reset a pruned run: %v; want ErrPruned", err)
	}
	if msg, err := checkpoint.Reopening(running, a); err != nil || msg != "reopened by alice (reset --step s): why" {
		t.Errorf("reset: %q, %v", msg, err)
	}
}
