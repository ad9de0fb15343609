package checkpoint

import "time"

// RunCount is one group of Inspector.RunCounts: how many runs of Job are
// in Status and the latest of their ends. Running runs are grouped
// further by their lease owner and by whether their lease had expired at
// the count's now, so a caller tells stale runs from live ones (an
// expired lease, or an owner it knows is gone) without reading each run.
type RunCount struct {
	Job    string
	Status string
	// Owner is the lease owner of the group's runs when Status is
	// RunRunning; empty for every other status.
	Owner string
	// Expired is true for running runs whose lease had expired at now, as
	// Run.Stale judges it.
	Expired bool
	// Count is how many runs the group has.
	Count int64
	// LastFinished is the latest FinishedAt of the group's runs (a run
	// records it when it succeeds); zero when none has one.
	LastFinished time.Time
}
