package steps_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/steps"
)

// fpBatch is a batch step's world for the fingerprint tests: a ledger (in
// the checkpoint database or a separate file), the transfers of a source
// that tests change between attempts, and a run to resume.
type fpBatch struct {
	t      *testing.T
	st     checkpoint.Backend
	store  checkpoint.Backend // st, or a wrapper of it
	ledger string             // the ledger's database location
	target steps.Target
	items  []xfer // the source's current data, in key order
	calls  []string
	// accept, if set, is the next attempt's Config.AcceptChanged.
	accept *steps.Acceptance
	// fetches counts Paged fetches and their limits.
	fetches []int
}

// newFPBatch makes a batch on the suite's store with the ledger in the
// store's database, or, separate, on a SQLite store with the ledger in a
// separate SQLite file (the PostgreSQL store cannot open a separate target
// yet; see checkpointtest.SeparateTarget).
func newFPBatch(t *testing.T, separate bool, n int) *fpBatch {
	t.Helper()
	if separate {
		st, loc := checkpointtest.SeparateTarget(t)
		return newFPBatchOn(t, st, loc, true, n)
	}
	st, loc := checkpointtest.OpenNew(t)
	return newFPBatchOn(t, st, loc, false, n)
}

// newFPBatchOn makes a batch on st with the ledger at loc: st's own
// database, or a separate one.
func newFPBatchOn(t *testing.T, st checkpoint.Backend, loc string, separate bool, n int) *fpBatch {
	t.Helper()
	b := &fpBatch{t: t, st: st, store: st, ledger: loc, target: steps.Target{Table: accountsTable}}
	if separate {
		b.target.Location = loc
	}
	ledger(t, b.ledger, map[string]int64{"a": 1_000_000, "b": 0})
	for i := range n {
		b.items = append(b.items, xfer{ID: fmt.Sprintf("T%03d", i), From: "a", To: "b", Amount: int64(i + 1)})
	}
	return b
}

// begin claims the run afresh and opens a new attempt's steps.Run.
func (b *fpBatch) begin() *steps.Run {
	b.t.Helper()
	ctx := context.Background()
	c, err := b.st.Claim(ctx, checkpoint.ClaimRequest{RunID: "j/k", Job: "j", RunKey: "k", Params: []byte("{}"), ParamsHash: "h",
		Owner: "test:1", Now: time.Now(), LeaseFor: time.Minute, OwnerGone: func(string) bool { return true }})
	if err != nil {
		b.t.Fatal(err)
	}
	run, err := steps.Begin(ctx, steps.Config{Store: b.store, Lease: c.Lease, AcceptChanged: b.accept})
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { run.Close() })
	return run
}

// paged is a Paged source over b.items with the given declared total.
func (b *fpBatch) paged(total int64) steps.Source[xfer] {
	return steps.Paged(5, xferKey, func(ctx context.Context, after string, limit int) ([]xfer, error) {
		b.fetches = append(b.fetches, limit)
		var page []xfer
		for _, x := range b.items {
			if x.ID > after && len(page) < limit {
				page = append(page, x)
			}
		}
		return page, nil
	}, total)
}

// slice is a Slice source over b.items (its keys not guaranteed to ascend).
func (b *fpBatch) slice() steps.Source[xfer] { return steps.Slice(slices.Clone(b.items), xferKey) }

// seq is a Seq source over b.items declaring total.
func (b *fpBatch) seq(total int64) steps.Source[xfer] {
	items := slices.Clone(b.items)
	return steps.Seq(func(yield func(string, xfer) bool) {
		for _, x := range items {
			if !yield(x.ID, x) {
				return
			}
		}
	}, total)
}

// settle runs one attempt of the batch step over src, failing (as a crash
// would stop it) at item failAt if set; chunks of 5.
func (b *fpBatch) settle(src steps.Source[xfer], failAt string, opts ...steps.Option) (steps.BatchSummary, error) {
	b.t.Helper()
	b.calls = nil
	run := b.begin()
	opts = append([]steps.Option{steps.WithTarget(b.target), steps.ChunkSize(5)}, opts...)
	return steps.ForEach(context.Background(), run, "post", src, func(ctx context.Context, x xfer, e *steps.Effects) (int64, error) {
		if x.ID == failAt {
			return 0, errors.New("stopped here")
		}
		b.calls = append(b.calls, x.ID)
		return post(ctx, x, e)
	}, opts...)
}

// crashed settles the first twelve items: chunks T000-T004 and T005-T009
// commit, then T010 and T011 of the third chunk, and T012 stops the step.
func (b *fpBatch) crashed(src steps.Source[xfer]) {
	b.t.Helper()
	if _, err := b.settle(src, "T012"); err == nil || !strings.Contains(err.Error(), "stopped here") {
		b.t.Fatalf("first attempt: %v, want it stopped at T012", err)
	}
	if got := b.balance(); got != b.sumOf(12) {
		b.t.Fatalf("b = %d after the first attempt, want %d", got, b.sumOf(12))
	}
}

func (b *fpBatch) balance() int64 {
	b.t.Helper()
	v, _ := balance(b.t, b.ledger, "b")
	return v
}

// sumOf is the amount of the first n original transfers (T000 is 1, ...).
func (b *fpBatch) sumOf(n int) int64 { return int64(n * (n + 1) / 2) }

func (b *fpBatch) set(id string, amount int64) {
	for i := range b.items {
		if b.items[i].ID == id {
			b.items[i].Amount = amount
			return
		}
	}
	b.t.Fatalf("no item %s", id)
}

func (b *fpBatch) remove(id string) {
	b.items = slices.DeleteFunc(b.items, func(x xfer) bool { return x.ID == id })
}

func (b *fpBatch) insert(x xfer) {
	b.items = append(b.items, x)
	slices.SortFunc(b.items, func(p, q xfer) int { return strings.Compare(p.ID, q.ID) })
}

// wantChange fails unless err is an *ItemChangedError of kind change
// naming key first.
func wantChange(t *testing.T, err error, change, key string) *steps.ItemChangedError {
	t.Helper()
	var ce *steps.ItemChangedError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want an *ItemChangedError (%s %s)", err, change, key)
	}
	if ce.Change != change || ce.Key != key || ce.Step != "post" || ce.RunID != "j/k" {
		t.Fatalf("change %q key %q step %q run %q, want %s %s of post (j/k): %v", ce.Change, ce.Key, ce.Step, ce.RunID, change, key, err)
	}
	if !strings.Contains(err.Error(), key) {
		t.Fatalf("the message does not name %s: %v", key, err)
	}
	return ce
}

func TestForEachRefusesAChangedFinishedItem(t *testing.T) {
	for _, separate := range []bool{false, true} {
		t.Run(fmt.Sprintf("separate=%v", separate), func(t *testing.T) {
			b := newFPBatch(t, separate, 30)
			b.crashed(b.slice())
			b.set("T007", 500) // posted with 8
			_, err := b.settle(b.slice(), "")
			ce := wantChange(t, err, steps.ItemContentChanged, "T007")
			if ce.Old == "" || ce.New == "" || ce.Old == ce.New {
				t.Fatalf("fingerprints %q -> %q", ce.Old, ce.New)
			}
			// Chunk T000-T004 replays, and the chunk holding T007 stops
			// before any of its items runs.
			if len(b.calls) != 0 || b.balance() != b.sumOf(12) {
				t.Fatalf("calls %v, b = %d; want nothing run, b = %d", b.calls, b.balance(), b.sumOf(12))
			}
			// Restored, the rerun goes on and posts each transfer once.
			b.set("T007", 8)
			sum, err := b.settle(b.slice(), "")
			if err != nil || sum.Completed != 30 || len(b.calls) != 18 || b.balance() != b.sumOf(30) {
				t.Fatalf("after restoring: %+v, %v, %d calls, b = %d; want 30 completed, 18 calls, b = %d",
					sum, err, len(b.calls), b.balance(), b.sumOf(30))
			}
		})
	}
}

func TestForEachProcessesAChangedUnprocessedItemAsItIsNow(t *testing.T) {
	b := newFPBatch(t, false, 30)
	b.crashed(b.paged(30))
	b.set("T020", 1000) // never processed
	sum, err := b.settle(b.paged(30), "")
	if err != nil || sum.Completed != 30 || b.balance() != b.sumOf(30)-21+1000 {
		t.Fatalf("%+v, %v, b = %d; want 30 completed and T020 posted with its new amount", sum, err, b.balance())
	}
}

func TestForEachItemInputDeclaresWhatIsFingerprinted(t *testing.T) {
	b := newFPBatch(t, false, 30)
	byID := func(x xfer) any { return x.ID + "/" + x.From + "/" + x.To }
	if _, err := b.settle(b.slice().ItemInput(byID), "T012"); err == nil {
		t.Fatal("the first attempt should stop at T012")
	}
	b.set("T003", 99) // the amount is not declared
	if sum, err := b.settle(b.slice().ItemInput(byID), ""); err != nil || sum.Completed != 30 {
		t.Fatalf("an undeclared field changed: %+v, %v; want it ignored", sum, err)
	}
	// The same change is refused by the default fingerprint (the whole
	// item). (An ItemInput of another item type does not compile.)
	c := newFPBatch(t, false, 30)
	c.crashed(c.slice())
	c.set("T003", 99)
	_, err := c.settle(c.slice(), "")
	wantChange(t, err, steps.ItemContentChanged, "T003")
}

func TestForEachRefusesAFinishedItemGoneFromTheSource(t *testing.T) {
	t.Run("paged, found at its chunk", func(t *testing.T) {
		b := newFPBatch(t, false, 30)
		b.crashed(b.paged(30))
		b.remove("T003")
		_, err := b.settle(b.paged(30), "")
		wantChange(t, err, steps.ItemMissing, "T003")
		if len(b.calls) != 0 {
			t.Fatalf("calls %v; the chunk that misses T003 is the first, nothing may run", b.calls)
		}
	})
	t.Run("paged, found after its last key", func(t *testing.T) {
		b := newFPBatch(t, true, 30)
		b.crashed(b.paged(30))
		b.items = b.items[:6] // T006 to T011 were posted, the rest never
		_, err := b.settle(b.paged(30), "")
		ce := wantChange(t, err, steps.ItemMissing, "T006")
		if ce.Count != 6 || !slices.Equal(ce.More, []string{"T007", "T008", "T009", "T010", "T011"}) {
			t.Fatalf("count %d, more %v; want the six gone named", ce.Count, ce.More)
		}
	})
	t.Run("slice, found at the end", func(t *testing.T) {
		b := newFPBatch(t, false, 30)
		b.crashed(b.slice())
		b.remove("T010")
		_, err := b.settle(b.slice(), "")
		wantChange(t, err, steps.ItemMissing, "T010")
		// Every other item was processed, once; the step is not finished.
		if len(b.calls) != 18 || b.balance() != b.sumOf(30) {
			t.Fatalf("%d calls, b = %d", len(b.calls), b.balance())
		}
		if s, _ := stepOf(t, b.st, "j/k", "post"); s.Status == checkpoint.StepCompleted {
			t.Fatal("the step was recorded as completed")
		}
		// Put back, the rerun completes it without running anything.
		b.insert(xfer{ID: "T010", From: "a", To: "b", Amount: 11})
		if sum, err := b.settle(b.slice(), ""); err != nil || sum.Completed != 30 || len(b.calls) != 0 {
			t.Fatalf("restored: %+v, %v, calls %v", sum, err, b.calls)
		}
	})
}

func TestForEachRefusesMoreItemsThanDeclared(t *testing.T) {
	t.Run("fresh", func(t *testing.T) {
		b := newFPBatch(t, false, 30)
		_, err := b.settle(b.seq(29), "")
		ce := wantChange(t, err, steps.ItemBeyondTotal, "T029")
		// The chunk holding the 30th item does not run at all.
		if ce.Declared != 29 || len(b.calls) != 25 {
			t.Fatalf("declared %d, %d calls; want 29 and the first five chunks run", ce.Declared, len(b.calls))
		}
	})
	t.Run("appended after a crash", func(t *testing.T) {
		b := newFPBatch(t, true, 30)
		b.crashed(b.paged(30))
		b.insert(xfer{ID: "T030", From: "a", To: "b", Amount: 31})
		_, err := b.settle(b.paged(30), "")
		ce := wantChange(t, err, steps.ItemBeyondTotal, "T030")
		if ce.Finished != 12 || b.balance() != b.sumOf(30) || slices.Contains(b.calls, "T030") {
			t.Fatalf("finished %d, b = %d, calls %v; want T000-T029 posted, T030 not", ce.Finished, b.balance(), b.calls)
		}
	})
	t.Run("inserted among finished items", func(t *testing.T) {
		b := newFPBatch(t, false, 30)
		b.crashed(b.paged(30))
		b.insert(xfer{ID: "T005a", From: "a", To: "b", Amount: 1000})
		_, err := b.settle(b.paged(30), "")
		ce := wantChange(t, err, steps.ItemInserted, "T005a")
		if ce.Before != "T006" || len(b.calls) != 0 || b.balance() != b.sumOf(12) {
			t.Fatalf("before %q, calls %v, b = %d; want T005a refused before it ran", ce.Before, b.calls, b.balance())
		}
	})
}

// TestForEachAllItemsDoneStepUnmarked is the crash between the last
// chunk's commit and the step's own record: every declared item is
// finished, the step is not. The rerun must not finish it from the item
// counts: a finished item altered or deleted since (or one appended) is
// refused as at any other chunk, and the step stays unfinished.
func TestForEachAllItemsDoneStepUnmarked(t *testing.T) {
	type change struct {
		name string
		do   func(b *fpBatch)
		kind string
		key  string
	}
	changes := []change{
		{"unchanged", func(b *fpBatch) {}, "", ""},
		{"alter the first", func(b *fpBatch) { b.set("T000", 700) }, steps.ItemContentChanged, "T000"},
		{"alter one", func(b *fpBatch) { b.set("T013", 700) }, steps.ItemContentChanged, "T013"},
		{"alter the last", func(b *fpBatch) { b.set("T029", 700) }, steps.ItemContentChanged, "T029"},
		{"delete one", func(b *fpBatch) { b.remove("T013") }, steps.ItemMissing, "T013"},
		{"delete the last", func(b *fpBatch) { b.remove("T029") }, steps.ItemMissing, "T029"},
		{"append one", func(b *fpBatch) { b.insert(xfer{ID: "T030", From: "a", To: "b", Amount: 31}) }, steps.ItemBeyondTotal, "T030"},
	}
	sources := map[string]func(b *fpBatch) steps.Source[xfer]{
		"paged": func(b *fpBatch) steps.Source[xfer] { return b.paged(30) },
		"slice": func(b *fpBatch) steps.Source[xfer] { return b.slice() },
		"seq":   func(b *fpBatch) steps.Source[xfer] { return b.seq(30) },
	}
	for _, separate := range []bool{false, true} {
		for srcName, src := range sources {
			for _, c := range changes {
				if c.kind == steps.ItemBeyondTotal && srcName == "slice" {
					continue // a Slice's total is its length: it cannot yield more than it declares
				}
				t.Run(fmt.Sprintf("separate=%v/%s/%s", separate, srcName, c.name), func(t *testing.T) {
					b := newFPBatch(t, separate, 30)
					if _, err := b.settle(src(b), ""); err != nil {
						t.Fatal(err)
					}
					resetStep(t, b.st, "j/k", "post")
					c.do(b)
					sum, err := b.settle(src(b), "")
					if b.balance() != b.sumOf(30) || len(b.calls) != 0 {
						t.Fatalf("b = %d, calls %v; want b = %d and nothing run again", b.balance(), b.calls, b.sumOf(30))
					}
					s, _ := stepOf(t, b.st, "j/k", "post")
					status := s.Status
					if c.kind == "" {
						if err != nil || sum.Completed != 30 || sum.Executed != 0 || status != checkpoint.StepCompleted {
							t.Fatalf("%+v, %v, step %q; want 30 completed, none executed, the step completed", sum, err, status)
						}
						return
					}
					wantChange(t, err, c.kind, c.key)
					if status == checkpoint.StepCompleted {
						t.Fatal("the step was recorded as completed")
					}
					// Refused again: a second try does not get past it.
					_, err = b.settle(src(b), "")
					wantChange(t, err, c.kind, c.key)
				})
			}
		}
	}
	// A finished step still reads nothing: its own record is the answer
	// (by design; a change after the step finished is not looked for).
	b := newFPBatch(t, false, 30)
	if _, err := b.settle(b.paged(30), ""); err != nil {
		t.Fatal(err)
	}
	b.set("T003", 99)
	b.fetches = nil
	if _, err := b.settle(b.paged(30), ""); err != nil || len(b.fetches) != 0 {
		t.Fatalf("finished step: %v, fetches %v; want its summary and no fetch", err, b.fetches)
	}
}

func TestForEachAcceptChanged(t *testing.T) {
	b := newFPBatch(t, true, 30)
	b.crashed(b.paged(30))
	b.set("T002", 300) // posted with 3: kept as posted
	b.remove("T008")   // posted: kept
	b.insert(xfer{ID: "T030", From: "a", To: "b", Amount: 31})
	b.insert(xfer{ID: "T031", From: "a", To: "b", Amount: 32}) // the 31st of 30
	ops := &steps.Acceptance{Operator: "ops@bank", Reason: "late booking, checked with the ledger team"}
	// Each acceptance covers what the refusal before it named, and the
	// next change is refused in its turn: T002, then T008, then T031.
	_, err := b.settle(b.paged(30), "")
	wantChange(t, err, steps.ItemContentChanged, "T002")
	b.accept = ops
	for _, next := range []struct{ kind, key string }{{steps.ItemMissing, "T008"}, {steps.ItemBeyondTotal, "T031"}} {
		_, err = b.settle(b.paged(30), "")
		ce := wantChange(t, err, next.kind, next.key)
		if ce.Count != 1 || len(ce.Also) != 0 {
			t.Fatalf("refusal names %d %s and %d other kinds; want %s alone: %v", ce.Count, ce.Change, len(ce.Also), next.key, err)
		}
	}
	sum, err := b.settle(b.paged(30), "")
	if err != nil {
		t.Fatal(err)
	}
	if sum.Completed != 31 || b.balance() != b.sumOf(32) || slices.Contains(b.calls, "T002") {
		t.Fatalf("%+v, b = %d, calls %v", sum, b.balance(), b.calls)
	}
	audits, err := b.st.Audits(context.Background(), "j/k")
	if err != nil {
		t.Fatal(err)
	}
	var audit []string
	for _, a := range audits {
		if a.Operator != "ops@bank" || a.Command != "accept-changed post" || a.Reason != ops.Reason {
			t.Errorf("audit record %q %q %q", a.Operator, a.Command, a.Reason)
		}
		audit = append(audit, a.Details)
	}
	want := []string{"post: item T002 changed", "post: item T008 is no longer yielded", "post: item T031 is beyond the declared 30"}
	if len(audit) != len(want) {
		t.Fatalf("audit %q; want one record per acceptance, %d", audit, len(want))
	}
	for i := range want {
		if !strings.HasPrefix(audit[i], want[i]) {
			t.Errorf("audit record %d says %q, want %q", i, audit[i], want[i])
		}
	}
	// The decisions are durable: reopened and read again without
	// acceptance, T002 as it is now and T008 gone both pass.
	b.accept = nil
	resetStep(t, b.st, "j/k", "post")
	if sum, err := b.settle(b.paged(31), ""); err != nil || sum.Completed != 31 || len(b.calls) != 0 {
		t.Fatalf("after the acceptances: %+v, %v, calls %v", sum, err, b.calls)
	}
	changes, err := b.st.ItemChanges(context.Background(), "j/k", "post")
	if err != nil {
		t.Fatal(err)
	}
	accepted := 0
	for _, c := range changes {
		if c.Status == checkpoint.ItemChangeAccepted && c.Operator == "ops@bank" {
			accepted++
		}
	}
	if accepted != 3 {
		t.Fatalf("%d changes recorded accepted by ops@bank, want 3", accepted)
	}
}

// TestForEachAcceptsOnlyWhatWasShown: an acceptance covers the changes the
// most recent refusal named, nothing more: a change found since (in the
// same chunk or a later one), or an item changed again after it was shown,
// is refused with its own error, and what was shown is still accepted.
func TestForEachAcceptsOnlyWhatWasShown(t *testing.T) {
	for _, separate := range []bool{false, true} {
		t.Run(fmt.Sprintf("separate=%v", separate), func(t *testing.T) {
			b := newFPBatch(t, separate, 30)
			b.crashed(b.paged(30))
			b.set("T001", 200)
			b.set("T003", 400)
			_, err := b.settle(b.paged(30), "")
			ce := wantChange(t, err, steps.ItemContentChanged, "T001")
			if ce.Count != 2 || !slices.Equal(ce.More, []string{"T003"}) {
				t.Fatalf("count %d, more %v; want T001 and T003 named", ce.Count, ce.More)
			}
			// Not shown: T004 (same chunk) and T007 (the next); T003 changed
			// again after it was shown.
			b.set("T004", 500)
			b.remove("T007")
			b.set("T003", 401)
			b.accept = &steps.Acceptance{Operator: "ops@bank", Reason: "booked late"}
			_, err = b.settle(b.paged(30), "")
			ce = wantChange(t, err, steps.ItemContentChanged, "T003")
			if ce.Count != 2 || !slices.Equal(ce.More, []string{"T004"}) || len(b.calls) != 0 {
				t.Fatalf("count %d, more %v, calls %v; want T003 and T004 refused, nothing run", ce.Count, ce.More, b.calls)
			}
			if strings.Contains(err.Error(), "T001") {
				t.Fatalf("T001 was shown and accepted, yet refused again: %v", err)
			}
			// The next acceptance takes T003 and T004, then T007 is refused.
			_, err = b.settle(b.paged(30), "")
			wantChange(t, err, steps.ItemMissing, "T007")
			sum, err := b.settle(b.paged(30), "")
			// T007, posted by the first attempt, stays posted once.
			if err != nil || sum.Completed != 29 || b.balance() != b.sumOf(30) {
				t.Fatalf("%+v, %v, b = %d", sum, err, b.balance())
			}
			var details []string
			audits, err := b.st.Audits(context.Background(), "j/k")
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range audits {
				details = append(details, a.Details)
			}
			all := strings.Join(details, "\n")
			if len(details) != 3 || !strings.Contains(details[0], "T001") || strings.Contains(details[0], "T003") ||
				!strings.Contains(details[1], "T003") || !strings.Contains(details[1], "T004") || !strings.Contains(details[2], "T007") {
				t.Fatalf("audit records:\n%s\nwant T001, then T003 and T004, then T007", all)
			}
		})
	}
}

// TestForEachRefusalNamesEveryKind: changes of several kinds found in one
// chunk are all named by the refusal, and all accepted by the next
// acceptance.
func TestForEachRefusalNamesEveryKind(t *testing.T) {
	b := newFPBatch(t, false, 30)
	b.crashed(b.paged(30))
	b.set("T001", 200)
	b.remove("T002")
	b.insert(xfer{ID: "T002a", From: "a", To: "b", Amount: 7})
	_, err := b.settle(b.paged(30), "")
	// T002's absence is found first, as the chunk's recorded items are read.
	ce := wantChange(t, err, steps.ItemMissing, "T002")
	if len(ce.Also) != 2 || ce.Also[0].Key != "T001" || ce.Also[0].Change != steps.ItemContentChanged ||
		ce.Also[1].Key != "T002a" || ce.Also[1].Change != steps.ItemInserted {
		t.Fatalf("also %+v; want T001 changed and T002a inserted named", ce.Also)
	}
	for _, want := range []string{"T001", "T002 ", "T002a", "exactly the items named here"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	b.accept = &steps.Acceptance{Operator: "ops", Reason: "checked"}
	if sum, err := b.settle(b.paged(30), ""); err != nil || sum.Completed != 30 {
		t.Fatalf("%+v, %v; want all three accepted in one go", sum, err)
	}
}

func TestBeginRefusesAnAcceptanceWithoutOperator(t *testing.T) {
	st := checkpointtest.Open(t)
	ctx := context.Background()
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: "j/k", Job: "j", RunKey: "k", Params: []byte("{}"), ParamsHash: "h",
		Owner: "test:1", Now: time.Now(), LeaseFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []steps.Acceptance{{Reason: "checked"}, {Operator: "ops", Reason: " "}} {
		_, err := steps.Begin(ctx, steps.Config{Store: st, Lease: c.Lease, AcceptChanged: &a})
		if !errors.Is(err, steps.ErrNoOperator) {
			t.Errorf("acceptance %+v: %v, want ErrNoOperator", a, err)
		}
	}
}

// itemReads counts the store's item reads.
type itemReads struct {
	checkpoint.Backend
	n int
}

func (s *itemReads) Items(ctx context.Context, q checkpoint.ItemQuery, fn func(checkpoint.Item) error) error {
	s.n++
	return s.Backend.Items(ctx, q, fn)
}

func TestForEachFreshAscendingReadsNothingBack(t *testing.T) {
	b := newFPBatch(t, false, 30)
	reads := &itemReads{Backend: b.st}
	b.store = reads
	if _, err := b.settle(b.paged(30), ""); err != nil {
		t.Fatal(err)
	}
	if reads.n != 1 {
		t.Fatalf("%d item reads for a fresh ascending step, want 1 (is it fresh?)", reads.n)
	}
	n := 0
	err := b.st.Items(context.Background(), checkpoint.ItemQuery{RunID: "j/k", Step: "post"}, func(it checkpoint.Item) error {
		if len(it.Fingerprint) >= steps.FingerprintSize { // the fingerprint, then the item's content
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != 30 {
		t.Fatalf("%d items recorded with a fingerprint, want 30", n)
	}
}

// A rerun after a crash part-way reads back only the chunks that can hold
// recorded items: past the greatest key recorded before the attempt there
// is nothing to read (30 items in chunks of 5, 12 recorded: the first
// probe, and the chunks T000-T004, T005-T009 and T010-T014).
func TestForEachResumedAscendingReadsBackOnlyRecordedChunks(t *testing.T) {
	b := newFPBatch(t, false, 30)
	b.crashed(b.paged(30))
	reads := &itemReads{Backend: b.st}
	b.store = reads
	if sum, err := b.settle(b.paged(30), ""); err != nil || sum.Completed != 30 {
		t.Fatalf("%+v, %v", sum, err)
	}
	if reads.n > 5 {
		t.Fatalf("%d item reads to resume 30 items after 12, want at most 5: chunks past the last recorded key read nothing back", reads.n)
	}
}

// noFingerprint is the real store recording one item key without a
// fingerprint, as a Stepwise from before fingerprints (schema 6) did.
type noFingerprint struct {
	checkpoint.Backend
	key string
}

func (s noFingerprint) InTx(ctx context.Context, l checkpoint.Lease, fn func(checkpoint.Tx) error) error {
	return s.Backend.InTx(ctx, l, func(tx checkpoint.Tx) error { return fn(noFingerprintTx{tx, s.key}) })
}

type noFingerprintTx struct {
	checkpoint.Tx
	key string
}

func (tx noFingerprintTx) PutNewItems(items []checkpoint.Item) error {
	return tx.Tx.PutNewItems(tx.strip(items))
}

func (tx noFingerprintTx) PutItems(items []checkpoint.Item) error {
	return tx.Tx.PutItems(tx.strip(items))
}

// strip returns items with the fingerprint of the item under tx.key taken
// away.
func (tx noFingerprintTx) strip(items []checkpoint.Item) []checkpoint.Item {
	items = slices.Clone(items)
	for i := range items {
		if items[i].Key == tx.key {
			items[i].Fingerprint = nil
		}
	}
	return items
}

func TestForEachDoesNotCheckItemsRecordedWithoutAFingerprint(t *testing.T) {
	b := newFPBatch(t, false, 30)
	// T004 recorded without a fingerprint, as by a Stepwise from before
	// fingerprints (schema 6).
	b.store = noFingerprint{Backend: b.st, key: "T004"}
	b.crashed(b.slice())
	b.store = b.st
	var fp []byte
	err := b.st.Items(context.Background(), checkpoint.ItemQuery{RunID: "j/k", Step: "post", Keys: []string{"T004"}}, func(it checkpoint.Item) error {
		fp = it.Fingerprint
		return nil
	})
	if err != nil || fp != nil {
		t.Fatalf("T004 recorded with fingerprint %x (%v); the setup wants none", fp, err)
	}
	b.set("T004", 77)
	sum, err := b.settle(b.slice(), "")
	if err != nil || sum.Completed != 30 || slices.Contains(b.calls, "T004") {
		t.Fatalf("%+v, %v, calls %v; want the unfingerprinted item skipped as finished, unchecked", sum, err, b.calls)
	}
}

// TestForEachStoppedRecordsItsProgress: a batch step that stops before its
// end (here an item's failure after twelve items) leaves its running
// checkpoint counting what this attempt processed, not the empty summary
// it started with.
func TestForEachStoppedRecordsItsProgress(t *testing.T) {
	b := newFPBatch(t, false, 30)
	b.crashed(b.paged(30))
	s, ok := stepOf(t, b.st, "j/k", "post")
	if !ok {
		t.Fatal("no checkpoint of the step")
	}
	status, raw := s.Status, s.Output
	var sum steps.BatchSummary
	if err := json.Unmarshal(raw, &sum); err != nil {
		t.Fatal(err)
	}
	if status != checkpoint.StepRunning || sum.Executed != 12 || sum.Completed != 12 || sum.Total != 30 {
		t.Fatalf("step %q, output %s; want running with 12 executed and completed of 30", status, raw)
	}
}
