package ops

import (
	"context"
	"slices"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
)

// JobRuns is what the store holds of one job's runs: how many are in each
// of RunStatuses (running split into running and StatusStale) and when
// its latest run succeeded.
type JobRuns struct {
	Job string
	// ByStatus has every status of RunStatuses, those without a run at 0.
	ByStatus map[string]int64
	// LastSuccess is the latest end of the job's succeeded runs; zero when
	// none succeeded.
	LastSuccess time.Time
}

// CountJobRuns counts the runs of every job in st (and of each of jobs,
// with none, at 0) by status at now, in one read of the store
// (checkpoint.Inspector.RunCounts): a running run is stale as Stale
// judges it, its lease expired or its owner surely gone. Jobs are in name
// order.
func CountJobRuns(ctx context.Context, st checkpoint.Backend, jobs []string, now time.Time) ([]JobRuns, error) {
	counts, err := st.RunCounts(ctx, checkpoint.RunFilter{}, now)
	if err != nil {
		return nil, err
	}
	byJob := map[string]*JobRuns{}
	get := func(job string) *JobRuns {
		j := byJob[job]
		if j == nil {
			j = &JobRuns{Job: job, ByStatus: make(map[string]int64, len(RunStatuses))}
			for _, s := range RunStatuses {
				j.ByStatus[s] = 0
			}
			byJob[job] = j
		}
		return j
	}
	for _, job := range jobs {
		get(job)
	}
	for _, c := range counts {
		j := get(c.Job)
		j.ByStatus[countStatus(c)] += c.Count
		if c.Status == checkpoint.RunSucceeded && c.LastFinished.After(j.LastSuccess) {
			j.LastSuccess = c.LastFinished
		}
	}
	out := make([]JobRuns, 0, len(byJob))
	for _, j := range byJob {
		out = append(out, *j)
	}
	slices.SortFunc(out, func(a, b JobRuns) int {
		switch {
		case a.Job < b.Job:
			return -1
		case a.Job > b.Job:
			return 1
		}
		return 0
	})
	return out, nil
}

// countStatus is the status operators see for c's runs: running ones are
// StatusStale when their lease expired or their owner is surely gone, as
// Stale judges a run.
func countStatus(c checkpoint.RunCount) string {
	if c.Status == checkpoint.RunRunning && (c.Expired || runner.OwnerGone(c.Owner)) {
		return StatusStale
	}
	return c.Status
}
