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

// TestForEachRecordsSameStoreChunkPlans checks a same-store ForEach records
// each chunk's plan, applied, in the chunk's own transaction: over a failed
// attempt and its resume, every item whose effects applied is in exactly
// one plan, a rejected item in none, a chunk with nothing written has no
// plan, and each account's writes chain from its opening balance and
// version to its final one, so the plans alone say what changed.
func TestForEachRecordsSameStoreChunkPlans(t *testing.T) {
	ctx := context.Background()
	st, loc := checkpointtest.OpenNew(t)
	ledger(t, loc, map[string]int64{"a": 100, "b": 0, "c": 5})
	items := []xfer{
		{"T1", "a", "b", 30}, {"T2", "c", "a", 50}, // T2 overdraws c: rejected
		{"T3", "b", "c", 10}, {"T4", "a", "c", 20},
		{"T5", "c", "b", 70}, {"T6", "c", "a", 100}, // both rejected: a chunk without writes
		{"T7", "a", "b", 5},
	}
	target := steps.Target{Table: accountsTable}
	boom := errors.New("boom")
	run := beginEffects(t, st, "j/k")
	_, err := steps.ForEach(ctx, run, "post", steps.Slice(items, xferKey), func(ctx context.Context, x xfer, e *steps.Effects) (int64, error) {
		if x.ID == "T7" {
			return 0, boom
		}
		return post(ctx, x, e)
	}, steps.WithTarget(target), steps.ChunkSize(2))
	if !errors.Is(err, boom) {
		t.Fatalf("first attempt: err = %v; want boom", err)
	}
	run = beginEffects(t, st, "j/k")
	if _, err := steps.ForEach(ctx, run, "post", steps.Slice(items, xferKey), post, steps.WithTarget(target), steps.ChunkSize(2)); err != nil {
		t.Fatal(err)
	}

	var plans []checkpoint.ChunkPlanRecord
	err = st.RunChunkPlans(ctx, "j/k", checkpoint.Page{}, func(p checkpoint.ChunkPlan) error {
		if p.Step != "post" || p.Status != checkpoint.ChunkApplied {
			t.Errorf("chunk plan %s: step %q, status %q; want post, applied", p.EffectID, p.Step, p.Status)
		}
		pr, err := checkpoint.DecodeChunkPlan(p.Plan)
		if err != nil {
			return fmt.Errorf("decode %s: %w", p.EffectID, err)
		}
		if pr.EffectID != p.EffectID || pr.Target != target.String() {
			t.Errorf("plan %s records effect ID %q, target %q; want its own ID and %q", p.EffectID, pr.EffectID, pr.Target, target)
		}
		plans = append(plans, pr)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Chunks: (T1,T2) (T3,T4) (T5,T6: all rejected) by attempt 1, whose
	// (T7) failed before committing; then (T7) by attempt 2.
	var got [][]string
	for _, p := range plans {
		var keys []string
		for _, it := range p.Items {
			keys = append(keys, it.Key)
			if len(it.Ops) != 0 {
				// Recorded applied, never made again: the writes are the
				// record, the operations would only double its size.
				t.Errorf("same-store plan %s keeps item %s's operations %v; want the item's key only", p.EffectID, it.Key, it.Ops)
			}
		}
		got = append(got, keys)
	}
	if want := [][]string{{"T1"}, {"T3", "T4"}, {"T7"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("items of the chunk plans, in order = %v; want %v", got, want)
	}
	// Each key's writes chain from its opening state to its final one.
	last := map[string]checkpoint.Write{}
	opening := map[string]int64{"a": 100, "b": 0, "c": 5}
	for _, p := range plans {
		for _, w := range p.Writes {
			prev, seen := last[w.Key]
			wantVersion, wantValue := int64(0), opening[w.Key]
			if seen {
				wantVersion, wantValue = prev.OldVersion+1, prev.NewValue
			}
			if w.OldVersion != wantVersion || w.OldValue != wantValue {
				t.Errorf("write %+v; want it to start at version %d, value %d", w, wantVersion, wantValue)
			}
			last[w.Key] = w
		}
	}
	for k, w := range last {
		if v, ver := balance(t, loc, k); v != w.NewValue || ver != w.OldVersion+1 {
			t.Errorf("%s = %d (version %d); its last recorded write says %d (version %d)", k, v, ver, w.NewValue, w.OldVersion+1)
		}
	}
	if _, ok := last["a"]; !ok || len(last) != 3 {
		t.Errorf("keys written = %v; want a, b, c", last)
	}
}
