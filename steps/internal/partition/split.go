package partition

import (
	"slices"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// Spec decides which items one partition holds: by its key range, or by
// the hash of by(item) (steps' Source.PartitionBy).
type Spec[I any] struct {
	P  checkpoint.Partition
	By func(I) string
}

// Holds reports whether the partition holds the item.
func (s Spec[I]) Holds(key string, item I) bool {
	if s.P.Rule == checkpoint.PartitionHash {
		return int(checkpoint.PartitionHashOf(s.By(item))%uint64(s.P.Count)) == s.P.Index
	}
	return s.P.Holds(key)
}

// ByHash is the split into len(counts) partitions by hash, counts[i]
// being the items whose value hashes to partition i.
func ByHash(counts []int64) []checkpoint.Partition {
	n := len(counts)
	out := make([]checkpoint.Partition, n)
	for i := range out {
		out[i] = checkpoint.Partition{Index: i, Count: n, Rule: checkpoint.PartitionHash, Total: counts[i]}
	}
	return out
}

// ByRange is the split of keys into at most n key ranges holding equal
// item counts (fewer when there are too few distinct keys). keys is
// sorted and compacted in place.
func ByRange(keys []string, n int) []checkpoint.Partition {
	slices.Sort(keys) // bytewise, as stores compare keys
	keys = slices.Compact(keys)
	bounds := []string{""}
	for i := 1; i < n && len(keys) > 0; i++ {
		if b := keys[i*len(keys)/n]; b > bounds[len(bounds)-1] {
			bounds = append(bounds, b)
		}
	}
	out := make([]checkpoint.Partition, len(bounds))
	for i, from := range bounds {
		p := checkpoint.Partition{Index: i, Count: len(bounds), Rule: checkpoint.PartitionRange, From: from}
		if i+1 < len(bounds) {
			p.To = bounds[i+1]
		}
		lo, _ := slices.BinarySearch(keys, p.From)
		hi := len(keys)
		if p.To != "" {
			hi, _ = slices.BinarySearch(keys, p.To)
		}
		p.Total = int64(hi - lo)
		out[i] = p
	}
	return out
}
