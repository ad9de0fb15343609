package steps_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/steps"
)

// newItemsStore's transactions pass PutNewItems and PutItems on to the
// store's own and log which of the two each chunk was recorded with, by
// its first key.
type newItemsStore struct {
	checkpoint.Backend
	log *[]string
}

type newItemsTx struct {
	checkpoint.Tx
	log *[]string
}

func (tx newItemsTx) PutItems(items []checkpoint.Item) error {
	*tx.log = append(*tx.log, "put "+items[0].Key)
	return tx.Tx.PutItems(items)
}

func (tx newItemsTx) PutNewItems(items []checkpoint.Item) error {
	*tx.log = append(*tx.log, "new "+items[0].Key)
	return tx.Tx.PutNewItems(items)
}

func (s newItemsStore) InTx(ctx context.Context, l checkpoint.Lease, fn func(checkpoint.Tx) error) error {
	return s.Backend.InTx(ctx, l, func(tx checkpoint.Tx) error { return fn(newItemsTx{Tx: tx, log: s.log}) })
}

// TestForEachRecordsItemsAsNewOnlyWhenNoneCanBeRecorded: a fresh step
// whose keys ascend records its chunks as new items (the store may skip
// looking for recorded ones); a resumed step, or one whose keys stop
// ascending, records them with PutItems, with or without effects.
func TestForEachRecordsItemsAsNewOnlyWhenNoneCanBeRecorded(t *testing.T) {
	for _, withTarget := range []bool{false, true} {
		name := "no target"
		if withTarget {
			name = "same-store target"
		}
		t.Run(name, func(t *testing.T) {
			st, loc := checkpointtest.OpenNew(t)
			var opts []steps.Option
			if withTarget {
				ledger(t, loc, map[string]int64{"A": 0})
				opts = append(opts, steps.WithTarget(steps.Target{Table: accountsTable}))
			}
			opts = append(opts, steps.ChunkSize(2))
			var log []string
			store := newItemsStore{Backend: st, log: &log}
			boom := errors.New("boom")
			fn := func(fail string) func(context.Context, string, *steps.Effects) (int, error) {
				return func(ctx context.Context, it string, e *steps.Effects) (int, error) {
					if it == fail {
						return 0, boom
					}
					if withTarget {
						e.Add("A", 1)
					}
					return 1, nil
				}
			}
			src := steps.Slice([]string{"a", "b", "c", "d", "e", "f"}, func(s string) string { return s })
			run := rvBegin(t, st, store)
			if _, err := steps.ForEach(context.Background(), run, "post", src, fn("e"), opts...); !errors.Is(err, boom) {
				t.Fatalf("first attempt: %v; want boom", err)
			}
			if want := []string{"new a", "new c"}; !slices.Equal(log, want) {
				t.Errorf("fresh step with ascending keys recorded its chunks as %q; want %q", log, want)
			}
			log = nil
			run = rvBegin(t, st, store)
			if _, err := steps.ForEach(context.Background(), run, "post", src, fn(""), opts...); err != nil {
				t.Fatal(err)
			}
			if want := []string{"put e"}; !slices.Equal(log, want) {
				t.Errorf("resumed step recorded its chunks as %q; want %q (items are recorded: never as new)", log, want)
			}
			// A fresh step whose keys stop ascending.
			log = nil
			down := steps.Slice([]string{"a", "b", "d", "c", "f", "e"}, func(s string) string { return s })
			if _, err := steps.ForEach(context.Background(), run, "other", down, fn(""), opts...); err != nil {
				t.Fatal(err)
			}
			if want := []string{"new a", "put d", "put f"}; !slices.Equal(log, want) {
				t.Errorf("fresh step with unordered keys recorded its chunks as %q; want %q", log, want)
			}
		})
	}
}
