package httpapi

import (
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/stepwise-run/stepwise/runner/ops"
)

// SchedulesView is the answer of GET /api/v1/schedules.
type SchedulesView struct {
	Schedules []ops.ScheduleView `json:"schedules"`
	// Note says why fewer fires are listed than asked for, when some are
	// left out (those after lastListed).
	Note string `json:"note,omitempty"`
}

// lastListed is the last time a fire is listed at: JSON (RFC 3339) has
// no year after 9999.
var lastListed = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

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
		if err := ops.AddMissed(&sv, sc, now, s.cfg.MisfireThreshold); err != nil {
			s.fail(w, r, err)
			return
		}
		if cut := slices.IndexFunc(sv.Next, func(f ops.FireView) bool { return f.At.After(lastListed) }); cut >= 0 {
			sv.Next = sv.Next[:cut]
			v.Note = "fires after 9999-12-31T23:59:59Z are not listed: RFC 3339 times end with year 9999"
		}
		v.Schedules = append(v.Schedules, sv)
	}
	writeJSON(w, http.StatusOK, v)
}
