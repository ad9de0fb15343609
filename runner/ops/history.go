package ops

import (
	"context"
	"slices"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// StatusCount is how many runs have one status.
type StatusCount struct {
	Status string `json:"status"`
	Count  int64  `json:"count"`
}

// RunCounts is how many runs a listing selects, by status.
type RunCounts struct {
	// Counts has every status of RunStatuses, in its order, 0 too.
	Counts []StatusCount `json:"counts"`
	Total  int64         `json:"total"`
}

// CountRuns counts the runs q selects (its Status, After and Limit
// ignored) by status as operators see them at now: a running run whose
// lease expired or whose runner is gone counts as StatusStale. The store
// counts them in one aggregate query (checkpoint.Inspector.RunCounts).
func CountRuns(ctx context.Context, st checkpoint.Backend, q RunsQuery, now time.Time) (RunCounts, error) {
	f := checkpoint.RunFilter{Job: q.Job, RunKeyPrefix: q.RunKeyPrefix, CreatedFrom: q.Since, CreatedBefore: q.Until}
	counts, err := st.RunCounts(ctx, f, now)
	if err != nil {
		return RunCounts{}, err
	}
	by := map[string]int64{}
	for _, g := range counts {
		by[countStatus(g)] += g.Count
	}
	var c RunCounts
	for _, s := range RunStatuses {
		c.Counts = append(c.Counts, StatusCount{Status: s, Count: max(by[s], 0)})
		c.Total += max(by[s], 0)
	}
	return c, nil
}

// HistoryRuns is how many runs a job's history holds by default.
const HistoryRuns = 30

// RunPoint is one run of a job's history.
type RunPoint struct {
	ID        string    `json:"id"`
	Key       string    `json:"key"`
	Status    string    `json:"status"` // a run status, or StatusStale
	CreatedAt time.Time `json:"created_at"`
	// Seconds is the time its attempts took, summed (a running one's up
	// to now): what a rerun the next morning does not inflate.
	Seconds  float64 `json:"seconds"`
	Attempts int     `json:"attempts"`
	// Posted, Rejected and Skipped count its batch items, over every
	// batch step: completed, rejected, and skipped by a skip policy.
	Posted   int64 `json:"posted"`
	Rejected int64 `json:"rejected"`
	Skipped  int64 `json:"skipped"`
}

// JobHistory is a job's latest runs, oldest first, for a chart.
type JobHistory struct {
	Job  string     `json:"job"`
	Runs []RunPoint `json:"runs"`
	// Batch says some run of them has batch items: the items chart
	// applies.
	Batch bool `json:"batch"`
}

// History reads job's latest n runs (HistoryRuns if n <= 0) with their
// durations and batch item counts, oldest first, as seen at now.
func History(ctx context.Context, st checkpoint.Backend, job string, n int, now time.Time) (JobHistory, error) {
	if n <= 0 {
		n = HistoryRuns
	}
	h := JobHistory{Job: job, Runs: []RunPoint{}}
	runs, err := st.Runs(ctx, checkpoint.RunFilter{Job: job, Limit: n})
	if err != nil {
		return h, err
	}
	for _, r := range runs {
		p, err := runPoint(ctx, st, r, now)
		if err != nil {
			return h, err
		}
		h.Batch = h.Batch || p.Posted+p.Rejected+p.Skipped > 0
		h.Runs = append(h.Runs, p)
	}
	slices.Reverse(h.Runs) // the store lists newest first
	return h, nil
}

func runPoint(ctx context.Context, st checkpoint.Backend, r checkpoint.Run, now time.Time) (RunPoint, error) {
	p := RunPoint{ID: r.ID, Key: r.RunKey, Status: r.Status, CreatedAt: r.CreatedAt}
	if r.Status == checkpoint.RunRunning && Stale(r, now) {
		p.Status = StatusStale
	}
	info, err := st.Run(ctx, r.ID)
	if err != nil {
		return p, err
	}
	p.Attempts = len(info.Attempts)
	for _, a := range info.Attempts {
		end := a.FinishedAt
		if end.IsZero() {
			end = now
			if r.Status != checkpoint.RunRunning { // lost, never closed: its run's last word
				end = r.UpdatedAt
			}
		}
		if d := end.Sub(a.StartedAt); d > 0 {
			p.Seconds += d.Seconds()
		}
	}
	counts, err := st.ItemCounts(ctx, r.ID)
	if err != nil {
		return p, err
	}
	for _, c := range counts {
		switch c.Status {
		case checkpoint.StepCompleted:
			p.Posted += c.Count
		case checkpoint.StepRejected:
			p.Rejected += c.Count
		case checkpoint.ItemSkipped:
			p.Skipped += c.Count
		}
	}
	return p, nil
}
