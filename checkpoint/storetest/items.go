package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// itemKeys are keys whose bytewise order differs from a case-insensitive
// or locale order: every store compares keys bytewise.
var itemKeys = []string{"T-10", "T-2", "T/1", "Z", "a", "a b", "ab", "é"}

// keysOf lists the keys of items.
func keysOf(items []checkpoint.Item) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.Key)
	}
	return out
}

// putItems records items of step in one transaction.
func (e *env) putItems(st checkpoint.Store, l checkpoint.Lease, items ...checkpoint.Item) {
	e.t.Helper()
	e.inTx(st, l, func(tx checkpoint.Tx) error { return tx.PutItems(items) })
}

// putNew records items as new (Tx.PutNewItems).
func putNew(tx checkpoint.Tx, items ...checkpoint.Item) error {
	return tx.PutNewItems(items)
}

func testItems(t *testing.T, h Harness) {
	t.Run("NewItems", func(t *testing.T) { itemsNewItems(t, h) })
	t.Run("RecordedInBytewiseKeyOrder", func(t *testing.T) { itemsRecordedInBytewiseKeyOrder(t, h) })
	callerClock(t, h, "FinishedNeverOverwritten", itemsFinishedNeverOverwritten)
	t.Run("Queries", func(t *testing.T) { itemsQueries(t, h) })
	t.Run("Counts", func(t *testing.T) { itemsCounts(t, h) })
	t.Run("FingerprintsAndAcceptedChanges", func(t *testing.T) { itemsFingerprintsAndAcceptedChanges(t, h) })
	callerClock(t, h, "BigChunk", itemsBigChunk)
}

// itemsNewItems is the Items test NewItems.
func itemsNewItems(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "items/7", ownerA, t0)
	// Each as the only write of its transaction, and after a read
	// opened it.
	open := func(tx checkpoint.Tx) error {
		g, err := tx.Target(checkpoint.StateTable)
		if err == nil {
			_, err = g.Read(e.ctx, []string{"k"})
		}
		return err
	}
	none := func(checkpoint.Tx) error { return nil }
	for i, first := range []func(checkpoint.Tx) error{none, open} {
		done := fmt.Sprintf("done%d", i)
		e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
			if err := first(tx); err != nil {
				return err
			}
			return putNew(tx,
				checkpoint.Item{Step: "post", Key: done, Status: checkpoint.StepCompleted, Output: []byte(`1`), Fingerprint: []byte{1}},
				checkpoint.Item{Step: "post", Key: fmt.Sprintf("no%d", i), Status: checkpoint.StepRejected, Error: "closed"},
				checkpoint.Item{Step: "post", Key: fmt.Sprintf("skip%d", i), Status: checkpoint.ItemSkipped, Error: "bad"})
		})
		got := e.items(st, checkpoint.ItemQuery{RunID: "items/7", Step: "post", Keys: []string{done}})
		if len(got) != 1 || string(got[0].Output) != `1` || string(got[0].Fingerprint) != "\x01" || got[0].Attempt != c.Lease.Attempt {
			t.Fatalf("new item %s = %+v; want it as given", done, got)
		}
		// A finished item given as new after all is refused, and the
		// transaction keeps nothing.
		for _, refused := range [][]checkpoint.Item{
			{{Step: "post", Key: "fresh", Status: checkpoint.StepCompleted}, {Step: "post", Key: done, Status: checkpoint.StepCompleted, Output: []byte(`2`)}},
			{{Step: "post", Key: "twice", Status: checkpoint.StepCompleted}, {Step: "post", Key: "twice", Status: checkpoint.StepCompleted}},
			{{Step: "post", Key: "twice", Status: checkpoint.ItemSkipped}, {Step: "post", Key: "twice", Status: checkpoint.ItemSkipped}},
		} {
			err := st.InTx(e.ctx, c.Lease, func(tx checkpoint.Tx) error {
				if err := first(tx); err != nil {
					return err
				}
				if err := tx.PutStep(completed("side", `1`)); err != nil {
					return err
				}
				return putNew(tx, refused...)
			})
			if err == nil {
				t.Errorf("recording %q as new: no error; want it refused", keysOf(refused))
			}
			if refused[1].Key == done && !errors.Is(err, checkpoint.ErrItemFinished) {
				t.Errorf("recording finished item %s as new: %v; want ErrItemFinished", done, err)
			}
			if got := e.steps(st, "items/7"); len(got) != 0 {
				t.Errorf("steps of the refused transaction = %+v; want none", got)
			}
			if got := e.items(st, checkpoint.ItemQuery{RunID: "items/7", Step: "post", Keys: []string{"fresh", "twice", done}}); len(got) != 1 || string(got[0].Output) != `1` {
				t.Errorf("items after the refusal = %+v; want only %s, unchanged", got, done)
			}
		}
		// An unfinished one is refused or recorded again; never half.
		skip := fmt.Sprintf("skip%d", i)
		err := st.InTx(e.ctx, c.Lease, func(tx checkpoint.Tx) error {
			if err := first(tx); err != nil {
				return err
			}
			return putNew(tx, checkpoint.Item{Step: "post", Key: "other" + skip, Status: checkpoint.StepCompleted},
				checkpoint.Item{Step: "post", Key: skip, Status: checkpoint.StepCompleted, Output: []byte(`3`)})
		})
		got = e.items(st, checkpoint.ItemQuery{RunID: "items/7", Step: "post", Keys: []string{"other" + skip, skip}})
		switch {
		case err == nil && len(got) == 2 && got[1].Status == checkpoint.StepCompleted && string(got[1].Output) == `3`:
		case err != nil && len(got) == 1 && got[0].Status == checkpoint.ItemSkipped:
		default:
			t.Errorf("recording skipped item %s as new: %v, items then %+v; want it refused with nothing kept, or both recorded", skip, err, got)
		}
	}
}

// itemsRecordedInBytewiseKeyOrder is the Items test RecordedInBytewiseKeyOrder.
func itemsRecordedInBytewiseKeyOrder(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	c := e.claim(a, "items/1", ownerA, t0)
	// Written in reverse, in two chunks.
	var items []checkpoint.Item
	for i := len(itemKeys) - 1; i >= 0; i-- {
		k := itemKeys[i]
		items = append(items, checkpoint.Item{Step: "post", Key: k, Status: checkpoint.StepCompleted,
			Output: fmt.Appendf(nil, `{"key":%q}`, k), Chunk: "", Fingerprint: []byte("fp:" + k)})
	}
	e.putItems(a, c.Lease, items[:3]...)
	e.putItems(a, c.Lease, items[3:]...)
	got := e.items(b, checkpoint.ItemQuery{RunID: "items/1", Step: "post"})
	if !slices.Equal(keysOf(got), itemKeys) {
		t.Fatalf("items = %q; want %q (bytewise order)", keysOf(got), itemKeys)
	}
	for _, it := range got {
		if it.Step != "post" || it.Status != checkpoint.StepCompleted || string(it.Output) != fmt.Sprintf(`{"key":%q}`, it.Key) ||
			it.Attempt != c.Lease.Attempt || string(it.Fingerprint) != "fp:"+it.Key {
			t.Errorf("item = %+v; want it as written, attempt %d", it, c.Lease.Attempt)
		}
	}
	if other := e.items(b, checkpoint.ItemQuery{RunID: "items/1", Step: "other"}); len(other) != 0 {
		t.Errorf("items of another step = %+v; want none", other)
	}
	if other := e.items(b, checkpoint.ItemQuery{RunID: "items/2", Step: "post"}); len(other) != 0 {
		t.Errorf("items of another run = %+v; want none", other)
	}
}

// itemsFinishedNeverOverwritten is the Items test FinishedNeverOverwritten.
func itemsFinishedNeverOverwritten(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "items/2", ownerA, t0)
	e.putItems(st, c.Lease,
		checkpoint.Item{Step: "post", Key: "done", Status: checkpoint.StepCompleted, Output: []byte(`1`)},
		checkpoint.Item{Step: "post", Key: "no", Status: checkpoint.StepRejected, Error: "closed"},
		checkpoint.Item{Step: "post", Key: "skip", Status: checkpoint.ItemSkipped, Error: "bad"},
		checkpoint.Item{Step: "post", Key: "plan", Status: checkpoint.StepPlanned, Chunk: "c1"},
	)
	c2 := e.claim(st, "items/2", ownerB, t0.Add(lease))
	for _, key := range []string{"done", "no"} {
		err := st.InTx(e.ctx, c2.Lease, func(tx checkpoint.Tx) error {
			if err := tx.PutStep(completed("side", `1`)); err != nil {
				return err
			}
			return tx.PutItems([]checkpoint.Item{
				{Step: "post", Key: "fresh", Status: checkpoint.StepCompleted},
				{Step: "post", Key: key, Status: checkpoint.StepCompleted, Output: []byte(`2`)},
			})
		})
		if !errors.Is(err, checkpoint.ErrItemFinished) {
			t.Errorf("re-recording finished item %q: %v; want ErrItemFinished", key, err)
		}
	}
	if got := e.steps(st, "items/2"); len(got) != 0 {
		t.Errorf("steps of the refused transactions = %+v; want none (the whole chunk rolls back)", got)
	}
	got := e.items(st, checkpoint.ItemQuery{RunID: "items/2", Step: "post"})
	if strings.Join(keysOf(got), " ") != "done no plan skip" || string(got[0].Output) != `1` || got[1].Error != "closed" {
		t.Fatalf("items after the refusals = %+v; want the four first recorded, unchanged", got)
	}
	// Skipped and planned items are not finished: a later attempt records them.
	e.putItems(st, c2.Lease,
		checkpoint.Item{Step: "post", Key: "skip", Status: checkpoint.StepCompleted, Output: []byte(`3`)},
		checkpoint.Item{Step: "post", Key: "plan", Status: checkpoint.StepCompleted, Output: []byte(`4`)},
	)
	for _, it := range e.items(st, checkpoint.ItemQuery{RunID: "items/2", Step: "post", Keys: []string{"skip", "plan"}}) {
		if it.Status != checkpoint.StepCompleted || it.Attempt != c2.Lease.Attempt || it.Error != "" || it.Chunk != "" {
			t.Errorf("item %s recorded again = %+v; want completed by attempt %d, error and chunk cleared", it.Key, it, c2.Lease.Attempt)
		}
	}
}

// itemsQueries is the Items test Queries.
func itemsQueries(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "items/3", ownerA, t0)
	var all []checkpoint.Item
	for i, k := range itemKeys {
		status := []string{checkpoint.StepCompleted, checkpoint.ItemSkipped}[i%2]
		all = append(all, checkpoint.Item{Step: "post", Key: k, Status: status, Output: []byte(`"` + k + `"`), Error: "e-" + k, Fingerprint: []byte{byte(i), 0xff}})
	}
	e.putItems(st, c.Lease, all...)
	byKey := map[string]checkpoint.Item{}
	for _, it := range all {
		byKey[it.Key] = it
	}
	q := func(mod func(*checkpoint.ItemQuery)) checkpoint.ItemQuery {
		qq := checkpoint.ItemQuery{RunID: "items/3", Step: "post"}
		mod(&qq)
		return qq
	}
	for _, tc := range []struct {
		name string
		q    checkpoint.ItemQuery
		want []string
		// full: outputs and errors are read, not only keys.
		full bool
	}{
		{"keys", q(func(q *checkpoint.ItemQuery) { q.Keys = []string{"é", "T-2", "missing", "a"} }), []string{"T-2", "a", "é"}, true},
		{"keys only", q(func(q *checkpoint.ItemQuery) { q.Keys = []string{"Z", "T/1"}; q.KeysOnly = true }), []string{"T/1", "Z"}, false},
		{"range", q(func(q *checkpoint.ItemQuery) { q.From, q.To = "T/1", "a b" }), []string{"T/1", "Z", "a", "a b"}, false},
		{"range from the start", q(func(q *checkpoint.ItemQuery) { q.To = "T-2" }), []string{"T-10", "T-2"}, false},
		{"status", q(func(q *checkpoint.ItemQuery) { q.Status = checkpoint.ItemSkipped }), []string{"T-2", "Z", "a b", "é"}, true},
		{"status page", q(func(q *checkpoint.ItemQuery) { q.Status = checkpoint.ItemSkipped; q.Limit = 2 }), []string{"T-2", "Z"}, true},
		{"status next page", q(func(q *checkpoint.ItemQuery) { q.Status = checkpoint.ItemSkipped; q.Limit = 2; q.After = "Z" }), []string{"a b", "é"}, true},
		{"keys only, limit", q(func(q *checkpoint.ItemQuery) { q.KeysOnly = true; q.Limit = 3 }), []string{"T-10", "T-2", "T/1"}, false},
		{"greatest key", q(func(q *checkpoint.ItemQuery) { q.KeysOnly = true; q.Last = true; q.Limit = 1 }), []string{"é"}, false},
	} {
		got := e.items(st, tc.q)
		if !slices.Equal(keysOf(got), tc.want) {
			t.Errorf("%s: keys %q; want %q", tc.name, keysOf(got), tc.want)
			continue
		}
		for _, it := range got {
			w := byKey[it.Key]
			// Every mode reads the status and the fingerprint.
			if it.Step != "post" || it.Status != w.Status || string(it.Fingerprint) != string(w.Fingerprint) {
				t.Errorf("%s: item %+v; want status %s and fingerprint %x", tc.name, it, w.Status, w.Fingerprint)
			}
			if tc.full && (string(it.Output) != string(w.Output) || it.Error != w.Error || it.Attempt != c.Lease.Attempt) {
				t.Errorf("%s: item %+v; want output %s, error %s, attempt %d", tc.name, it, w.Output, w.Error, c.Lease.Attempt)
			}
		}
	}
}

// itemsCounts is the Items test Counts.
func itemsCounts(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "items/4", ownerA, t0)
	for i := range 5 {
		e.putItems(st, c.Lease, checkpoint.Item{Step: "post", Key: fmt.Sprint(i), Status: []string{checkpoint.StepCompleted, checkpoint.ItemSkipped}[i%2]})
	}
	e.putItems(st, c.Lease,
		checkpoint.Item{Step: "load", Key: "x", Status: checkpoint.StepPlanned},
		checkpoint.Item{Step: "load", Key: "y", Status: checkpoint.StepRejected})
	other := e.claim(st, "items/5", ownerA, t0)
	e.putItems(st, other.Lease, checkpoint.Item{Step: "post", Key: "z", Status: checkpoint.StepCompleted})
	counts, err := st.ItemCounts(e.ctx, "items/4")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, n := range counts {
		got[n.Step+" "+n.Status] += n.Count
	}
	want := map[string]int64{"post completed": 3, "post skipped": 2, "load planned": 1, "load rejected": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("ItemCounts = %v; want %v", got, want)
	}
}

// itemsFingerprintsAndAcceptedChanges is the Items test FingerprintsAndAcceptedChanges.
func itemsFingerprintsAndAcceptedChanges(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	op := capability[operator](t, st, "audit log")
	c := e.claim(st, "items/6", ownerA, t0)
	e.putItems(st, c.Lease,
		checkpoint.Item{Step: "post", Key: "a", Status: checkpoint.StepCompleted, Output: []byte(`"A"`), Fingerprint: []byte{1}},
		checkpoint.Item{Step: "post", Key: "b", Status: checkpoint.StepRejected, Error: "no", Fingerprint: []byte{2}},
		checkpoint.Item{Step: "post", Key: "old", Status: checkpoint.StepCompleted}, // recorded before fingerprints
	)
	if got := e.items(st, checkpoint.ItemQuery{RunID: "items/6", Step: "post", Keys: []string{"old"}}); got[0].Fingerprint != nil {
		t.Errorf("an item recorded without a fingerprint reads %x; want nil", got[0].Fingerprint)
	}
	acc := audit("items/6", "accept", t0.Add(time.Hour))
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
		return tx.AcceptItemChanges(acc, []checkpoint.Item{
			{Step: "post", Key: "a", Status: checkpoint.StepFailed, Output: []byte(`"ignored"`), Fingerprint: []byte{9}},
			{Step: "post", Key: "b", Fingerprint: []byte{8}},
		}, nil)
	})
	got := e.items(st, checkpoint.ItemQuery{RunID: "items/6", Step: "post"})
	if string(got[0].Fingerprint) != "\x09" || got[0].Status != checkpoint.StepCompleted || string(got[0].Output) != `"A"` ||
		string(got[1].Fingerprint) != "\x08" || got[1].Status != checkpoint.StepRejected || got[1].Error != "no" {
		t.Errorf("items after accepting changes = %+v; want new fingerprints and nothing else changed", got)
	}
	err := st.InTx(e.ctx, c.Lease, func(tx checkpoint.Tx) error {
		return tx.AcceptItemChanges(audit("items/6", "accept", t0.Add(2*time.Hour)), []checkpoint.Item{
			{Step: "post", Key: "a", Fingerprint: []byte{7}},
			{Step: "post", Key: "never", Fingerprint: []byte{6}},
		}, nil)
	})
	if !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("accepting a change to an item never recorded: %v; want ErrNotFound", err)
	}
	if got := e.items(st, checkpoint.ItemQuery{RunID: "items/6", Step: "post", Keys: []string{"a"}}); string(got[0].Fingerprint) != "\x09" {
		t.Errorf("item a after the refused acceptance has fingerprint %x; want 09 (all or nothing)", got[0].Fingerprint)
	}
	as, err := op.Audits(e.ctx, "items/6")
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != 1 || as[0] != (checkpoint.Audit{RunID: "items/6", At: as[0].At, Operator: acc.Operator, Command: "accept", Reason: acc.Reason}) || !sameTime(as[0].At, acc.At) {
		t.Errorf("audit = %+v; want only the accepted change %+v", as, acc)
	}
	// An acceptance with no items (the source lost some) is still audited.
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
		return tx.AcceptItemChanges(audit("items/6", "accept-gone", t0.Add(3*time.Hour)), nil, nil)
	})
	if as, _ := op.Audits(e.ctx, "items/6"); len(as) != 2 || as[1].Command != "accept-gone" {
		t.Errorf("audit after an acceptance without items = %+v; want it recorded", as)
	}
}
