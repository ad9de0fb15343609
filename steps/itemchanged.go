package steps

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

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
	// Fields, for ItemContentChanged, are the fields that changed with
	// their old and new values, when the item's fingerprinted content was
	// recorded with it (a JSON encoding of at most MaxRecordedInput bytes).
	Fields []FieldChange
	// Declared is the source's declared total (-1 if none) and Finished
	// the items recorded before this attempt.
	Declared, Finished int64
	// Before names a finished item that sorts after Key, for ItemInserted.
	Before string
	// Count is how many items were found with this change (Key included);
	// More names the others.
	Count int
	More  []string
	// Also holds the changes of other kinds found with this one, each
	// with its own Key, Count and More. An acceptance (Config.AcceptChanged)
	// covers exactly the items this error names, here and in Also.
	Also []*ItemChangedError
	// Unnamed counts further changes found with these but not named (past
	// the limit of names one refusal lists): they are refused in their
	// turn, once the named ones are settled.
	Unnamed int
}

// FieldChange is one field of a changed item: its name (empty when the
// fingerprinted content is not a JSON object, and the whole changed) and
// its old and new values as JSON, "" for a field absent on that side.
type FieldChange struct {
	Field string `json:"field"`
	Old   string `json:"old"`
	New   string `json:"new"`
}

// MaxRecordedInput bounds the fingerprinted content (the item's JSON, or
// what ItemInput declares) recorded with each item, so that a refusal can
// name the fields that changed with their old and new values. Longer
// content is recorded by its fingerprint only.
const MaxRecordedInput = 256

func (e *ItemChangedError) Error() string {
	var b strings.Builder
	e.describe(&b)
	for _, o := range e.Also {
		b.WriteString("; also, ")
		o.describe(&b)
	}
	if e.Unnamed > 0 {
		fmt.Fprintf(&b, "; and %d more changes found with these, not named here: they are refused in their turn", e.Unnamed)
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
	if len(e.Also) > 0 || e.Count > 1 {
		b.WriteString(". An acceptance covers exactly the items named here; any other change is refused in its turn")
	}
	return b.String()
}

// describe writes what changed, naming every item of this kind.
func (e *ItemChangedError) describe(b *strings.Builder) {
	switch e.Change {
	case ItemContentChanged:
		if len(e.Fields) > 0 {
			fmt.Fprintf(b, "item %s of batch step %s (run %s) changed since it was processed: %s",
				e.Key, e.Step, e.RunID, fieldsText(e.Fields))
			break
		}
		fmt.Fprintf(b, "item %s of batch step %s (run %s) changed since it was processed (fingerprint %s, now %s)",
			e.Key, e.Step, e.RunID, short(e.Old), short(e.New))
	case ItemMissing:
		if e.Key == "" { // not named: the source did not yield the same items when read again
			fmt.Fprintf(b, "%s of batch step %s (run %s) processed, and the source no longer yields them "+
				"(the source did not yield the same items again, so they are not named)", plural(e.Count, "item was", "items were"), e.Step, e.RunID)
			break
		}
		fmt.Fprintf(b, "item %s of batch step %s (run %s) was processed, and the source no longer yields it", e.Key, e.Step, e.RunID)
	case ItemInserted:
		fmt.Fprintf(b, "item %s of batch step %s (run %s) is new, yet sorts before item %s, which an earlier attempt processed: "+
			"it appeared among processed items since (the source declares %d items, %d were processed before)",
			e.Key, e.Step, e.RunID, e.Before, e.Declared, e.Finished)
	default:
		fmt.Fprintf(b, "the source of batch step %s (run %s) yields more items than the %d it declares: %d were processed before, "+
			"and item %s is one more", e.Step, e.RunID, e.Declared, e.Finished, e.Key)
	}
	if e.Count > 1 && e.Key != "" {
		fmt.Fprintf(b, "; %d items in all (also %s)", e.Count, strings.Join(e.More, ", "))
	}
}

// diffFields compares an item's recorded and current contents (JSON): the
// fields of an object that differ, in name order, or the whole value when
// either is not an object. Nil when either is not recorded.
func diffFields(was, now []byte) []FieldChange {
	if len(was) == 0 || len(now) == 0 {
		return nil
	}
	var a, b map[string]json.RawMessage
	if json.Unmarshal(was, &a) != nil || json.Unmarshal(now, &b) != nil || a == nil || b == nil {
		if bytes.Equal(was, now) {
			return nil
		}
		return []FieldChange{{Old: shortJSON(was), New: shortJSON(now)}}
	}
	names := make([]string, 0, len(a)+len(b))
	for k := range a {
		names = append(names, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	var out []FieldChange
	for _, k := range names {
		if bytes.Equal(a[k], b[k]) {
			continue
		}
		out = append(out, FieldChange{Field: k, Old: shortJSON(a[k]), New: shortJSON(b[k])})
	}
	return out
}

// shortJSON is a JSON value for a message: at most 60 bytes of it.
func shortJSON(v []byte) string {
	if len(v) > 60 {
		return string(v[:57]) + "..."
	}
	return string(v)
}

// fieldsText says what changed: `amount was 500, now 700; to was "A-2", now "A-9"`.
func fieldsText(fs []FieldChange) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		old, now := f.Old, f.New
		if old == "" {
			old = "absent"
		}
		if now == "" {
			now = "absent"
		}
		if f.Field == "" {
			parts[i] = fmt.Sprintf("it was %s, now %s", old, now)
			continue
		}
		parts[i] = fmt.Sprintf("%s was %s, now %s", f.Field, old, now)
	}
	return strings.Join(parts, "; ")
}
