package steps

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// FingerprintSize is the length in bytes of an item fingerprint: the first
// 16 bytes of a SHA-256.
const FingerprintSize = 16

// Kinds of change an ItemChangedError reports (its Change field).
const (
	// ItemContentChanged: a finished item's content (its fingerprint)
	// differs from when it was processed.
	ItemContentChanged = "changed"
	// ItemMissing: an item was processed by an earlier attempt and the
	// source no longer yields it.
	ItemMissing = "missing"
	// ItemBeyondTotal: the source yields more items than its declared
	// total; the item named would be one too many.
	ItemBeyondTotal = "beyond-total"
	// ItemInserted: a new item of a source whose keys ascend sorts before
	// items an earlier attempt already processed: it appeared among them
	// since, and the source declares a total it would exceed.
	ItemInserted = "inserted"
)

// ItemChangedError is returned by ForEach when the source of a batch step
// changed since an earlier attempt processed some of its items: a finished
// item's content differs, a finished item is no longer yielded, or the
// source yields more items than it declared. This is Input's "same key,
// different body" rule applied to items. Nothing of the chunk where it was
// found is processed; items of earlier chunks stay committed, each processed
// once. The run needs a decision: restore the source, accept the change
// (Config.AcceptChanged, audited) or reset the step (which processes every
// item again, effects included).
type ItemChangedError struct {
	RunID  string
	Step   string // the batch step
	Key    string // the first item found with this change
	Change string // ItemContentChanged, ItemMissing, ItemBeyondTotal or ItemInserted
	// Old and New are the recorded and current fingerprints (hex), for
	// ItemContentChanged.
	Old, New string
	// Declared is the source's declared total (-1 if none) and Finished
	// the items recorded before this attempt.
	Declared, Finished int64
	// Before names a finished item that sorts after Key, for ItemInserted.
	Before string
	// Count is how many items were found with this change (Key included);
	// More names some of the others.
	Count int
	More  []string
}

func (e *ItemChangedError) Error() string {
	var b strings.Builder
	switch e.Change {
	case ItemContentChanged:
		fmt.Fprintf(&b, "item %s of batch step %s (run %s) changed since it was processed (fingerprint %s, now %s)",
			e.Key, e.Step, e.RunID, short(e.Old), short(e.New))
	case ItemMissing:
		if e.Key == "" { // not named: the source did not yield the same items when read again
			fmt.Fprintf(&b, "%d items of batch step %s (run %s) were processed, and the source no longer yields them "+
				"(the source did not yield the same items again, so they are not named)", e.Count, e.Step, e.RunID)
			break
		}
		fmt.Fprintf(&b, "item %s of batch step %s (run %s) was processed, and the source no longer yields it", e.Key, e.Step, e.RunID)
	case ItemInserted:
		fmt.Fprintf(&b, "item %s of batch step %s (run %s) is new, yet sorts before item %s, which an earlier attempt processed: "+
			"it appeared among processed items since (the source declares %d items, %d were processed before)",
			e.Key, e.Step, e.RunID, e.Before, e.Declared, e.Finished)
	default:
		fmt.Fprintf(&b, "the source of batch step %s (run %s) yields more items than the %d it declares: %d were processed before, "+
			"and item %s is one more", e.Step, e.RunID, e.Declared, e.Finished, e.Key)
	}
	if e.Count > 1 && e.Key != "" {
		fmt.Fprintf(&b, "; %d items in all (also %s", e.Count, strings.Join(e.More, ", "))
		if len(e.More) < e.Count-1 {
			b.WriteString(", ...")
		}
		b.WriteString(")")
	}
	switch e.Change {
	case ItemContentChanged, ItemMissing:
		b.WriteString(". Its outcome and effects stand as first processed; nothing was processed again. " +
			"Restore the source's old data and run again; or accept the change as an operator (audited: the item is not processed again); " +
			"or reset the step, which processes every item again, effects included")
	default:
		b.WriteString(". Nothing of it was processed. If the items belong to this run, the declared total is stale: " +
			"redo what declared it, or accept the extra items as an operator (audited) to process them; otherwise remove them from the source")
	}
	return b.String()
}

// ItemInput declares what of each item of a ForEach its fingerprint
// covers, as Input does for a step: fn's result is hashed (its bytes for a
// []byte or string, else its JSON encoding) and recorded with the item's
// checkpoint, and a rerun that finds a finished item whose fingerprint
// differs fails with an *ItemChangedError instead of settling it silently
// wrong. By default the whole item's JSON encoding is fingerprinted; declare
// less (an ID and a version column, say) to ignore fields that may change
// harmlessly or to save encoding a large item. The type parameter must be
// the ForEach's item type.
func ItemInput[I any](fn func(item I) any) Option {
	return func(o *doOptions) { o.itemInput = fn }
}

// Acceptance is an operator's decision to let batch steps go on past items
// whose source changed (Config.AcceptChanged): a finished item whose
// content changed keeps its outcome and effects and gets its new
// fingerprint; a finished item no longer yielded stays as it is; extra
// items beyond the declared total are processed. Each acceptance is
// recorded in the run's audit log with Operator and Reason.
type Acceptance struct {
	Operator string
	Reason   string
}

// fingerprinter hashes items of a ForEach into fixed-size fingerprints,
// reusing its encoding buffer.
type fingerprinter[I any] struct {
	step  string
	input func(I) any
	buf   bytes.Buffer
	enc   *json.Encoder
}

func newFingerprinter[I any](step string, input any) (*fingerprinter[I], error) {
	f := &fingerprinter[I]{step: step}
	if input != nil {
		fn, ok := input.(func(I) any)
		if !ok {
			var zero I
			return nil, fmt.Errorf("steps: batch step %s: ItemInput is given a %T, but the items are %T; pass a func(%T) any",
				step, input, zero, zero)
		}
		f.input = fn
	}
	f.enc = json.NewEncoder(&f.buf)
	return f, nil
}

// of returns the fingerprint of one item.
func (f *fingerprinter[I]) of(key string, item I) ([FingerprintSize]byte, error) {
	var fp [FingerprintSize]byte
	var v any = item
	if f.input != nil {
		v = f.input(item)
	}
	var data []byte
	switch x := v.(type) {
	case []byte:
		data = x
	case string:
		data = []byte(x)
	default:
		f.buf.Reset()
		if err := f.enc.Encode(v); err != nil {
			return fp, fmt.Errorf("steps: item %s/%s: encode it as JSON for its fingerprint: %w (declare what identifies it with steps.ItemInput)",
				f.step, key, err)
		}
		data = bytes.TrimSuffix(f.buf.Bytes(), []byte{'\n'}) // what json.Marshal gives
	}
	sum := sha256.Sum256(data)
	copy(fp[:], sum[:FingerprintSize])
	return fp, nil
}

// maxNamed bounds the item keys an error or an audit record lists.
const maxNamed = 10

// changeSet collects the changes found in one chunk (or at the end of the
// source), in the order found.
type changeSet struct {
	first   map[string]*ItemChangedError // by kind
	order   []string                     // kinds in the order first found
	updates []itemUpdate                 // accepted new fingerprints
	notes   []string                     // for the audit record
	total   int
}

type itemUpdate struct {
	key string
	fp  []byte
}

func (c *changeSet) reset() {
	clear(c.first)
	c.order, c.updates, c.notes, c.total = c.order[:0], c.updates[:0], c.notes[:0], 0
}

// add records one change; e is the error the first of its kind makes.
func (c *changeSet) add(e ItemChangedError, note string) {
	if c.first == nil {
		c.first = map[string]*ItemChangedError{}
	}
	c.total++
	if len(c.notes) < maxNamed {
		c.notes = append(c.notes, note)
	}
	if f := c.first[e.Change]; f != nil {
		f.Count++
		if len(f.More) < maxNamed {
			f.More = append(f.More, e.Key)
		}
		return
	}
	e.Count = 1
	c.first[e.Change] = &e
	c.order = append(c.order, e.Change)
}

// err is the error to stop with: the first kind of change found.
func (c *changeSet) err() error {
	if len(c.order) == 0 {
		return nil
	}
	return c.first[c.order[0]]
}

// details describes the changes for the audit log.
func (c *changeSet) details(step string) string {
	s := step + ": " + strings.Join(c.notes, "; ")
	if c.total > len(c.notes) {
		s += fmt.Sprintf("; and %d more", c.total-len(c.notes))
	}
	return s
}

func hexFP(fp []byte) string { return hex.EncodeToString(fp) }

// check fingerprints the chunk's items and holds them to what earlier
// attempts recorded: a finished item's fingerprint must match, and a new
// item must not be yielded past the source's declared total (nor, in an
// ascending source with a total, sort among finished items). It returns the first change
// found, or records the operator's acceptance of them all.
func (b *batch[I, O]) check(ctx context.Context, done map[string]doneItem) error {
	b.fps = b.fps[:0]
	for i, k := range b.keys {
		fp, err := b.fp.of(k, b.items[i])
		if err != nil {
			return err
		}
		b.fps = append(b.fps, fp)
		if d, ok := done[k]; ok {
			if d.status != "" && len(d.fp) > 0 && !bytes.Equal(d.fp, fp[:]) {
				old, now := hexFP(d.fp), hexFP(fp[:])
				b.changes.add(b.changeError(k, ItemContentChanged, func(e *ItemChangedError) { e.Old, e.New = old, now }),
					fmt.Sprintf("item %s changed (fingerprint %s, now %s): kept as processed", k, short(old), short(now)))
				b.changes.updates = append(b.changes.updates, itemUpdate{key: k, fp: append([]byte(nil), fp[:]...)})
			}
			continue
		}
		if b.declared < 0 {
			continue
		}
		switch {
		case b.ascending && k < b.maxKey:
			next := b.maxKey // a finished item after k: the chunk's next one, if any
			for _, k2 := range b.keys[i+1:] {
				if d, ok := done[k2]; ok && d.status != "" {
					next = k2
					break
				}
			}
			b.changes.add(b.changeError(k, ItemInserted, func(e *ItemChangedError) { e.Before = next }),
				fmt.Sprintf("item %s is new among processed items (before %s): processed", k, next))
		case b.yielded-int64(len(b.keys)-i) >= b.declared: // the item's position in the source is past the total
			b.changes.add(b.changeError(k, ItemBeyondTotal, nil),
				fmt.Sprintf("item %s is beyond the declared %d items: processed", k, b.declared))
		}
	}
	return b.settleChanges(ctx)
}

// gone records a finished item the source no longer yields.
func (b *batch[I, O]) gone(key string) {
	b.changes.add(b.changeError(key, ItemMissing, nil), fmt.Sprintf("item %s is no longer yielded: kept as processed", key))
	if b.r.accept != nil {
		b.goneOK++
	}
}

func (b *batch[I, O]) changeError(key, change string, set func(*ItemChangedError)) ItemChangedError {
	e := ItemChangedError{RunID: b.r.lease.RunID, Step: b.name, Key: key, Change: change, Declared: b.declared, Finished: b.before}
	if set != nil {
		set(&e)
	}
	return e
}

// settleChanges returns the first change collected, or, when an operator
// accepts changes, records them (new fingerprints and an audit record, in
// one transaction) and lets the batch go on.
func (b *batch[I, O]) settleChanges(ctx context.Context) error {
	if b.changes.total == 0 {
		return nil
	}
	defer b.changes.reset()
	a := b.r.accept
	if a == nil {
		return b.changes.err()
	}
	details := b.changes.details(b.name)
	b.r.log.Warn().Str(FieldStepID, b.name).Int("changes", b.changes.total).Str("operator", a.Operator).
		Str("details", details).Msg("items whose source changed: accepted by the operator")
	b.r.count(func(s *Stats) { s.Accepted += b.changes.total })
	if b.r.dryRun {
		return nil
	}
	items := make([]checkpoint.Item, len(b.changes.updates))
	for i, u := range b.changes.updates {
		items[i] = checkpoint.Item{Step: b.name, Key: u.key, Fingerprint: u.fp}
	}
	audit := checkpoint.Audit{RunID: b.r.lease.RunID, At: b.r.now(), Operator: a.Operator, Command: "accept-changed " + b.name,
		Reason: a.Reason, Details: details}
	err := b.r.store.InTx(context.WithoutCancel(ctx), b.r.lease, func(tx checkpoint.Tx) error { return tx.AcceptItemChanges(audit, items) })
	if err != nil {
		return fmt.Errorf("steps: record accepted changes of %s: %w", b.name, err)
	}
	return nil
}

// checkGone runs once the source is read to its end: every item recorded
// before this attempt must have been yielded again. Counting is enough on
// the normal path; only when some are missing are they looked for by name.
func (b *batch[I, O]) checkGone(ctx context.Context, src Source[I]) error {
	missing := b.before - b.seenOld - b.goneOK
	if missing <= 0 {
		return nil
	}
	named := 0
	err := b.missingKeys(ctx, src, func(key string) {
		named++
		b.gone(key)
	})
	if err != nil {
		return err
	}
	if named == 0 {
		// They could not be named (the source did not yield the same items
		// when read again): report the count.
		b.changes.add(b.changeError("", ItemMissing, nil),
			fmt.Sprintf("%d items are no longer yielded: kept as processed", missing))
		if b.r.accept != nil {
			b.goneOK += missing
		}
		if e := b.changes.first[ItemMissing]; e != nil {
			e.Count = int(missing)
		}
	}
	return b.settleChanges(ctx)
}

// missingKeys calls fn for each item recorded before this attempt that the
// source did not yield. An ascending source was checked up to its last key
// chunk by chunk, so they are the recorded keys after it; any other source
// is read again for its keys.
func (b *batch[I, O]) missingKeys(ctx context.Context, src Source[I], fn func(string)) error {
	q := checkpoint.ItemQuery{RunID: b.r.lease.RunID, Step: b.name, KeysOnly: true}
	var yielded map[string]bool
	if b.ascending && b.ordered {
		q.From, q.To = b.tileFrom, b.maxKey
	} else {
		yielded = map[string]bool{}
		var n int64
		err := src.all(ctx, func(key string, _ I) bool {
			yielded[key] = true
			n++
			return true
		})
		if err != nil || n != b.yielded {
			return err // not the same items: nothing to name
		}
	}
	return b.r.store.Items(ctx, q, func(it checkpoint.Item) error {
		switch {
		case yielded != nil && !yielded[it.Key]:
			fn(it.Key)
		case yielded == nil && it.Key != b.tileFrom:
			fn(it.Key)
		}
		return nil
	})
}
