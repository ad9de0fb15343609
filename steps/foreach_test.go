package steps_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/steps"
)

type xfer struct {
	ID       string
	From, To string
	Amount   int64
}

func xferKey(x xfer) string { return x.ID }

func post(ctx context.Context, x xfer, e *steps.Effects) (int64, error) {
	e.Add(x.From, -x.Amount, steps.NotBelow(0))
	e.Add(x.To, x.Amount)
	return x.Amount, nil
}

// itemOf returns one item checkpoint of a batch step, through the
// contract; its Status is "" when none is recorded.
func itemOf(t *testing.T, st checkpoint.Backend, runID, step, key string) checkpoint.Item {
	t.Helper()
	var out checkpoint.Item
	err := st.Items(context.Background(), checkpoint.ItemQuery{RunID: runID, Step: step, Keys: []string{key}}, func(it checkpoint.Item) error {
		out = it
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestForEachFoldsInItemOrder(t *testing.T) {
	for _, separate := range []bool{false, true} {
		t.Run(fmt.Sprintf("separate=%v", separate), func(t *testing.T) {
			ctx := context.Background()
			// A separate target runs on a SQLite store: the PostgreSQL
			// store cannot open one yet (see checkpointtest.SeparateTarget).
			var st checkpoint.Backend
			var db string
			target := steps.Target{Table: accountsTable}
			if separate {
				st, db = checkpointtest.SeparateTarget(t)
				target.Location = db
			} else {
				st, db = checkpointtest.OpenNew(t)
			}
			opening := map[string]int64{"a": 100, "b": 0, "c": 0}
			ledger(t, db, opening)
			// One account many times in one chunk: a gets 100; T1 takes 60,
			// T2 (60) must be rejected, T3 (40) accepted, T4 refills, T5 ok.
			items := []xfer{
				{"T1", "a", "b", 60}, {"T2", "a", "c", 60}, {"T3", "a", "c", 40},
				{"T4", "b", "a", 50}, {"T5", "a", "b", 50},
			}
			run := beginEffects(t, st, "j/k")
			sum, err := steps.ForEach(ctx, run, "post", steps.Slice(items, xferKey), post, steps.WithTarget(target), steps.ChunkSize(10))
			if err != nil {
				t.Fatal(err)
			}
			if sum.Completed != 4 || sum.Rejected != 1 || sum.Total != 5 {
				t.Fatalf("summary = %+v", sum)
			}
			// a, b and c end at 0, 60 and 40, each written once (one chunk).
			var applied []checkpointtest.Transfer
			for _, x := range items {
				if x.ID != "T2" {
					applied = append(applied, checkpointtest.Transfer{ID: x.ID, From: x.From, To: x.To, Amount: x.Amount})
				}
			}
			ledgerHolds := checkpointtest.LedgerCheck{Opening: opening, Applied: applied, Versions: map[string]int64{"a": 1, "b": 1, "c": 1}}
			checkpointtest.CheckLedger(t, db, accountsTable, ledgerHolds)
			if status := itemOf(t, st, "j/k", "post", "T2").Status; status != checkpoint.StepRejected {
				t.Fatalf("T2 status = %q, want rejected", status)
			}
			// A rerun in reverse order applies nothing again.
			run2 := beginEffects(t, st, "j/k")
			rev := slices.Clone(items)
			slices.Reverse(rev)
			calls := 0
			_, err = steps.ForEach(ctx, run2, "post", steps.Slice(rev, xferKey), func(ctx context.Context, x xfer, e *steps.Effects) (int64, error) {
				calls++
				return post(ctx, x, e)
			}, steps.WithTarget(target), steps.ChunkSize(2))
			if err != nil || calls != 0 {
				t.Fatalf("rerun: err %v, calls %d", err, calls)
			}
			checkpointtest.CheckLedger(t, db, accountsTable, ledgerHolds) // nothing applied twice
		})
	}
}

func TestForEachSkipsCompletedItemsOnResume(t *testing.T) {
	ctx := context.Background()
	st, loc := checkpointtest.OpenNew(t)
	var items []xfer
	for i := range 25 {
		items = append(items, xfer{ID: fmt.Sprintf("T%03d", i), From: "a", To: "b", Amount: 1})
	}
	opening := map[string]int64{"a": 1000, "b": 0}
	ledger(t, loc, opening)
	// The items up to n applied once each; the test follows which items
	// run, not how the chunks merge their writes.
	upTo := func(n int) checkpointtest.LedgerCheck {
		return checkpointtest.LedgerCheck{Opening: opening, Applied: xferTransfers(items[:n]), SkipVersions: true}
	}
	target := steps.Target{Table: accountsTable}
	run := beginEffects(t, st, "j/k")
	boom := errors.New("boom")
	_, err := steps.ForEach(ctx, run, "post", steps.Slice(items, xferKey), func(ctx context.Context, x xfer, e *steps.Effects) (int64, error) {
		if x.ID == "T012" {
			return 0, boom
		}
		return post(ctx, x, e)
	}, steps.WithTarget(target), steps.ChunkSize(5))
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	checkpointtest.CheckLedger(t, loc, accountsTable, upTo(12)) // the items before the failing one committed
	run2 := beginEffects(t, st, "j/k")
	calls := 0
	sum, err := steps.ForEach(ctx, run2, "post", steps.Slice(items, xferKey), func(ctx context.Context, x xfer, e *steps.Effects) (int64, error) {
		calls++
		return post(ctx, x, e)
	}, steps.WithTarget(target), steps.ChunkSize(5))
	if err != nil {
		t.Fatal(err)
	}
	if calls != 13 || sum.Completed != 25 || sum.Executed != 13 {
		t.Fatalf("calls %d, summary %+v; want 13 calls, 25 completed", calls, sum)
	}
	checkpointtest.CheckLedger(t, loc, accountsTable, upTo(25))
	// Finished: a third attempt returns the recorded summary without reading the source.
	run3 := beginEffects(t, st, "j/k")
	src := steps.Seq(func(yield func(string, xfer) bool) { t.Fatal("source read for a finished batch step") }, -1)
	sum3, err := steps.ForEach(ctx, run3, "post", src, post, steps.WithTarget(target))
	if err != nil || sum3.Completed != 25 {
		t.Fatalf("finished rerun: %+v, %v", sum3, err)
	}
}

func TestForEachSkipPolicy(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	items := []xfer{{ID: "A"}, {ID: "B"}, {ID: "C"}, {ID: "D"}}
	fail := func(ctx context.Context, x xfer, e *steps.Effects) (string, error) {
		if x.ID == "B" || x.ID == "D" {
			return "", fmt.Errorf("bad item %s", x.ID)
		}
		return "ok " + x.ID, nil
	}
	run := beginEffects(t, st, "j/k")
	if _, err := steps.ForEach(ctx, run, "skip1", steps.Slice(items, xferKey), fail, steps.SkipFailures(1)); err == nil {
		t.Fatal("two failures passed a skip limit of 1")
	}
	sum, err := steps.ForEach(ctx, run, "skip2", steps.Slice(items, xferKey), fail, steps.SkipFailures(2))
	if err != nil || sum.Skipped != 2 || sum.Completed != 2 {
		t.Fatalf("skip2: %+v, %v", sum, err)
	}
	it := itemOf(t, st, "j/k", "skip2", "D")
	if msg := it.Error; msg != "bad item D" || it.Status != checkpoint.ItemSkipped {
		t.Fatalf("skipped item error = %q", msg)
	}
	// A duplicate key is loud.
	dup := []xfer{{ID: "A"}, {ID: "B"}, {ID: "A"}}
	_, err = steps.ForEach(ctx, run, "dup", steps.Slice(dup, xferKey), fail, steps.SkipFailures(5))
	if !errors.Is(err, steps.ErrDuplicateStep) {
		t.Fatalf("duplicate key: %v", err)
	}
}

func TestForEachReadsTheSourceWhenOnlyItsRecordIsMissing(t *testing.T) {
	ctx := context.Background()
	st, loc := checkpointtest.OpenNew(t)
	opening := map[string]int64{"a": 1000, "b": 0}
	ledger(t, loc, opening)
	target := steps.Target{Table: accountsTable}
	var items []xfer
	for i := range 12 {
		items = append(items, xfer{ID: fmt.Sprintf("T%02d", i), From: "a", To: "b", Amount: 1})
	}
	run := beginEffects(t, st, "j/k")
	if _, err := steps.ForEach(ctx, run, "post", steps.Slice(items, xferKey), post, steps.WithTarget(target), steps.ChunkSize(5)); err != nil {
		t.Fatal(err)
	}
	// A crash between the last chunk and the step's own record leaves
	// every item finished and no step row.
	resetStep(t, st, "j/k", "post")
	run2 := beginEffects(t, st, "j/k")
	read := false
	src := steps.Seq(func(yield func(string, xfer) bool) {
		read = true
		for _, x := range items {
			if !yield(x.ID, x) {
				return
			}
		}
	}, int64(len(items)))
	sum, err := steps.ForEach(ctx, run2, "post", src, func(ctx context.Context, x xfer, e *steps.Effects) (int64, error) {
		t.Errorf("item %s ran again", x.ID)
		return 0, nil
	}, steps.WithTarget(target), steps.ChunkSize(5))
	// Item counts cannot tell an unchanged source from an altered one: the
	// source is read again and its items held to their fingerprints.
	if err != nil || !read || sum.Completed != 12 || sum.Total != 12 || sum.Executed != 0 {
		t.Fatalf("summary %+v, err %v, source read %v; want 12 completed, none executed, the source read", sum, err, read)
	}
	if s, _ := stepOf(t, st, "j/k", "post"); s.Status != "completed" {
		t.Fatalf("step recorded as %q", s.Status)
	}
	// A source whose total is unknown is read, and still runs nothing again.
	resetStep(t, st, "j/k", "post")
	run3 := beginEffects(t, st, "j/k")
	read = false
	unknown := steps.Seq(func(yield func(string, xfer) bool) {
		read = true
		for _, x := range items {
			if !yield(x.ID, x) {
				return
			}
		}
	}, -1)
	sum, err = steps.ForEach(ctx, run3, "post", unknown, func(ctx context.Context, x xfer, e *steps.Effects) (int64, error) {
		t.Errorf("item %s ran again", x.ID)
		return 0, nil
	}, steps.WithTarget(target), steps.ChunkSize(5))
	if err != nil || !read || sum.Completed != 12 {
		t.Fatalf("unknown total: %+v, %v, read %v", sum, err, read)
	}
	// Every item applied once, by the first attempt's three chunks.
	checkpointtest.CheckLedger(t, loc, accountsTable, checkpointtest.LedgerCheck{Opening: opening,
		Applied: xferTransfers(items), Versions: map[string]int64{"a": 3, "b": 3}})
}

// xferTransfers is items as the ledger check's transfers.
func xferTransfers(items []xfer) []checkpointtest.Transfer {
	ts := make([]checkpointtest.Transfer, 0, len(items))
	for _, x := range items {
		ts = append(ts, checkpointtest.Transfer{ID: x.ID, From: x.From, To: x.To, Amount: x.Amount})
	}
	return ts
}

func TestForEachPartitionedOverAnEmptySourceCompletes(t *testing.T) {
	ctx := context.Background()
	st, _ := checkpointtest.OpenNew(t)
	run := beginEffects(t, st, "j/empty")
	sum, err := steps.ForEach(ctx, run, "post", steps.Slice([]xfer(nil), xferKey), func(ctx context.Context, x xfer, e *steps.Effects) (int64, error) {
		t.Errorf("item %s of an empty source", x.ID)
		return 0, nil
	}, steps.Partitions(4))
	if err != nil || sum.Total != 0 || sum.Completed != 0 {
		t.Fatalf("empty partitioned step: %+v, %v; want it completed with no items", sum, err)
	}
}
