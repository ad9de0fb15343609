package storetest

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// bigChunk is more items than a store may record with one statement (a
// SQLite store records 1000 to a statement), so a chunk of it spans
// several.
const bigChunk = 2345

// itemsBigChunk is the Items test BigChunk: a chunk of thousands of items
// is recorded whole, each with its own fields; one finished item among
// them, in any statement of the chunk, refuses the whole chunk naming it.
func itemsBigChunk(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "items/big", ownerA, t0)
	chunk := make([]checkpoint.Item, bigChunk)
	for i := range chunk {
		chunk[i] = checkpoint.Item{Step: "post", Key: fmt.Sprintf("T-%05d", i), Status: checkpoint.StepCompleted,
			Output: []byte(fmt.Sprint(i)), Fingerprint: []byte(fmt.Sprintf("fp-%d", i))}
		if i%7 == 0 {
			chunk[i].Status, chunk[i].Error = checkpoint.StepRejected, fmt.Sprintf("rejected %d", i)
		}
	}
	e.putItems(st, c.Lease, chunk...)
	got := e.items(st, checkpoint.ItemQuery{RunID: "items/big", Step: "post"})
	if len(got) != bigChunk {
		t.Fatalf("%d items recorded of a chunk of %d", len(got), bigChunk)
	}
	for i, it := range got {
		w := chunk[i]
		if it.Key != w.Key || it.Status != w.Status || string(it.Output) != string(w.Output) || it.Error != w.Error ||
			string(it.Fingerprint) != string(w.Fingerprint) || it.Attempt != c.Lease.Attempt {
			t.Fatalf("item %d recorded as %+v; want %+v of attempt %d", i, it, w, c.Lease.Attempt)
		}
	}
	// A chunk of new items with one finished item, in the first, a middle
	// or the last statement of the chunk, is refused whole.
	c2 := e.claim(st, "items/big", ownerB, t0.Add(lease))
	for _, at := range []int{3, 1500, bigChunk - 1} {
		again := make([]checkpoint.Item, bigChunk)
		for i := range again {
			again[i] = checkpoint.Item{Step: "post", Key: fmt.Sprintf("U-%05d", i), Status: checkpoint.StepCompleted}
		}
		again[at].Key = chunk[at].Key // finished
		err := st.InTx(e.ctx, c2.Lease, func(tx checkpoint.Tx) error { return tx.PutItems(again) })
		if !errors.Is(err, checkpoint.ErrItemFinished) || !strings.Contains(fmt.Sprint(err), chunk[at].Key) {
			t.Errorf("a chunk with finished item %s at %d: %v; want ErrItemFinished naming it", chunk[at].Key, at, err)
		}
	}
	if n := len(e.items(st, checkpoint.ItemQuery{RunID: "items/big", Step: "post"})); n != bigChunk {
		t.Errorf("%d items after the refused chunks, want the %d first recorded (each refused chunk rolls back whole)", n, bigChunk)
	}
}
