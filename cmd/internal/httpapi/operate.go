package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// OperateBody is the body of the operations (POST
// /api/v1/runs/{id}/VERB and /api/v1/runs/{id}/steps/{step}/VERB). Reason
// is required by every one; the others apply where their comment says.
type OperateBody struct {
	// Reason says why, for the audit trail. Required.
	Reason string `json:"reason"`
	// Force: recover a run whose lease has not expired; rerun an abandoned
	// or succeeded run, or from a step, clearing steps whose effects
	// applied or outside calls that were made; resume an abandoned or
	// succeeded run; reset a step whose effects applied or an outside call
	// that was made (the call is made again).
	Force bool `json:"force,omitempty"`
	// FromStep (rerun): clear this step's checkpoint and those of every
	// step that started after it, then run.
	FromStep string `json:"from_step,omitempty"`
	// AcceptChanged (resume, rerun): go on past the batch items whose
	// source changed that the last refusal named.
	AcceptChanged bool `json:"accept_changed,omitempty"`
	// RetrySkipped (resume, rerun): process again the items an earlier
	// attempt skipped.
	RetrySkipped bool `json:"retry_skipped,omitempty"`
	// As (resolve): done (the call happened) or retry (it did not).
	As string `json:"as,omitempty"`
	// Output (resolve as done): the call's result, returned to later
	// steps; it must fit the step's output type (its call.output_shape).
	// Defaults to null.
	Output json.RawMessage `json:"output,omitempty"`
	// Replace (resolve): replace the step's earlier resolution, while no
	// later attempt has recorded a step or batch item since it.
	Replace bool `json:"replace,omitempty"`
}

// OperationView is the answer of an operation, from the audit record it
// made.
type OperationView struct {
	RunID     string    `json:"run_id"`
	Operation string    `json:"operation"`
	Step      string    `json:"step,omitempty"`
	Result    string    `json:"result"`
	Operator  string    `json:"operator"`
	Reason    string    `json:"reason"`
	At        time.Time `json:"at"`
	Link      string    `json:"link"`
	// Attempt is the attempt a resume or rerun claimed.
	Attempt int `json:"attempt,omitempty"`
}

// verbs are the operations and whether each is on a step.
var verbs = map[string]bool{"resume": false, "rerun": false, "abandon": false, "recover": false, "reset": true, "resolve": true}

func (s *Server) runPost(w http.ResponseWriter, r *http.Request) {
	p, ok := s.parseRunPath(r)
	if onStep, known := verbs[p.Verb]; !ok || !known || onStep != (p.Step != "") {
		s.noRoute(w, r)
		return
	}
	var b OperateBody
	if err := s.decode(r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	if strings.TrimSpace(b.Reason) == "" {
		s.fail(w, r, badRequest("reason", `%s needs "reason": why, for the audit trail`, p.Verb))
		return
	}
	ctx := r.Context()
	if _, err := s.cfg.Store.Run(ctx, p.RunID); err != nil {
		if errors.Is(err, checkpoint.ErrNotFound) {
			err = notFound(p.RunID)
		}
		s.fail(w, r, err)
		return
	}
	id, _ := Caller(r)
	who := ops.Who{Operator: id.Name, Reason: b.Reason, Via: "HTTP API, request " + RequestID(r)}
	now := s.cfg.Now()
	v := OperationView{RunID: p.RunID, Operation: p.Verb, Step: p.Step, Operator: id.Name, Reason: b.Reason, At: now, Link: RunLink(p.RunID)}
	var (
		a   checkpoint.Audit
		err error
	)
	switch p.Verb {
	case "recover":
		a, err = ops.Recover(ctx, s.cfg.Store, who, p.RunID, b.Force, now)
		v.Result = "failed (resumable)"
	case "abandon":
		a, err = ops.Abandon(ctx, s.cfg.Store, who, p.RunID, now)
		v.Result = "abandoned"
	case "reset":
		a, err = ops.Reset(ctx, s.cfg.Store, who, p.RunID, p.Step, b.Force, now)
		v.Result = "cleared"
	case "resolve":
		if b.As != "done" && b.As != "retry" {
			s.fail(w, r, badRequest("as", `resolve needs "as": "done" (the call happened) or "retry" (it did not)`))
			return
		}
		out := []byte(b.Output)
		if len(out) == 0 {
			out = []byte("null")
		}
		a, err = ops.Resolve(ctx, s.cfg.Store, who, p.RunID, p.Step, b.As == "done", b.Replace, out, now)
		v.Result = "resolved as " + b.As
		if b.Replace {
			v.Result = "resolution replaced: resolved as " + b.As
		}
	case "resume", "rerun":
		s.resume(w, r, p, b, who, v)
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v.Operator, v.At = a.Operator, a.At
	s.cfg.Logger.Info().Str("request_id", RequestID(r)).Str("token", id.Name).Str("run_id", p.RunID).Str("operation", p.Verb).Msg("api operation")
	writeJSON(w, http.StatusOK, v)
}

// resume resumes or reruns a run: the claim is made before the answer
// (so its refusals are this request's), the attempt runs through the
// Starter.
func (s *Server) resume(w http.ResponseWriter, r *http.Request, p runPath, b OperateBody, who ops.Who, v OperationView) {
	ctx, now := r.Context(), s.cfg.Now()
	if p.Verb == "resume" && b.FromStep != "" {
		s.fail(w, r, badRequest("from_step", `"from_step" is for rerun; resume goes on where the run stopped`))
		return
	}
	// A run a live runner holds is refused before anything is recorded.
	if info, err := s.cfg.Store.Run(ctx, p.RunID); err == nil && info.Run.Status == checkpoint.RunRunning && !ops.Stale(info.Run, now) {
		s.fail(w, r, &checkpoint.LeaseHeldError{RunID: p.RunID, Owner: info.Run.LeaseOwner, Until: info.Run.LeaseUntil})
		return
	}
	// The operation's audit record commits with the claim, before any
	// step runs: a record that cannot be written claims nothing.
	res, err := ops.Resume(who, p.RunID, p.Verb, b.FromStep, b.AcceptChanged, now)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if p.Verb == "rerun" {
		plan, err := ops.PlanRerun(ctx, s.cfg.Store, p.RunID, b.FromStep, b.Force)
		if err == nil {
			err = plan.Record(ctx, s.cfg.Store, who, now)
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		if c := plan.Clears(); c != "" {
			v.Result = c + "; "
		}
	}
	// The claim is not cut short by a client that hangs up: a run
	// claimed is recorded as such, and executed.
	ctx = context.WithoutCancel(ctx)
	started, err := s.cfg.Starter.Resume(ctx, p.RunID, runner.Request{Force: b.Force, RetrySkipped: b.RetrySkipped,
		AcceptChanged: res.Accept, Audits: res.Audits})
	if errors.Is(err, checkpoint.ErrAlreadySucceeded) {
		v.Result += "nothing to do: " + err.Error() + ` ("force": true runs its job again, skipping every checkpointed step)`
		writeJSON(w, http.StatusOK, v)
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v.Result += started.Status
	if info, err := s.cfg.Store.Run(ctx, p.RunID); err == nil && len(info.Attempts) > 0 {
		v.Attempt = info.Attempts[len(info.Attempts)-1].Number
	}
	s.cfg.Logger.Info().Str("request_id", RequestID(r)).Str("token", who.Operator).Str("run_id", p.RunID).Str("operation", p.Verb).Msg("api operation")
	writeJSON(w, http.StatusOK, v)
}
