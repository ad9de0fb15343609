package steps

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// FingerprintSize is the length in bytes of an item fingerprint: the first
// 16 bytes of a SHA-256. An item's checkpoint records it followed by the
// fingerprinted content, when that is JSON of at most MaxRecordedInput
// bytes.
const FingerprintSize = 16

// Acceptance is an operator's decision to let batch steps go on past the
// changed items the most recent refusal named (Config.AcceptChanged): a
// finished item whose content changed keeps its outcome and effects and
// gets its new fingerprint; a finished item no longer yielded stays as it
// is; extra items beyond the declared total are processed. It covers
// exactly what the operator was shown: each change a refusal names is
// recorded with it (key, kind, fingerprint), and a change the refusal did
// not name, or one whose item changed again since, is refused in its turn
// (recorded for the next decision). Each acceptance is recorded in the
// run's audit log with Operator, Reason and every item accepted, and stays
// decided: a later rerun does not refuse an accepted change again.
// Operator and Reason must be set.
type Acceptance struct {
	Operator string
	Reason   string
}

// fingerprinter hashes items of a ForEach into fixed-size fingerprints,
// reusing its encoding buffer. It keeps each item's fingerprinted content
// of the chunk (up to MaxRecordedInput bytes of JSON) to record with it.
type fingerprinter[I any] struct {
	step  string
	input func(I) any
	buf   bytes.Buffer
	enc   *json.Encoder
	// arena holds the chunk's recorded contents, spans each item's part
	// of it (empty when not recorded), in the order of of's calls.
	arena []byte
	spans [][2]int
}

// reset forgets the contents kept for the previous chunk.
func (f *fingerprinter[I]) reset() { f.arena, f.spans = f.arena[:0], f.spans[:0] }

// content is the recorded content of the chunk's i-th item, nil if none.
func (f *fingerprinter[I]) content(i int) []byte {
	if i >= len(f.spans) {
		return nil
	}
	sp := f.spans[i]
	return f.arena[sp[0]:sp[1]]
}

// recorded is what an item's checkpoint keeps as its fingerprint: the
// fingerprint, then its content when it is kept.
func (f *fingerprinter[I]) recorded(i int, fp [FingerprintSize]byte) []byte {
	c := f.content(i)
	if len(c) == 0 {
		return fp[:]
	}
	return append(append(make([]byte, 0, FingerprintSize+len(c)), fp[:]...), c...)
}

// fpOf splits a recorded fingerprint into the fingerprint and the content.
func fpOf(rec []byte) (fp, content []byte) {
	if len(rec) <= FingerprintSize {
		return rec, nil
	}
	return rec[:FingerprintSize], rec[FingerprintSize:]
}

func newFingerprinter[I any](step string, input func(I) any) *fingerprinter[I] {
	f := &fingerprinter[I]{step: step, input: input}
	f.enc = json.NewEncoder(&f.buf)
	return f
}

// of returns the fingerprint of one item.
func (f *fingerprinter[I]) of(key string, item I) ([FingerprintSize]byte, error) {
	var fp [FingerprintSize]byte
	var v any = item
	if f.input != nil {
		v = f.input(item)
	}
	var data []byte
	start := len(f.arena)
	switch x := v.(type) {
	case []byte:
		data = x
	case string:
		data = []byte(x)
	default:
		f.buf.Reset()
		if err := f.enc.Encode(v); err != nil {
			return fp, fmt.Errorf("steps: item %s/%s: encode it as JSON for its fingerprint: %w (declare what identifies it with the source's ItemInput)",
				f.step, key, err)
		}
		data = bytes.TrimSuffix(f.buf.Bytes(), []byte{'\n'}) // what json.Marshal gives
		if len(data) <= MaxRecordedInput {
			f.arena = append(f.arena, data...)
		}
	}
	f.spans = append(f.spans, [2]int{start, len(f.arena)})
	sum := sha256.Sum256(data)
	copy(fp[:], sum[:FingerprintSize])
	return fp, nil
}

// maxNamed bounds the items one refusal names (and so records for an
// acceptance); further changes found with them are counted, and refused in
// their turn.
const maxNamed = 100

// foundChange is one change found by a rerun.
type foundChange struct {
	e     ItemChangedError // its error, as the first of its kind would make it
	fp    []byte           // the item's fingerprint now (nil when it is gone)
	rec   []byte           // what an acceptance records for the item: fp and its content
	items int64            // 1, or the count of unnamed items no longer yielded
	note  string           // for the audit record
}

// record is the change as the checkpoint keeps it.
func (c foundChange) record(step string) checkpoint.ItemChange {
	return checkpoint.ItemChange{Step: step, Key: c.e.Key, Change: c.e.Change, Fingerprint: c.fp, Items: c.items}
}

// changeSet collects the changes found in one chunk (or at the end of the
// source), sorted as they are found by what was decided about them: an
// earlier acceptance, an acceptance now (the change was named by the most
// recent refusal and the operator accepts), or a refusal.
type changeSet struct {
	prior  []foundChange // accepted by an earlier attempt's operator
	accept []foundChange // named by the last refusal, accepted now
	refuse []foundChange // to refuse, the first maxNamed
	extra  int           // to refuse, found beyond maxNamed
}

func (c *changeSet) reset() {
	c.prior, c.accept, c.refuse, c.extra = c.prior[:0], c.accept[:0], c.refuse[:0], 0
}

func (c *changeSet) empty() bool {
	return len(c.prior)+len(c.accept)+len(c.refuse) == 0 && c.extra == 0
}

// sourceCheck holds a batch step's source to what its earlier attempts
// saw: a finished item's fingerprint must match, a finished item must be
// yielded again, and no more items than the declared total are processed,
// unless an operator accepted the change (Config.AcceptChanged).
type sourceCheck[I any] struct {
	r    *Run
	name string

	fp        *fingerprinter[I]
	ascending bool   // the source guarantees ascending keys
	declared  int64  // the source's declared total, -1 if none
	maxKey    string // greatest key recorded before this attempt
	before    int64  // items recorded before this attempt
	seenOld   int64  // of those, how many the source yielded again
	goneOK    int64  // of those not yielded, how many an operator accepted
	yielded   int64  // items the source yielded
	tileFrom  string // an ascending source's read-backs tile the key space from here
	changes   changeSet
	decided   map[string]checkpoint.ItemChange // refused and accepted changes, by item key (loadDecisions)
	extraOK   int64                            // items accepted beyond the declared total (inserted or extra)
}

// add sorts one change by the decisions recorded for the step's items.
func (sc *sourceCheck[I]) add(e ItemChangedError, fp []byte, items int64, note string) {
	sc.addRec(e, fp, nil, items, note)
}

// addRec is add for a changed item whose acceptance records rec (its
// fingerprint and content) instead of fp.
func (sc *sourceCheck[I]) addRec(e ItemChangedError, fp, rec []byte, items int64, note string) {
	c := &sc.changes
	ch := foundChange{e: e, fp: fp, rec: rec, items: items, note: note}
	d, ok := sc.decided[e.Key]
	// The decision must be about this very change: same kind and, for an
	// item the source still yields, the content the refusal saw.
	dfp, _ := fpOf(d.Fingerprint)
	match := ok && d.Change == e.Change && bytes.Equal(dfp, fp) && (e.Key != "" || d.Items == items)
	switch {
	case match && d.Status == checkpoint.ItemChangeAccepted:
		c.prior = append(c.prior, ch)
	case match && d.Status == checkpoint.ItemChangeRefused && sc.r.accept != nil:
		c.accept = append(c.accept, ch)
		if e.Change == ItemInserted || e.Change == ItemBeyondTotal {
			sc.extraOK++ // one more item than declared is accepted: the items after it move up one
		}
	case len(c.refuse) < maxNamed:
		c.refuse = append(c.refuse, ch)
	default:
		c.extra++
	}
}

// loadDecisions reads, once per ForEach, what earlier refusals named and
// operators accepted for this step, before the first change is sorted.
func (sc *sourceCheck[I]) loadDecisions(ctx context.Context) error {
	if sc.decided != nil {
		return nil
	}
	sc.decided = map[string]checkpoint.ItemChange{}
	cs, err := sc.r.store.ItemChanges(ctx, sc.r.lease.RunID, sc.name)
	if err != nil {
		return fmt.Errorf("steps: read decisions on changed items of %s: %w", sc.name, err)
	}
	for _, c := range cs {
		sc.decided[c.Key] = c
		if c.Status == checkpoint.ItemChangeAccepted && (c.Change == ItemInserted || c.Change == ItemBeyondTotal) {
			sc.extraOK++
		}
	}
	return nil
}

// refusal is the error naming the changes to refuse, the first kind first.
func (sc *sourceCheck[I]) refusal() *ItemChangedError {
	var first *ItemChangedError
	byKind := map[string]*ItemChangedError{}
	for _, ch := range sc.changes.refuse {
		if f := byKind[ch.e.Change]; f != nil {
			f.Count += int(ch.items)
			f.More = append(f.More, ch.e.Key)
			continue
		}
		e := ch.e
		e.Count = int(ch.items)
		byKind[e.Change] = &e
		if first == nil {
			first = &e
		} else {
			first.Also = append(first.Also, &e)
		}
	}
	if first == nil { // only unnamed ones: cannot happen (the first maxNamed are named), but say so
		first = &ItemChangedError{RunID: sc.r.lease.RunID, Step: sc.name, Change: ItemMissing}
	}
	first.Unnamed = sc.changes.extra
	return first
}

func hexFP(fp []byte) string { return hex.EncodeToString(fp) }

// check fingerprints the chunk's items and holds them to what earlier
// attempts recorded: a finished item's fingerprint must match, and a new
// item must not be yielded past the source's declared total (nor, in an
// ascending source with a total, sort among finished items). It returns the first change
// found, or records the operator's acceptance of them all.
func (b *batch[I, O]) check(ctx context.Context, done map[string]doneItem) error {
	b.fps = b.fps[:0]
	b.fp.reset()
	for i, k := range b.keys {
		fp, err := b.fp.of(k, b.items[i])
		if err != nil {
			return err
		}
		b.fps = append(b.fps, fp)
		if d, ok := done[k]; ok {
			if dfp, was := fpOf(d.fp); d.status != "" && len(dfp) > 0 && !bytes.Equal(dfp, fp[:]) {
				if err := b.loadDecisions(ctx); err != nil {
					return err
				}
				old, now := hexFP(dfp), hexFP(fp[:])
				fields := diffFields(was, b.fp.content(i))
				what := fmt.Sprintf("fingerprint %s, now %s", short(old), short(now))
				if len(fields) > 0 {
					what = fieldsText(fields)
				}
				b.addRec(b.changeError(k, ItemContentChanged, func(e *ItemChangedError) { e.Old, e.New, e.Fields = old, now, fields }),
					append([]byte(nil), fp[:]...), b.fp.recorded(i, fp), 1,
					fmt.Sprintf("item %s changed (%s): kept as processed", k, what))
			}
			continue
		}
		if b.declared < 0 {
			continue
		}
		inserted := b.ascending && k < b.maxKey
		pos := b.yielded - int64(len(b.keys)-i) // items the source yielded before this one
		if inserted || pos >= b.declared {
			if err := b.loadDecisions(ctx); err != nil {
				return err
			}
		}
		switch {
		case inserted:
			next := b.maxKey // a finished item after k: the chunk's next one, if any
			for _, k2 := range b.keys[i+1:] {
				if d, ok := done[k2]; ok && d.status != "" {
					next = k2
					break
				}
			}
			b.add(b.changeError(k, ItemInserted, func(e *ItemChangedError) { e.Before = next }), append([]byte(nil), fp[:]...), 1,
				fmt.Sprintf("item %s is new among processed items (before %s): processed", k, next))
		case pos >= b.declared+b.extraOK: // the item's position is past the total and the extra items accepted
			b.add(b.changeError(k, ItemBeyondTotal, nil), append([]byte(nil), fp[:]...), 1,
				fmt.Sprintf("item %s is beyond the declared %d items: processed", k, b.declared))
		}
	}
	return b.settleChanges(ctx)
}

// gone records a finished item the source no longer yields.
func (sc *sourceCheck[I]) gone(key string) {
	sc.add(sc.changeError(key, ItemMissing, nil), nil, 1, fmt.Sprintf("item %s is no longer yielded: kept as processed", key))
}

func (sc *sourceCheck[I]) changeError(key, change string, set func(*ItemChangedError)) ItemChangedError {
	e := ItemChangedError{RunID: sc.r.lease.RunID, Step: sc.name, Key: key, Change: change, Declared: sc.declared, Finished: sc.before}
	if set != nil {
		set(&e)
	}
	return e
}

// settleChanges settles the changes collected: those an operator
// accepted before pass; those the most recent refusal named are accepted
// now if the operator accepts (new fingerprints, decisions and an audit
// record naming each, in one transaction); any other is refused: recorded
// as the refusal an operator may accept next, and returned as an
// *ItemChangedError naming each. Changes accepted now stay accepted even
// when others of the chunk are refused.
func (sc *sourceCheck[I]) settleChanges(ctx context.Context) error {
	c := &sc.changes
	if c.empty() {
		return nil
	}
	defer c.reset()
	for _, ch := range append(c.prior, c.accept...) {
		if ch.e.Change == ItemMissing {
			sc.goneOK += ch.items
		}
	}
	if err := sc.acceptNow(ctx); err != nil {
		return err
	}
	if len(c.refuse) == 0 && c.extra == 0 {
		return nil
	}
	refused := sc.refusal()
	if !sc.r.dryRun {
		rec := make([]checkpoint.ItemChange, len(c.refuse))
		for i, ch := range c.refuse {
			rec[i] = ch.record(sc.name)
		}
		err := sc.r.inTx(context.WithoutCancel(ctx), func(tx checkpoint.Tx) error {
			return tx.RefuseItemChanges(sc.name, sc.r.now(), rec)
		})
		if err != nil {
			return errors.Join(refused, fmt.Errorf("steps: record the refused changes of %s: %w", sc.name, err))
		}
	}
	return refused
}

// acceptNow records the operator's acceptance of the changes the most
// recent refusal named.
func (sc *sourceCheck[I]) acceptNow(ctx context.Context) error {
	c := &sc.changes
	a := sc.r.accept
	if len(c.accept) == 0 || a == nil {
		return nil
	}
	notes := make([]string, len(c.accept))
	var items []checkpoint.Item
	decisions := make([]checkpoint.ItemChange, len(c.accept))
	for i, ch := range c.accept {
		notes[i] = ch.note
		decisions[i] = ch.record(sc.name)
		if ch.e.Change == ItemContentChanged {
			rec := ch.rec
			if rec == nil {
				rec = ch.fp
			}
			items = append(items, checkpoint.Item{Step: sc.name, Key: ch.e.Key, Fingerprint: rec})
		}
	}
	details := sc.name + ": " + strings.Join(notes, "; ")
	sc.r.log.Warn().Str(FieldStepID, sc.name).Int("changes", len(c.accept)).Str("operator", a.Operator).
		Str("details", details).Msg("items whose source changed: accepted by the operator")
	sc.r.count(func(s *Stats) { s.Accepted += len(c.accept) })
	if sc.r.dryRun {
		return nil
	}
	audit := checkpoint.Audit{RunID: sc.r.lease.RunID, At: sc.r.now(), Operator: a.Operator, Command: "accept-changed " + sc.name,
		Reason: a.Reason, Details: details}
	err := sc.r.inTx(context.WithoutCancel(ctx), func(tx checkpoint.Tx) error {
		return tx.AcceptItemChanges(audit, items, decisions)
	})
	if err != nil {
		return fmt.Errorf("steps: record accepted changes of %s: %w", sc.name, err)
	}
	for _, d := range decisions { // decided: not accepted twice in this attempt
		d.Status = checkpoint.ItemChangeAccepted
		sc.decided[d.Key] = d
	}
	return nil
}

// checkGone runs once the source is read to its end: every item recorded
// before this attempt must have been yielded again. Counting is enough on
// the normal path; only when some are missing are they looked for by name.
func (sc *sourceCheck[I]) checkGone(ctx context.Context, src Source[I]) error {
	missing := sc.before - sc.seenOld - sc.goneOK
	if missing <= 0 {
		return nil
	}
	if err := sc.loadDecisions(ctx); err != nil {
		return err
	}
	named := 0
	err := sc.missingKeys(ctx, src, func(key string) {
		named++
		sc.gone(key)
	})
	if err != nil {
		return err
	}
	if named == 0 {
		// They could not be named (the source did not yield the same items
		// when read again): report the count.
		sc.add(sc.changeError("", ItemMissing, nil), nil, missing,
			fmt.Sprintf("%s no longer yielded: kept as processed", plural(int(missing), "item is", "items are")))
	}
	return sc.settleChanges(ctx)
}

// missingKeys calls fn for each item recorded before this attempt that the
// source did not yield. An ascending source was checked up to its last key
// chunk by chunk, so they are the recorded keys after it; any other source
// is read again for its keys.
func (sc *sourceCheck[I]) missingKeys(ctx context.Context, src Source[I], fn func(string)) error {
	q := checkpoint.ItemQuery{RunID: sc.r.lease.RunID, Step: sc.name, KeysOnly: true}
	var yielded map[string]bool
	if sc.ascending {
		q.From, q.To = sc.tileFrom, sc.maxKey
	} else {
		yielded = map[string]bool{}
		var n int64
		err := src.all(ctx, func(key string, _ I) bool {
			yielded[key] = true
			n++
			return true
		})
		if err != nil || n != sc.yielded {
			return err // not the same items: nothing to name
		}
	}
	return sc.r.store.Items(ctx, q, func(it checkpoint.Item) error {
		switch {
		case yielded != nil && !yielded[it.Key]:
			fn(it.Key)
		case yielded == nil && it.Key != sc.tileFrom:
			fn(it.Key)
		}
		return nil
	})
}
