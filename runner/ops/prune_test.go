package ops_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
	"github.com/stepwise-run/stepwise/steps"
)

// Prune goes through ops: a reason that is not text is refused before the
// store is touched, a dry run prunes nothing, and a prune commits its
// audit record with the command it was given.
func TestPruneThroughOps(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	reg := &jobs.Registry{}
	reg.MustRegister(jobs.Define("daily", func(ctx context.Context, run *steps.Run, p dailyParams) error {
		_, err := steps.Do(ctx, run, "work", func(context.Context) (string, error) { return p.Date, nil })
		return err
	}))
	r, err := runner.New(runner.Config{Store: st, Jobs: reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(ctx, runner.Request{Job: "daily", Values: map[string]string{"date": "2026-01-02"}}); err != nil {
		t.Fatal(err)
	}
	now := time.Now().Add(time.Hour) // the run finished before the cutoff
	who := ops.Who{Operator: "alice", Reason: "retention"}

	if _, _, err := ops.Prune(ctx, st, ops.Who{Operator: "alice", Reason: "bad\x00reason"}, "prune", now, false, now); !errors.Is(err, ops.ErrBadText) {
		t.Errorf("prune with a NUL in its reason: %v; want ops.ErrBadText", err)
	}
	res, _, err := ops.Prune(ctx, st, who, "prune --older-than 0d", now, true, now)
	if err != nil || !slices.Equal(res.Runs, []string{"daily/2026-01-02"}) {
		t.Fatalf("dry run = %+v, %v; want daily/2026-01-02 named", res, err)
	}
	if info, err := st.Run(ctx, "daily/2026-01-02"); err != nil || !info.Run.PrunedAt.IsZero() {
		t.Fatalf("after a dry run the run is %+v, %v; want it unpruned", info.Run, err)
	}
	res, a, err := ops.Prune(ctx, st, who, "prune --older-than 0d", now, false, now)
	if err != nil || !slices.Equal(res.Runs, []string{"daily/2026-01-02"}) || res.Steps != 1 {
		t.Fatalf("prune = %+v, %v; want daily/2026-01-02 and its one step", res, err)
	}
	if a.Command != "prune --older-than 0d" || a.Operator != "alice" || a.Reason != "retention" {
		t.Errorf("audit = %+v; want alice's prune --older-than 0d for retention", a)
	}
	as, err := st.Audits(ctx, "daily/2026-01-02")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, x := range as {
		found = found || x.Command == "prune --older-than 0d" && x.Operator == "alice"
	}
	if !found {
		t.Errorf("audits of the pruned run = %+v; want the prune's", as)
	}
	if info, err := st.Run(ctx, "daily/2026-01-02"); err != nil || info.Run.PrunedAt.IsZero() {
		t.Errorf("after prune the run is %+v, %v; want it pruned", info.Run, err)
	}
}
