package ops

import (
	"context"
	"fmt"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
)

// PartitionView is one partition of a partitioned batch step, as `show`,
// `runs`, the API and the dashboard present it.
type PartitionView struct {
	Step  string `json:"step"`
	Index int    `json:"index"`
	Count int    `json:"count"`
	// Range is how items are assigned: "[from, to)" for key ranges,
	// "hash mod N = I" for PartitionBy.
	Range string `json:"range"`
	State string `json:"state"`
	// Stale is set for a running partition whose runner is gone: its
	// lease expired, or its owner's process surely exited (same host and
	// PID namespace, PID dead). Any worker takes it over (at once when
	// the owner's process is gone), or the run's next attempt does.
	Stale      bool       `json:"stale"`
	Owner      string     `json:"owner,omitempty"`
	Fence      int64      `json:"fence"`
	LeaseUntil *time.Time `json:"lease_until,omitempty"`
	Done       int64      `json:"done"` // finished items: completed, rejected, skipped
	Rejected   int64      `json:"rejected"`
	Skipped    int64      `json:"skipped"`
	Total      int64      `json:"total"`
	HighWater  string     `json:"high_water,omitempty"`
	Error      string     `json:"error,omitempty"`
}

// ViewPartition is p as operators see it at now.
func ViewPartition(p checkpoint.Partition, now time.Time) PartitionView {
	rng := fmt.Sprintf("hash mod %d = %d", p.Count, p.Index)
	if p.Rule == checkpoint.PartitionRange {
		to := "∞"
		if p.To != "" {
			to = fmt.Sprintf("%q", p.To)
		}
		rng = fmt.Sprintf("[%q, %s)", p.From, to)
	}
	return PartitionView{Step: p.Step, Index: p.Index, Count: p.Count, Range: rng, State: p.State, Stale: PartitionStale(p, now),
		Owner: checkpoint.OwnerName(p.Owner),
		Fence: p.Fence, LeaseUntil: OptTime(p.LeaseUntil), Done: p.Finished(), Rejected: p.Rejected, Skipped: p.Skipped,
		Total: p.Total, HighWater: p.HighWater, Error: p.Error}
}

// PartitionStale reports whether p is left running by a runner that is
// gone at now, as Stale judges a run: its lease expired, or its owner's
// process surely exited.
func PartitionStale(p checkpoint.Partition, now time.Time) bool {
	return p.State == checkpoint.PartitionRunning &&
		((!p.LeaseUntil.IsZero() && !now.Before(p.LeaseUntil)) || runner.OwnerGone(p.Owner))
}

// RunPartitions reads the partitions of a run's partitioned batch steps,
// as seen at now; none for a run without any.
func RunPartitions(ctx context.Context, st checkpoint.Backend, runID string, now time.Time) ([]PartitionView, error) {
	ps, err := st.Partitions(ctx, runID, "")
	if err != nil {
		return nil, err
	}
	var out []PartitionView
	for _, p := range ps {
		out = append(out, ViewPartition(p, now))
	}
	return out, nil
}
