package runner_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// countingQueue is a real store that counts how the worker claims.
type countingQueue struct {
	checkpoint.Backend
	mu           sync.Mutex
	batches      []int // runs each ClaimBatch returned, in call order
	finishClaims int   // runs FinishAndClaim claimed
	finishes     int   // ends FinishAndClaim recorded
	stepReads    int   // Steps calls (checkpoint loads)
	clockReads   int   // StoreNow calls
}

func (q *countingQueue) StoreNow(ctx context.Context) (time.Time, error) {
	q.mu.Lock()
	q.clockReads++
	q.mu.Unlock()
	return q.Backend.StoreNow(ctx)
}

func (q *countingQueue) Steps(ctx context.Context, runID string, fn func(checkpoint.Step) error) error {
	q.mu.Lock()
	q.stepReads++
	q.mu.Unlock()
	return q.Backend.Steps(ctx, runID, fn)
}

func (q *countingQueue) ClaimBatch(ctx context.Context, req checkpoint.ClaimNextRequest) ([]checkpoint.Claim, error) {
	cs, err := q.Backend.ClaimBatch(ctx, req)
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(cs) > 0 {
		q.batches = append(q.batches, len(cs))
	}
	return cs, err
}

func (q *countingQueue) FinishAndClaim(ctx context.Context, ends []checkpoint.Finished, next checkpoint.ClaimNextRequest) ([]checkpoint.Claim, []error, error) {
	cs, results, err := q.Backend.FinishAndClaim(ctx, ends, next)
	q.mu.Lock()
	defer q.mu.Unlock()
	q.finishes += len(ends)
	q.finishClaims += len(cs)
	return cs, results, err
}

// waitEnded waits for n results from ended.
func waitEnded(t *testing.T, ended <-chan runner.Result, n int) []runner.Result {
	t.Helper()
	var got []runner.Result
	for range n {
		select {
		case res := <-ended:
			got = append(got, res)
		case <-time.After(30 * time.Second):
			t.Fatalf("the worker ended %d of %d runs within 30s", len(got), n)
		}
	}
	return got
}

// A worker with free slots claims queued runs for all of them in one
// ClaimBatch, and each run is a claim of its own: one attempt, its steps
// run once.
func TestWorkerClaimsFreeSlotsInOneBatch(t *testing.T) {
	q := &countingQueue{Backend: checkpointtest.Open(t)}
	h := newHarnessOn(t, q)
	const n = 4
	var (
		mu       sync.Mutex
		inFlight int
		all      = make(chan struct{})
		ended    = make(chan runner.Result, n)
	)
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
		mu.Lock()
		if inFlight++; inFlight == n {
			close(all)
		}
		mu.Unlock()
		select {
		case <-all:
		case <-time.After(20 * time.Second):
			return fmt.Errorf("only %d runs in flight together", inFlight)
		}
		return h.step(ctx, run, "load/"+p.Date)
	}
	dates := []string{"2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04"}
	enqueueDates(t, h, func(string) string { return "" }, dates...)
	stop := startWorker(t, h, func(c *runner.WorkerConfig) {
		c.Concurrency = n
		c.OnDone = func(res runner.Result, _ error) { ended <- res }
	})
	waitEnded(t, ended, n)
	stop()
	q.mu.Lock()
	first := q.batches[0]
	q.mu.Unlock()
	if first != n {
		t.Errorf("the first claim took %d runs (claims %v); want all %d free slots in one batch", first, q.batches, n)
	}
	for _, d := range dates {
		info, err := h.st.Run(context.Background(), "job/"+d)
		if err != nil {
			t.Fatal(err)
		}
		if info.Run.Status != checkpoint.RunSucceeded || len(info.Attempts) != 1 || h.called("load/"+d) != 1 {
			t.Errorf("%s: %s with %d attempts, load ran %d times; want succeeded, 1 and 1", d, info.Run.Status, len(info.Attempts), h.called("load/"+d))
		}
	}
}

// A slot whose run ends takes the next queued run with the end
// (FinishAndClaim), so a queue drains through one slot with one claim
// and one finish-and-claim per run after it; every run still gets its
// own attempt, and each step runs once. A run claimed from the queue for
// the first time has no checkpoints, and none are read; the store's clock
// is read once for them all.
func TestWorkerSlotFinishesAndClaimsNext(t *testing.T) {
	q := &countingQueue{Backend: checkpointtest.Open(t)}
	h := newHarnessOn(t, q)
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error { return h.step(ctx, run, "load/"+p.Date) }
	dates := []string{"2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04", "2026-11-05"}
	enqueueDates(t, h, func(string) string { return "" }, dates...)
	ended := make(chan runner.Result, len(dates))
	stop := startWorker(t, h, func(c *runner.WorkerConfig) {
		c.OnDone = func(res runner.Result, _ error) { ended <- res }
	})
	for _, res := range waitEnded(t, ended, len(dates)) {
		if res.Status != checkpoint.RunSucceeded || res.Attempt != 1 {
			t.Errorf("%s: %s, attempt %d; want succeeded, attempt 1", res.RunID, res.Status, res.Attempt)
		}
	}
	stop()
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.batches) != 1 || q.batches[0] != 1 || q.finishClaims != len(dates)-1 {
		t.Errorf("claims %v and %d runs claimed by %d finishes; want one claim of 1, then %d runs claimed with the ends before them",
			q.batches, q.finishClaims, q.finishes, len(dates)-1)
	}
	if q.clockReads != 1 {
		t.Errorf("the store's clock was read %d times for %d runs a few milliseconds apart; want once", q.clockReads, len(dates))
	}
	if q.stepReads != 0 {
		t.Errorf("%d checkpoint loads for %d runs never claimed before; want none", q.stepReads, len(dates))
	}
	for _, d := range dates {
		if info, err := h.st.Run(context.Background(), "job/"+d); err != nil || info.Run.Status != checkpoint.RunSucceeded ||
			len(info.Attempts) != 1 || info.Attempts[0].Status != checkpoint.RunSucceeded || h.called("load/"+d) != 1 {
			t.Errorf("%s: %+v (%v), load ran %d times; want succeeded with one succeeded attempt, load once", d, info.Run, err, h.called("load/"+d))
		}
	}
}
