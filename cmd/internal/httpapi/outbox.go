package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// OutboxView is the answer of GET /api/v1/outbox.
type OutboxView struct {
	// Messages are the messages selected, oldest first, each as
	// `stepwise outbox --json` shows it.
	Messages []ops.OutboxView `json:"messages"`
	// More says that more messages match than limit: raise it for them.
	More bool `json:"more,omitempty"`
}

var messageStatuses = []string{checkpoint.MessageQueued, checkpoint.MessageSent, checkpoint.MessageDead}

func (s *Server) listOutbox(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	oq := ops.OutboxQuery{Status: q.Get("status"), RunID: q.Get("run")}
	if oq.Status != "" && !contains(messageStatuses, oq.Status) {
		s.fail(w, r, badRequest("status", "status %q: want one of %s", oq.Status, strings.Join(messageStatuses, ", ")))
		return
	}
	limit, err := parseLimit(q, 100, 1000)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	oq.Limit = limit + 1 // one more tells whether there are more
	msgs, err := ops.ListOutbox(r.Context(), s.cfg.Store, oq)
	if errors.Is(err, checkpoint.ErrNotFound) {
		err = &apiError{Status: http.StatusNotFound, Code: "not_found", Field: "run", Message: fmt.Sprintf("no run %q", oq.RunID)}
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v := OutboxView{Messages: msgs}
	if len(msgs) > limit {
		v.Messages, v.More = msgs[:limit], true
	}
	writeJSON(w, http.StatusOK, v)
}

// RequeueBody is the body of POST /api/v1/outbox/requeue: the dead
// messages to send again, by exactly one of Keys, Run and AllDead, and
// why.
type RequeueBody struct {
	// Keys are messages by key (RUN_ID/STEP_ID, as GET /api/v1/outbox
	// lists them).
	Keys []string `json:"keys,omitempty"`
	// Run selects every dead message of this run.
	Run string `json:"run,omitempty"`
	// AllDead selects every dead message in the outbox.
	AllDead bool `json:"all_dead,omitempty"`
	// Reason says what was fixed, for the audit trail of each run whose
	// messages are requeued. Required.
	Reason string `json:"reason"`
}

// RequeueView is the answer of POST /api/v1/outbox/requeue: what
// `stepwise outbox requeue --json` prints, and the outcome in words.
type RequeueView struct {
	ops.RequeueView
	// Result says what was requeued and why each named message that was
	// not dead was left as it is.
	Result string `json:"result"`
}

// selection is the dead messages b names, or a 400 naming the field at
// fault.
func (b RequeueBody) selection() (ops.DeadLetters, error) {
	var given []string
	if len(b.Keys) > 0 {
		given = append(given, `"keys"`)
	}
	if b.Run != "" {
		given = append(given, `"run"`)
	}
	if b.AllDead {
		given = append(given, `"all_dead"`)
	}
	switch {
	case len(given) == 0:
		return ops.DeadLetters{}, badRequest("keys", `name the dead messages with exactly one of "keys": [KEY, ...], "run": RUN_ID or "all_dead": true; `+
			`GET /api/v1/outbox?status=dead lists them`)
	case len(given) > 1:
		return ops.DeadLetters{}, badRequest(strings.Trim(given[1], `"`), `name the dead messages with exactly one of "keys", "run" or "all_dead"; this gives %s`,
			strings.Join(given, " and "))
	}
	for i, k := range b.Keys {
		if strings.TrimSpace(k) == "" {
			return ops.DeadLetters{}, badRequest("keys", `"keys"[%d] is empty; a key is RUN_ID/STEP_ID, as GET /api/v1/outbox lists it`, i)
		}
	}
	if strings.TrimSpace(b.Reason) == "" {
		return ops.DeadLetters{}, badRequest("reason", `outbox requeue needs "reason": what was fixed, for the audit trail`)
	}
	return ops.DeadLetters{Keys: b.Keys, RunID: b.Run, All: b.AllDead}, nil
}

func (s *Server) requeueOutbox(w http.ResponseWriter, r *http.Request) {
	var b RequeueBody
	if err := s.decode(r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	sel, err := b.selection()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	id, _ := Caller(r)
	who := ops.Who{Operator: id.Name, Reason: b.Reason, Via: "HTTP API, request " + RequestID(r)}
	res, a, err := ops.RequeueDead(r.Context(), s.cfg.Store, who, sel, s.cfg.Now())
	var unknown *checkpoint.UnknownMessagesError
	switch {
	case errors.As(err, &unknown):
		err = &apiError{Status: http.StatusNotFound, Code: "not_found", Field: "keys", Message: err.Error()}
	case errors.Is(err, checkpoint.ErrNotFound) && b.Run != "":
		err = &apiError{Status: http.StatusNotFound, Code: "not_found", Field: "run", Message: fmt.Sprintf("no run %q", b.Run)}
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v := RequeueView{RequeueView: ops.ViewRequeue(res, a), Result: requeueResult(res)}
	s.cfg.Logger.Info().Str("request_id", RequestID(r)).Str("token", id.Name).Str("operation", a.Command).
		Int("requeued", len(res.Requeued)).Int("not_dead", len(res.NotDead)).Msg("api operation")
	writeJSON(w, http.StatusOK, v)
}

// requeueResult is the outcome of a requeue in words.
func requeueResult(res checkpoint.RequeueResult) string {
	out := "no dead messages; nothing requeued"
	switch n := len(res.Requeued); {
	case n == 1:
		out = "requeued 1 dead message, due now"
	case n > 1:
		out = fmt.Sprintf("requeued %d dead messages, due now", n)
	}
	for _, m := range res.NotDead {
		out += "; " + ops.NotDeadText(m)
	}
	return out
}
