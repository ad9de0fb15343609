package httpapi

import (
	"net/http"

	"github.com/stepwise-run/stepwise/runner/ops"
)

// HistoryView is the answer of GET /api/v1/jobs/{job}/history: the job's
// latest runs, oldest first, with what the dashboard's job page charts,
// and its runs counted by status.
type HistoryView struct {
	ops.JobHistory
	Counts ops.RunCounts `json:"run_counts"`
}

func (s *Server) jobHistory(w http.ResponseWriter, r *http.Request) {
	job := r.PathValue("job")
	if err := ops.CheckText("job", job); err != nil {
		s.fail(w, r, err)
		return
	}
	n, err := parseLimit(r.URL.Query(), ops.HistoryRuns, 200)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	now := ops.Now(r.Context(), s.cfg.Store, s.cfg.Now())
	var v HistoryView
	if v.JobHistory, err = ops.History(r.Context(), s.cfg.Store, job, n, now); err == nil {
		v.Counts, err = ops.CountRuns(r.Context(), s.cfg.Store, ops.RunsQuery{Job: job}, now)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}
