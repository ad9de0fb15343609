package steps_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/steps"
)

// pagedXfers is a Paged source over items, counting its fetches and
// telling started the after-key of each fetch it begins.
func pagedXfers(items []xfer, page int, fetches *atomic.Int32, started chan<- string) steps.Source[xfer] {
	return steps.Paged(page, xferKey, func(ctx context.Context, after string, limit int) ([]xfer, error) {
		fetches.Add(1)
		if started != nil {
			started <- after // buffered for every fetch of the test
		}
		var out []xfer
		for _, x := range items {
			if x.ID > after && len(out) < limit {
				out = append(out, x)
			}
		}
		return out, nil
	}, int64(len(items)))
}

func TestReadAheadReadsTheNextChunkWhileOneIsProcessed(t *testing.T) {
	ctx := context.Background()
	st, loc := checkpointtest.OpenNew(t)
	var items []xfer
	for i := range 23 {
		items = append(items, xfer{ID: fmt.Sprintf("T%03d", i), From: "a", To: "b", Amount: 1})
	}
	opening := map[string]int64{"a": 1000, "b": 0}
	ledger(t, loc, opening)
	var fetches atomic.Int32
	started := make(chan string, 10)
	src := pagedXfers(items, 5, &fetches, started).ReadAhead()
	run := beginEffects(t, st, "j/k")
	// The first item waits until the second page is being fetched: read
	// ahead, it is while the first chunk is processed; without, never.
	first := true
	sum, err := steps.ForEach(ctx, run, "post", src, func(ctx context.Context, x xfer, e *steps.Effects) (int64, error) {
		if first {
			first = false
			<-started // the first page's fetch
			select {
			case after := <-started:
				if after != "T004" {
					return 0, fmt.Errorf("the fetch after the first page was after %q, want T004", after)
				}
			case <-time.After(20 * time.Second):
				return 0, errors.New("the second page was not fetched while the first chunk was processed")
			}
		}
		return post(ctx, x, e)
	}, steps.WithTarget(steps.Target{Table: accountsTable}), steps.ChunkSize(5))
	if err != nil {
		t.Fatal(err)
	}
	if sum.Completed != 23 || sum.Executed != 23 {
		t.Fatalf("summary %+v; want 23 completed", sum)
	}
	checkpointtest.CheckLedger(t, loc, accountsTable, checkpointtest.LedgerCheck{Opening: opening, Applied: xferTransfers(items), SkipVersions: true})
}

func TestReadAheadStopsReadingWhenAChunkFails(t *testing.T) {
	ctx := context.Background()
	st, loc := checkpointtest.OpenNew(t)
	var items []xfer
	for i := range 50 {
		items = append(items, xfer{ID: fmt.Sprintf("T%03d", i), From: "a", To: "b", Amount: 1})
	}
	opening := map[string]int64{"a": 1000, "b": 0}
	ledger(t, loc, opening)
	var fetches atomic.Int32
	boom := errors.New("boom")
	run := beginEffects(t, st, "j/k")
	_, err := steps.ForEach(ctx, run, "post", pagedXfers(items, 5, &fetches, nil).ReadAhead(), func(ctx context.Context, x xfer, e *steps.Effects) (int64, error) {
		if x.ID == "T012" {
			return 0, boom
		}
		return post(ctx, x, e)
	}, steps.WithTarget(steps.Target{Table: accountsTable}), steps.ChunkSize(5))
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	// Chunk 3 failed (its items before T012 committed): pages 1 to 3 were read, the fourth perhaps ahead
	// (and the reader may have begun the fifth); none after it returned.
	n := fetches.Load()
	if n < 3 || n > 5 {
		t.Errorf("%d pages fetched for a step that failed in its third chunk; want 3 to 5", n)
	}
	time.Sleep(10 * time.Millisecond)
	if m := fetches.Load(); m != n {
		t.Errorf("the source was read after ForEach returned: %d fetches, then %d", n, m)
	}
	checkpointtest.CheckLedger(t, loc, accountsTable, checkpointtest.LedgerCheck{Opening: opening, Applied: xferTransfers(items[:12]), SkipVersions: true})
	// A rerun finishes the rest, each item once.
	run2 := beginEffects(t, st, "j/k")
	sum, err := steps.ForEach(ctx, run2, "post", pagedXfers(items, 5, &fetches, nil).ReadAhead(), post,
		steps.WithTarget(steps.Target{Table: accountsTable}), steps.ChunkSize(5))
	if err != nil || sum.Completed != 50 || sum.Executed != 38 {
		t.Fatalf("rerun: %+v, %v; want 50 completed, 38 executed", sum, err)
	}
	checkpointtest.CheckLedger(t, loc, accountsTable, checkpointtest.LedgerCheck{Opening: opening, Applied: xferTransfers(items), SkipVersions: true})
}

// A run cancelled while the next page is read ahead stops interrupted:
// the chunk the reader held when the context ended is not processed, so
// the step must not be recorded done (before, the reader dropped it and
// the step completed short of its items, about one run in two).
func TestReadAheadCancelledIsInterruptedNotDone(t *testing.T) {
	var items []xfer
	for i := range 15 {
		items = append(items, xfer{ID: fmt.Sprintf("T%03d", i), From: "a", To: "b", Amount: 1})
	}
	for i := range 12 { // the reader's choice between send and cancel is random
		st, loc := checkpointtest.OpenNew(t)
		ledger(t, loc, map[string]int64{"a": 1000, "b": 0})
		ctx, cancel := context.WithCancel(context.Background())
		inSecond, release := make(chan struct{}), make(chan struct{})
		src := steps.Paged(10, xferKey, func(_ context.Context, after string, limit int) ([]xfer, error) {
			var out []xfer
			for _, x := range items {
				if x.ID > after && len(out) < limit {
					out = append(out, x)
				}
			}
			if after != "" && len(out) > 0 {
				close(inSecond)
				<-release // returns its page, whatever the context
			}
			return out, nil
		}, int64(len(items))).ReadAhead()
		runID := fmt.Sprintf("j/k%d", i)
		go func() {
			// Cancel once the first page's two chunks are committed: the
			// batch then waits on the reader, holding nothing of its own.
			<-inSecond
			for recorded(st, runID) < 10 {
				time.Sleep(time.Millisecond)
			}
			cancel()
			close(release)
		}()
		run := beginEffects(t, st, runID)
		sum, err := steps.ForEach(ctx, run, "post", src, post,
			steps.WithTarget(steps.Target{Table: accountsTable}), steps.ChunkSize(5))
		if !errors.Is(err, steps.ErrInterrupted) {
			t.Fatalf("run %d, cancelled while its last page was read ahead: %+v, %v; want interrupted", i, sum, err)
		}
		cancel()
	}
}

// A panic in a source read ahead is raised on the batch's goroutine, where
// the runner records it; it does not kill the process.
func TestReadAheadSourcePanicReachesTheBatch(t *testing.T) {
	st, loc := checkpointtest.OpenNew(t)
	ledger(t, loc, map[string]int64{"a": 1000, "b": 0})
	src := steps.Paged(10, xferKey, func(context.Context, string, int) ([]xfer, error) {
		panic("source broke")
	}, 10).ReadAhead()
	run := beginEffects(t, st, "j/p")
	defer func() {
		p := recover()
		if s, _ := p.(string); !strings.Contains(s, "source broke") || !strings.Contains(s, "read ahead") {
			t.Fatalf("recovered %v; want the source's panic, raised on the batch's goroutine", p)
		}
	}()
	_, _ = steps.ForEach(context.Background(), run, "post", src, post,
		steps.WithTarget(steps.Target{Table: accountsTable}), steps.ChunkSize(5))
	t.Fatal("ForEach returned; want the source's panic")
}

// recorded counts the items runID recorded completed.
func recorded(st checkpoint.Backend, runID string) int {
	n := 0
	_ = st.RunItems(context.Background(), runID, checkpoint.StepCompleted, checkpoint.Page{Limit: 1000}, func(checkpoint.Item) error {
		n++
		return nil
	})
	return n
}
