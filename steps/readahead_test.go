package steps_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

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
