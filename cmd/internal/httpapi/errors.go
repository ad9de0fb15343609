package httpapi

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// ErrorView is the JSON body of every error answer.
type ErrorView struct {
	// Error says what is wrong and what to do, in words.
	Error string `json:"error"`
	// Code is a stable word for what kind of error it is: bad_json,
	// bad_params, bad_request, bad_text, unauthenticated, forbidden, csrf,
	// cross_origin, not_found, conflict, held, needs_decision,
	// idempotency_conflict, params_mismatch, limit_reached, too_large,
	// busy, misdirected, throttled, internal.
	Code string `json:"code"`
	// Field names the request field at fault (params.date, reason,
	// Idempotency-Key), when one is.
	Field string `json:"field,omitempty"`
	// Limit and Holders, for limit_reached: the concurrency limit's key
	// (job:NAME, or the job's own) and the runs holding it now.
	Limit   string   `json:"limit,omitempty"`
	Holders []string `json:"holders,omitempty"`
	// RequestID is the request's id, as the server's log has it.
	RequestID string `json:"request_id"`
}

// apiError is an error answered with its own status and words.
type apiError struct {
	Status  int
	Code    string
	Field   string
	Message string
	Limit   string   // limit_reached: the limit's key
	Holders []string // limit_reached: the runs holding it
}

func (e *apiError) Error() string { return e.Message }

// fail answers err: an *apiError as it is; an error of the store, the
// runner or ops by what it means (the same words as the command line);
// anything else as 500 with the request id only, its text in the log.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	e := classify(err)
	if e == nil {
		s.cfg.Logger.Error().Err(err).Str("request_id", RequestID(r)).Str("method", r.Method).Str("path", r.URL.Path).Msg("api request failed")
		e = &apiError{Status: http.StatusInternalServerError, Code: "internal",
			Message: "internal error; the server's log has it under request id " + RequestID(r)}
	}
	writeJSON(w, e.Status, ErrorView{Error: ops.UserText(e.Message), Code: e.Code, Field: e.Field, Limit: e.Limit, Holders: e.Holders, RequestID: RequestID(r)})
}

// classify maps an error to its answer; nil for an unexpected one.
func classify(err error) *apiError {
	var (
		api      *apiError
		refusal  *ops.Refusal
		nostep   *ops.NoStepError
		held     *checkpoint.LeaseHeldError
		reached  *checkpoint.LimitReachedError
		mismatch *checkpoint.ParamsMismatchError
		param    *jobs.ParamError
		text     *ops.TextError
	)
	switch {
	case errors.As(err, &api):
		return api
	case errors.As(err, &text):
		return &apiError{Status: http.StatusBadRequest, Code: "bad_text", Field: text.Field, Message: err.Error()}
	case errors.Is(err, checkpoint.ErrBadAudit):
		return &apiError{Status: http.StatusBadRequest, Code: "bad_text", Message: err.Error()}
	case errors.As(err, &nostep):
		return &apiError{Status: http.StatusNotFound, Code: "not_found", Message: err.Error()}
	case errors.As(err, &refusal):
		return &apiError{Status: http.StatusConflict, Code: "needs_decision", Message: err.Error() + forceHint(refusal)}
	case errors.As(err, &held):
		return &apiError{Status: http.StatusConflict, Code: "held", Message: err.Error() + "; try again once it ends, or recover it if its runner is gone"}
	case errors.As(err, &reached):
		// The command line's words (its hint names its own commands).
		return &apiError{Status: http.StatusConflict, Code: "limit_reached", Limit: reached.Limit.Key, Holders: reached.Holders,
			Message: err.Error() + "; start it again when one of those runs has ended"}
	case errors.As(err, &mismatch):
		return &apiError{Status: http.StatusUnprocessableEntity, Code: "params_mismatch", Field: "params", Message: err.Error()}
	case errors.As(err, &param):
		f := "params"
		if param.Param != "" {
			f = "params." + param.Param
		}
		return &apiError{Status: http.StatusBadRequest, Code: "bad_params", Field: f, Message: err.Error()}
	case errors.Is(err, jobs.ErrBadParams):
		return &apiError{Status: http.StatusBadRequest, Code: "bad_params", Field: "params", Message: err.Error()}
	case errors.Is(err, ops.ErrNeedsReason):
		return &apiError{Status: http.StatusBadRequest, Code: "bad_request", Field: "reason", Message: err.Error()}
	case errors.Is(err, ops.ErrBadOutput):
		return &apiError{Status: http.StatusBadRequest, Code: "bad_request", Field: "output", Message: err.Error()}
	case errors.Is(err, ops.ErrNeedsDecision), errors.Is(err, checkpoint.ErrAbandoned), errors.Is(err, checkpoint.ErrPruned),
		errors.Is(err, checkpoint.ErrNotUnknown), errors.Is(err, checkpoint.ErrNotStale):
		return &apiError{Status: http.StatusConflict, Code: "needs_decision", Message: err.Error()}
	case errors.Is(err, checkpoint.ErrFenced):
		return &apiError{Status: http.StatusConflict, Code: "conflict", Message: err.Error()}
	case errors.Is(err, checkpoint.ErrLocked):
		return &apiError{Status: http.StatusServiceUnavailable, Code: "busy", Message: "the checkpoint database is locked by another process; try again"}
	case errors.Is(err, jobs.ErrUnknownJob):
		return &apiError{Status: http.StatusNotFound, Code: "not_found", Message: err.Error()}
	case errors.Is(err, checkpoint.ErrNotFound):
		return &apiError{Status: http.StatusNotFound, Code: "not_found", Message: "not found"}
	case errors.As(err, new(errStopping)):
		return &apiError{Status: http.StatusServiceUnavailable, Code: "busy", Message: err.Error()}
	}
	return nil
}

// forceHint is how a refusal is forced through the API.
func forceHint(r *ops.Refusal) string {
	switch r.Kind {
	case ops.RerunAbandoned:
		return `; "force": true runs it again`
	case ops.RerunSucceeded:
		return `; "force": true runs its job again, skipping every checkpointed step (nothing applies twice); ` +
			`to redo steps give "from_step" and a reason`
	case ops.RerunApplied, ops.ResetApplied, ops.RerunCalled, ops.ResetCalled:
		return "\n" + `send "force": true if that is what you want`
	}
	return ""
}

// notFound is the answer for a run that is not recorded; the store's own
// message names its database, which is not the caller's business.
func notFound(runID string) error {
	return &apiError{Status: http.StatusNotFound, Code: "not_found", Message: fmt.Sprintf("no run %q", runID)}
}

// badRequest is a 400 naming the field at fault.
func badRequest(field, format string, args ...any) error {
	return &apiError{Status: http.StatusBadRequest, Code: "bad_request", Field: field, Message: fmt.Sprintf(format, args...)}
}
