package ops

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// StatusStale is the status a run listing filters by for the runs left
// running by a runner that is gone (see Stale).
const StatusStale = "stale"

// RunStatuses are the statuses a run listing filters by, on every face:
// the run statuses, with running split into running and StatusStale.
var RunStatuses = []string{checkpoint.RunQueued, checkpoint.RunRunning, StatusStale, checkpoint.RunSucceeded,
	checkpoint.RunFailed, checkpoint.RunInterrupted, checkpoint.RunAbandoned}

// CheckRunStatus returns an error naming the statuses a listing takes
// unless status is one of RunStatuses or "" (every run).
func CheckRunStatus(status string) error {
	if status == "" || slices.Contains(RunStatuses, status) {
		return nil
	}
	return fmt.Errorf("status %q is not a run status; use one of %s, or none for every run", status, strings.Join(RunStatuses, ", "))
}

// RunsQuery selects one page of the run listing, newest first.
type RunsQuery struct {
	Job string
	// Status is a run status, StatusStale, or "" for every run; running
	// lists the running runs that are not stale.
	Status       string
	RunKeyPrefix string
	// Since and Until keep the runs created at or after Since and before
	// Until (zero: unbounded).
	Since, Until time.Time
	// After is the last run of the previous page (nil: the first page).
	After *checkpoint.RunCursor
	// Limit is the page's size. Defaults to 100.
	Limit int
}

// RunsPage is one page of runs; Next, when more may follow, is where the
// next page starts (after it).
type RunsPage struct {
	Runs []RunView
	Next *checkpoint.RunCursor
}

// ListRuns reads one page of the runs q selects, as operators see them at
// now. Stale runs are told from running ones as Stale tells them (a lease
// expired, or an owner surely gone), so a status filter of either reads
// running runs until the page is full.
func ListRuns(ctx context.Context, st checkpoint.Backend, q RunsQuery, now time.Time) (RunsPage, error) {
	runs, next, err := ListRunRecords(ctx, st, q, now)
	page := RunsPage{Runs: make([]RunView, 0, len(runs)), Next: next}
	for _, r := range runs {
		page.Runs = append(page.Runs, ViewRun(r, now))
	}
	return page, err
}

// ListRunRecords is ListRuns with the runs as the store records them, for a
// face that renders more than the view (the CLI's table); next, when more
// may follow, is where the next page starts.
func ListRunRecords(ctx context.Context, st checkpoint.Backend, q RunsQuery, now time.Time) (page []checkpoint.Run, next *checkpoint.RunCursor, err error) {
	limit := q.Limit
	if limit <= 0 {
		limit = 100
	}
	f := checkpoint.RunFilter{Job: q.Job, Status: q.Status, RunKeyPrefix: q.RunKeyPrefix,
		CreatedFrom: q.Since, CreatedBefore: q.Until, After: q.After, Limit: limit + 1}
	keep := func(checkpoint.Run) bool { return true }
	switch q.Status {
	case StatusStale:
		f.Status = checkpoint.RunRunning
		keep = func(r checkpoint.Run) bool { return Stale(r, now) }
	case checkpoint.RunRunning:
		keep = func(r checkpoint.Run) bool { return !Stale(r, now) }
	}
	for {
		runs, err := st.Runs(ctx, f)
		if err != nil {
			return page, nil, err
		}
		for i, r := range runs {
			if len(page) == limit {
				// One more run exists: the page ends at the last one kept.
				last := page[len(page)-1]
				return page, &checkpoint.RunCursor{CreatedAt: last.CreatedAt, ID: last.ID}, nil
			}
			if i == limit { // read one past the page: more follow
				break
			}
			if keep(r) {
				page = append(page, r)
			}
		}
		if len(runs) <= limit {
			return page, nil, nil
		}
		// Every run read but the last was looked at: go on after the
		// last one looked at.
		last := runs[limit-1]
		f.After = &checkpoint.RunCursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
}
