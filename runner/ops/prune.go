package ops

import (
	"context"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// Prune deletes the step payloads, item checkpoints and idempotency keys
// of the succeeded and abandoned runs that finished before cutoff; their
// run keys stay as tombstones (starting one again is refused). Its audit
// record, whose command says how it was asked (the CLI's is "prune
// --older-than 90d"), commits with it. A dry run only counts what would go.
func Prune(ctx context.Context, st checkpoint.Backend, who Who, command string, cutoff time.Time, dryRun bool, now time.Time) (checkpoint.PruneResult, checkpoint.Audit, error) {
	a := who.Audit("", command, "", now)
	if err := who.Check(); err != nil {
		return checkpoint.PruneResult{}, a, err
	}
	res, err := st.Prune(ctx, a, cutoff, dryRun)
	return res, a, err
}
