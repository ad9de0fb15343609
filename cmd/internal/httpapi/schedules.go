package httpapi

import (
	"net/http"
	"strconv"

	"github.com/stepwise-run/stepwise/runner/ops"
)

// SchedulesView is the answer of GET /api/v1/schedules.
type SchedulesView struct {
	Schedules []ops.ScheduleView `json:"schedules"`
}

func (s *Server) schedules(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	n := 3
	if v := q.Get("next"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 0 || n > 1000 {
			s.fail(w, r, badRequest("next", "next %q: give a whole number from 0 to 1000", v))
			return
		}
	}
	now := s.cfg.Now()
	after, err := parseTime("from", q.Get("from"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if after.IsZero() {
		after = now
	}
	v := SchedulesView{Schedules: []ops.ScheduleView{}}
	if s.cfg.Schedules == nil {
		writeJSON(w, http.StatusOK, v)
		return
	}
	scheds, err := s.cfg.Schedules()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	states, err := s.cfg.Store.Schedules(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	for _, sc := range scheds {
		sv, err := ops.ViewSchedule(sc, states, now, after, n)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		v.Schedules = append(v.Schedules, sv)
	}
	writeJSON(w, http.StatusOK, v)
}
