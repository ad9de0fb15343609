package runner_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// TestDryRunUnderALongLease: a dry run holds no lease, so a runner's long
// lease (and the self-fence margin it implies) does not stop it, and it
// reports no progress, retries nothing and records nothing.
func TestDryRunUnderALongLease(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.body = func(ctx context.Context, run *steps.Run, _ jobParams) error {
		_, err := steps.ForEach(ctx, run, "items", steps.Slice(partitionKeys(), func(k string) string { return k }),
			func(ctx context.Context, k string, _ *steps.Effects) (string, error) { return k, nil }, steps.ChunkSize(5))
		return err
	}
	reports := 0
	r := h.runner(func(c *runner.Config) {
		c.Lease = 5 * time.Minute
		c.OnProgress = func(steps.Progress) { reports++ }
	})
	res, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues, DryRun: true})
	if err != nil || res.Status != "dry-run" {
		t.Fatalf("dry run under a 5m lease: %q, %v; want it done", res.Status, err)
	}
	if reports != 0 {
		t.Errorf("the dry run reported progress %d times; want none (it is no attempt)", reports)
	}
	if _, err := h.st.Run(context.Background(), testRunID); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("after the dry run the run is recorded (%v); want nothing written", err)
	}
}
