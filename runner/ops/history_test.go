package ops_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
	"github.com/stepwise-run/stepwise/steps"
)

// setClock is a clock the test moves; it waits in real time.
type setClock struct {
	runner.SystemClock
	mu  sync.Mutex
	now time.Time
}

func (c *setClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *setClock) advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

type batchParams struct {
	Date    string `param:"date,key" format:"date" help:"business date"`
	Minutes int    `param:"minutes" help:"how long the run takes"`
	Bad     int    `param:"bad" help:"how many items are rejected"`
}

// History gives each run of a job, oldest first, its duration from its
// attempts and its batch items posted, rejected and skipped; CountRuns
// counts the runs by status.
func TestHistoryAndCounts(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	clk := &setClock{now: time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC)}
	reg := &jobs.Registry{}
	reg.MustRegister(jobs.Define("batch", func(ctx context.Context, run *steps.Run, p batchParams) error {
		clk.advance(time.Duration(p.Minutes) * time.Minute)
		items := []int{1, 2, 3, 4, 5, 6}
		_, err := steps.ForEach(ctx, run, "post", steps.Slice(items, func(i int) string { return string(rune('a' + i)) }),
			func(ctx context.Context, i int, e *steps.Effects) (int, error) {
				switch {
				case i <= p.Bad:
					return 0, steps.Reject(errors.New("rejected"))
				case i == 6:
					return 0, errors.New("broken item")
				}
				return i, nil
			}, steps.SkipFailures(10))
		return err
	}))
	// A lease far longer than the fake hours a run takes: its runner never
	// judges itself fenced when the clock jumps.
	r, err := runner.New(runner.Config{Store: st, Jobs: reg, Clock: clk, Lease: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range []struct {
		date     string
		min, bad int
	}{{"2026-11-28", 10, 1}, {"2026-11-29", 20, 2}, {"2026-11-30", 40, 3}} {
		clk.advance(time.Duration(i) * time.Hour)
		if _, err := r.Run(ctx, runner.Request{Job: "batch", Values: map[string]string{"date": d.date, "minutes": strconv.Itoa(d.min), "bad": strconv.Itoa(d.bad)}}); err != nil {
			t.Fatal(err)
		}
	}
	h, err := ops.History(ctx, st, "batch", 0, clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Runs) != 3 || !h.Batch {
		t.Fatalf("history = %+v; want 3 runs with batch items", h)
	}
	for i, want := range []ops.RunPoint{
		{ID: "batch/2026-11-28", Seconds: 600, Posted: 4, Rejected: 1, Skipped: 1},
		{ID: "batch/2026-11-29", Seconds: 1200, Posted: 3, Rejected: 2, Skipped: 1},
		{ID: "batch/2026-11-30", Seconds: 2400, Posted: 2, Rejected: 3, Skipped: 1},
	} {
		got := h.Runs[i]
		if got.ID != want.ID || got.Seconds != want.Seconds || got.Posted != want.Posted || got.Rejected != want.Rejected ||
			got.Skipped != want.Skipped || got.Status != checkpoint.RunSucceeded || got.Attempts != 1 {
			t.Errorf("history run %d = %+v; want %+v, succeeded in one attempt", i, got, want)
		}
	}
	if h, err := ops.History(ctx, st, "batch", 2, clk.Now()); err != nil || len(h.Runs) != 2 || h.Runs[1].ID != "batch/2026-11-30" {
		t.Errorf("history of 2 = %+v, %v; want the latest two, oldest first", h, err)
	}
	// Two runs left running: one whose lease expired an hour ago (stale),
	// one whose runner holds it.
	for _, c := range []struct {
		key   string
		lease time.Duration
	}{{"2026-12-01", -time.Hour}, {"2026-12-02", time.Hour}} {
		if _, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: "batch/" + c.key, Job: "batch", RunKey: c.key, Params: []byte(`{}`),
			ParamsHash: "h", Owner: "elsewhere:1", Now: clk.Now().Add(c.lease - time.Minute), LeaseFor: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := ops.CountRuns(ctx, st, ops.RunsQuery{Job: "batch"}, clk.Now())
	if err != nil || c.Total != 5 || len(c.Counts) != len(ops.RunStatuses) {
		t.Fatalf("counts = %+v, %v; want 5 runs, every status listed", c, err)
	}
	for _, sc := range c.Counts {
		if want := map[string]int64{checkpoint.RunSucceeded: 3, ops.StatusStale: 1, checkpoint.RunRunning: 1}[sc.Status]; sc.Count != want {
			t.Errorf("count of %s = %d; want %d", sc.Status, sc.Count, want)
		}
	}
	if c, err := ops.CountRuns(ctx, st, ops.RunsQuery{Job: "other"}, clk.Now()); err != nil || c.Total != 0 {
		t.Errorf("counts of another job = %+v, %v; want none", c, err)
	}
}
