package steps

import (
	"context"
	"fmt"
	"iter"
)

// Source streams the items of a batch step, each with its business key, in
// a deterministic order. Items are pulled a chunk at a time, so a source of
// millions of items is never held in memory.
//
// A source's total, when it declares one, is a promise ForEach holds it
// to: a source that yields more items than it declared is refused with an
// *ItemChangedError (the declared count is stale, or the data grew since it
// was taken), before the extra item is processed. Yielding fewer is not an
// error: an item never processed has nothing to lose.
type Source[I any] struct {
	all   func(ctx context.Context, yield func(key string, item I) bool) error
	total int64
	// ascending: keys are guaranteed to ascend (Paged checks it), so a
	// finished key the source skipped over is known to be gone.
	ascending bool
	// What ForEach does with each item beside processing it, set by
	// ItemInput and PartitionBy: typed by the item, so a function of
	// another item type is a compile error.
	input func(I) any    // what of an item its fingerprint covers; nil: all of it
	by    func(I) string // the partitioning value; nil: key ranges
	// readAhead: a ForEach reads the next chunk while one commits
	// (ReadAhead, readahead.go).
	readAhead bool
}

// Total is the number of items, or -1 when the source does not know.
func (s Source[I]) Total() int64 { return s.total }

// ItemInput returns the source with what of each item a ForEach
// fingerprints declared, as Input does for a step: fn's result is hashed
// (its bytes for a []byte or string, else its JSON encoding) and recorded
// with the item's checkpoint, and a rerun that finds a finished item whose
// fingerprint differs fails with an *ItemChangedError instead of settling
// it silently wrong. By default the whole item's JSON encoding is
// fingerprinted; declare less (an ID and a version column, say) to ignore
// fields that may change harmlessly or to save encoding a large item.
func (s Source[I]) ItemInput(fn func(item I) any) Source[I] {
	s.input = fn
	return s
}

// PartitionBy returns the source with a partitioned ForEach's items
// assigned to partitions by a hash of key(item)
// (checkpoint.PartitionHashOf) in place of key ranges: items with the same
// value share a partition, e.g. transfers by debit account. Without
// Partitions(n > 1) it changes nothing.
func (s Source[I]) PartitionBy(key func(item I) string) Source[I] {
	s.by = key
	return s
}

// Slice is a source over items in memory, for small batches. Its total is
// len(items).
func Slice[I any](items []I, key func(I) string) Source[I] {
	return Source[I]{total: int64(len(items)), all: func(ctx context.Context, yield func(string, I) bool) error {
		for _, it := range items {
			if !yield(key(it), it) {
				return nil
			}
		}
		return nil
	}}
}

// Seq is a source over an iterator of (key, item) pairs. total is the item
// count if known, else -1 (a declared total is held as a promise: see
// Source).
func Seq[I any](seq iter.Seq2[string, I], total int64) Source[I] {
	return Source[I]{total: total, all: func(ctx context.Context, yield func(string, I) bool) error {
		for k, it := range seq {
			if !yield(k, it) {
				return nil
			}
		}
		return nil
	}}
}

// Paged is a source that reads items page by page in ascending key order,
// for large batches kept in a database: fetch returns up to limit items
// whose keys sort after the key given ("" for the first page), in key
// order, e.g. with `WHERE id > ? ORDER BY id LIMIT ?`. total is the item
// count if known, else -1.
//
// Because its keys ascend, a rerun learns more from a Paged source than
// from others: a finished item it no longer yields is named at the chunk
// where it is missed, a new item among finished ones (inserted since an
// earlier attempt, with a declared total) is refused before it is
// processed.
func Paged[I any](pageSize int, key func(I) string, fetch func(ctx context.Context, after string, limit int) ([]I, error), total int64) Source[I] {
	if pageSize <= 0 {
		pageSize = 1000
	}
	return Source[I]{total: total, ascending: true, all: func(ctx context.Context, yield func(string, I) bool) error {
		after := ""
		for {
			page, err := fetch(ctx, after, pageSize)
			if err != nil {
				return fmt.Errorf("steps: fetch items after %q: %w", after, err)
			}
			for _, it := range page {
				k := key(it)
				if k <= after {
					return fmt.Errorf("steps: paged source returned key %q after %q; fetch must return keys in ascending order", k, after)
				}
				if !yield(k, it) {
					return nil
				}
				after = k
			}
			if len(page) < pageSize {
				return nil
			}
		}
	}}
}
