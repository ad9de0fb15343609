package steps_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/steps"
)

// fpBatch is a batch step's world for the fingerprint tests: a ledger (in
// the checkpoint database or a separate file), the transfers of a source
// that tests change between attempts, and a run to resume.
type fpBatch struct {
	t      *testing.T
	st     *sqlite.Store
	store  checkpoint.Store // st, or a wrapper of it
	ledger *sql.DB
	target steps.Target
	items  []xfer // the source's current data, in key order
	calls  []string
	// accept, if set, is the next attempt's Config.AcceptChanged.
	accept *steps.Acceptance
	// fetches counts Paged fetches and their limits.
	fetches []int
}

func newFPBatch(t *testing.T, separate bool, n int) *fpBatch {
	t.Helper()
	st := checkpointtest.Open(t)
	b := &fpBatch{t: t, st: st, store: st, ledger: st.DB(), target: steps.Target{Table: accountsTable}}
	if separate {
		path := filepath.Join(t.TempDir(), "ledger.db")
		db, err := sqlite.OpenTarget(context.Background(), sqlite.Config{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		b.ledger, b.target.Path = db, path
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
	byID := steps.ItemInput(func(x xfer) any { return x.ID + "/" + x.From + "/" + x.To })
	if _, err := b.settle(b.slice(), "T012", byID); err == nil {
		t.Fatal("the first attempt should stop at T012")
	}
	b.set("T003", 99) // the amount is not declared
	if sum, err := b.settle(b.slice(), "", byID); err != nil || sum.Completed != 30 {
		t.Fatalf("an undeclared field changed: %+v, %v; want it ignored", sum, err)
	}
	// The same change is refused by the default fingerprint (the whole
	// item), and an ItemInput of another item type is refused up front.
	c := newFPBatch(t, false, 30)
	c.crashed(c.slice())
	c.set("T003", 99)
	_, err := c.settle(c.slice(), "")
	wantChange(t, err, steps.ItemContentChanged, "T003")
	_, err = c.settle(c.slice(), "", steps.ItemInput(func(s string) any { return s }))
	if err == nil || !strings.Contains(err.Error(), "ItemInput") || len(c.calls) != 0 {
		t.Fatalf("ItemInput of the wrong type: %v, calls %v", err, c.calls)
	}
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
		var status string
		b.st.DB().QueryRow(`SELECT status FROM steps WHERE step_id = 'post'`).Scan(&status)
		if status == checkpoint.StepCompleted {
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

func TestForEachCountShortcutLooksAheadOnce(t *testing.T) {
	for _, separate := range []bool{false, true} {
		t.Run(fmt.Sprintf("separate=%v", separate), func(t *testing.T) {
			b := newFPBatch(t, separate, 30)
			if _, err := b.settle(b.paged(30), ""); err != nil {
				t.Fatal(err)
			}
			unmark := func() {
				if _, err := b.st.DB().Exec(`DELETE FROM steps WHERE step_id = 'post'`); err != nil {
					t.Fatal(err)
				}
			}
			// Every declared item finished, nothing after the last: one
			// fetch of one item, and the step completes from its counts.
			unmark()
			b.fetches = nil
			sum, err := b.settle(b.paged(30), "")
			if err != nil || sum.Completed != 30 || !slices.Equal(b.fetches, []int{1}) || len(b.calls) != 0 {
				t.Fatalf("%+v, %v, fetches %v, calls %v; want the counts' summary after one fetch of 1", sum, err, b.fetches, b.calls)
			}
			// A transfer appended since is found, and refused.
			unmark()
			b.insert(xfer{ID: "T030", From: "a", To: "b", Amount: 31})
			_, err = b.settle(b.paged(30), "")
			wantChange(t, err, steps.ItemBeyondTotal, "T030")
			if b.balance() != b.sumOf(30) {
				t.Fatalf("b = %d, want %d", b.balance(), b.sumOf(30))
			}
			// A finished step still reads nothing.
			b.remove("T030")
			if _, err := b.settle(b.paged(30), ""); err != nil {
				t.Fatal(err)
			}
			b.fetches = nil
			if _, err := b.settle(b.paged(30), ""); err != nil || len(b.fetches) != 0 {
				t.Fatalf("finished step: %v, fetches %v", err, b.fetches)
			}
		})
	}
}

func TestForEachAcceptChanged(t *testing.T) {
	b := newFPBatch(t, true, 30)
	b.crashed(b.paged(30))
	b.set("T002", 300) // posted with 3: kept as posted
	b.remove("T008")   // posted: kept
	b.insert(xfer{ID: "T030", From: "a", To: "b", Amount: 31})
	b.insert(xfer{ID: "T031", From: "a", To: "b", Amount: 32}) // the 31st of 30
	b.accept = &steps.Acceptance{Operator: "ops@bank", Reason: "late booking, checked with the ledger team"}
	sum, err := b.settle(b.paged(30), "")
	if err != nil {
		t.Fatal(err)
	}
	if sum.Completed != 31 || b.balance() != b.sumOf(32) || slices.Contains(b.calls, "T002") {
		t.Fatalf("%+v, b = %d, calls %v", sum, b.balance(), b.calls)
	}
	rows, err := b.st.DB().Query(`SELECT operator, command, reason, details FROM audit WHERE run_id = 'j/k' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var audit []string
	for rows.Next() {
		var op, command, reason, details string
		if err := rows.Scan(&op, &command, &reason, &details); err != nil {
			t.Fatal(err)
		}
		if op != "ops@bank" || command != "accept-changed post" || reason != b.accept.Reason {
			t.Errorf("audit row %q %q %q", op, command, reason)
		}
		audit = append(audit, details)
	}
	rows.Close()
	all := strings.Join(audit, "\n")
	for _, want := range []string{"item T002 changed", "item T008 is no longer yielded", "item T031 is beyond the declared 30"} {
		if !strings.Contains(all, want) {
			t.Errorf("the audit does not say %q:\n%s", want, all)
		}
	}
	// The accepted fingerprint is recorded: reopened and read again
	// without acceptance, T002 as it is now passes (T008, still gone, is
	// refused again: nothing records its absence as accepted).
	b.accept = nil
	if _, err := b.st.DB().Exec(`DELETE FROM steps WHERE step_id = 'post'`); err != nil {
		t.Fatal(err)
	}
	_, err = b.settle(b.slice(), "")
	wantChange(t, err, steps.ItemMissing, "T008")
	if len(b.calls) != 0 {
		t.Fatalf("calls %v", b.calls)
	}
}

// itemReads counts the store's item reads.
type itemReads struct {
	*sqlite.Store
	n int
}

func (s *itemReads) Items(ctx context.Context, q checkpoint.ItemQuery, fn func(checkpoint.Item) error) error {
	s.n++
	return s.Store.Items(ctx, q, fn)
}

func TestForEachFreshAscendingReadsNothingBack(t *testing.T) {
	b := newFPBatch(t, false, 30)
	reads := &itemReads{Store: b.st}
	b.store = reads
	if _, err := b.settle(b.paged(30), ""); err != nil {
		t.Fatal(err)
	}
	if reads.n != 1 {
		t.Fatalf("%d item reads for a fresh ascending step, want 1 (is it fresh?)", reads.n)
	}
	var n int
	b.st.DB().QueryRow(`SELECT count(*) FROM items WHERE length(fingerprint) = ?`, steps.FingerprintSize).Scan(&n)
	if n != 30 {
		t.Fatalf("%d items recorded with a fingerprint, want 30", n)
	}
}

func TestForEachDoesNotCheckItemsRecordedWithoutAFingerprint(t *testing.T) {
	b := newFPBatch(t, false, 30)
	b.crashed(b.slice())
	// As recorded by a Stepwise from before fingerprints (schema 6).
	if _, err := b.st.DB().Exec(`UPDATE items SET fingerprint = NULL WHERE item_key = 'T004'`); err != nil {
		t.Fatal(err)
	}
	b.set("T004", 77)
	sum, err := b.settle(b.slice(), "")
	if err != nil || sum.Completed != 30 || slices.Contains(b.calls, "T004") {
		t.Fatalf("%+v, %v, calls %v; want the unfingerprinted item skipped as finished, unchecked", sum, err, b.calls)
	}
}
