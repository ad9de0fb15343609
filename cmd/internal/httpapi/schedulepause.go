package httpapi

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// PauseBody is the body of POST /api/v1/schedules/{name}/pause and
// /unpause.
type PauseBody struct {
	// Reason says why, for the audit trail. Required.
	Reason string `json:"reason"`
	// CatchUp (unpause): run the fires the pause held under the
	// schedule's misfire policy; without it they are skipped.
	CatchUp bool `json:"catch_up,omitempty"`
}

// PauseOpView is the answer of a pause or unpause, from its audit record.
type PauseOpView struct {
	Schedule  string    `json:"schedule"`
	Operation string    `json:"operation"`
	Result    string    `json:"result"`
	Operator  string    `json:"operator"`
	Reason    string    `json:"reason"`
	At        time.Time `json:"at"`
	Link      string    `json:"link"`
}

func (s *Server) schedulePost(w http.ResponseWriter, r *http.Request) {
	name, verb := r.PathValue("name"), r.PathValue("verb")
	if verb != "pause" && verb != "unpause" {
		s.noRoute(w, r)
		return
	}
	var b PauseBody
	if err := s.decode(r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	if strings.TrimSpace(b.Reason) == "" {
		s.fail(w, r, badRequest("reason", `%s needs "reason": why, for the audit trail`, verb))
		return
	}
	if verb == "pause" && b.CatchUp {
		s.fail(w, r, badRequest("catch_up", `"catch_up" is for unpause: it says what becomes of the fires the pause held`))
		return
	}
	var scheds []runner.Schedule
	if s.cfg.Schedules != nil {
		var err error
		if scheds, err = s.cfg.Schedules(); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	id, _ := Caller(r)
	who := ops.Who{Operator: id.Name, Reason: b.Reason, Via: "HTTP API, request " + RequestID(r)}
	var (
		a   checkpoint.Audit
		err error
	)
	v := PauseOpView{Schedule: name, Operation: verb, Link: Prefix + "schedules"}
	if verb == "pause" {
		a, err = ops.PauseSchedule(r.Context(), s.cfg.Store, who, scheds, name, s.cfg.Now())
		v.Result = "paused: no scheduler sharing the store fires it until it is unpaused"
	} else {
		a, err = ops.UnpauseSchedule(r.Context(), s.cfg.Store, who, scheds, name, b.CatchUp, s.cfg.Now())
		v.Result = "unpaused: the fires the pause held are skipped"
		if b.CatchUp {
			v.Result = "unpaused: the fires the pause held catch up under the schedule's misfire policy"
		}
	}
	if errors.Is(err, ops.ErrUnknownSchedule) {
		err = &apiError{Status: http.StatusNotFound, Code: "not_found", Field: "name", Message: err.Error()}
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v.Operator, v.Reason, v.At = a.Operator, a.Reason, a.At
	s.cfg.Logger.Info().Str("request_id", RequestID(r)).Str("token", id.Name).Str("schedule", name).Str("operation", verb).Msg("api operation")
	writeJSON(w, http.StatusOK, v)
}
