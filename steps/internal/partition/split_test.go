package partition

import (
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
)

func TestByRangeSplitsIntoEqualCounts(t *testing.T) {
	keys := []string{"f", "b", "d", "a", "c", "e", "b"} // unsorted, "b" twice
	got := ByRange(keys, 3)
	want := []checkpoint.Partition{
		{Index: 0, Count: 3, Rule: checkpoint.PartitionRange, From: "", To: "c", Total: 2},
		{Index: 1, Count: 3, Rule: checkpoint.PartitionRange, From: "c", To: "e", Total: 2},
		{Index: 2, Count: 3, Rule: checkpoint.PartitionRange, From: "e", Total: 2},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("partition %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestByRangeOfFewKeysMakesFewerPartitions(t *testing.T) {
	// One distinct key in 4: its own range and the empty one below it.
	if got := ByRange([]string{"a", "a"}, 4); len(got) != 2 || got[0].Total != 0 || got[1].Total != 1 || got[1].From != "a" {
		t.Errorf("one distinct key in 4: %+v, want [\"\", a) empty and [a, ...) of 1 item", got)
	}
	// An empty source still gets its one (empty) partition.
	if got := ByRange(nil, 4); len(got) != 1 || got[0].Total != 0 {
		t.Errorf("no keys in 4: %+v, want one empty partition", got)
	}
}

func TestByHashAndSpecAgree(t *testing.T) {
	items := []string{"acct:1", "acct:2", "acct:3", "acct:1", "acct:9"}
	counts := make([]int64, 3)
	for _, it := range items {
		counts[checkpoint.PartitionHashOf(it)%3]++
	}
	parts := ByHash(counts)
	held := 0
	for _, p := range parts {
		s := Spec[string]{P: p, By: func(s string) string { return s }}
		n := int64(0)
		for _, it := range items {
			if s.Holds("k-"+it, it) {
				n++
			}
		}
		if n != p.Total {
			t.Errorf("partition %d holds %d items, its total says %d", p.Index, n, p.Total)
		}
		held += int(n)
	}
	if held != len(items) {
		t.Errorf("the partitions hold %d of %d items", held, len(items))
	}
}
