package steps

import (
	"errors"
	"math"
	"reflect"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
)

func TestPlan(t *testing.T) {
	cur := map[string]checkpoint.State{
		"a": {Value: 1000, Version: 7, Exists: true},
		"b": {Value: 0, Version: 3, Exists: true},
		"n": {}, // missing, creatable
	}
	type want struct {
		writes   []checkpoint.Write
		rejected map[int]string // group -> key
	}
	tests := []struct {
		name   string
		groups [][]Op
		want   want
	}{
		{
			name:   "transfer",
			groups: [][]Op{{{Key: "a", Kind: OpAdd, Amount: -300, Guards: []Guard{NotBelow(0)}}, {Key: "b", Kind: OpAdd, Amount: 300}}},
			want: want{writes: []checkpoint.Write{
				{Key: "a", OldVersion: 7, OldValue: 1000, NewValue: 700},
				{Key: "b", OldVersion: 3, OldValue: 0, NewValue: 300},
			}},
		},
		{
			name:   "ops on one key fold in order",
			groups: [][]Op{{{Key: "a", Kind: OpAdd, Amount: 5}, {Key: "a", Kind: OpSet, Amount: 10}, {Key: "a", Kind: OpAdd, Amount: -3}}},
			want:   want{writes: []checkpoint.Write{{Key: "a", OldVersion: 7, OldValue: 1000, NewValue: 7}}},
		},
		{
			name:   "overdraft rejected, nothing written",
			groups: [][]Op{{{Key: "b", Kind: OpAdd, Amount: 300}, {Key: "a", Kind: OpAdd, Amount: -1001, Guards: []Guard{NotBelow(0)}}}},
			want:   want{rejected: map[int]string{0: "a"}},
		},
		{
			name: "guard evaluated in group order: second debit rejected, third passes",
			groups: [][]Op{
				{{Key: "a", Kind: OpAdd, Amount: -600, Guards: []Guard{NotBelow(0)}}, {Key: "b", Kind: OpAdd, Amount: 600}},
				{{Key: "a", Kind: OpAdd, Amount: -600, Guards: []Guard{NotBelow(0)}}, {Key: "b", Kind: OpAdd, Amount: 600}},
				{{Key: "a", Kind: OpAdd, Amount: -400, Guards: []Guard{NotBelow(0)}}, {Key: "b", Kind: OpAdd, Amount: 400}},
			},
			want: want{
				writes: []checkpoint.Write{
					{Key: "a", OldVersion: 7, OldValue: 1000, NewValue: 0},
					{Key: "b", OldVersion: 3, OldValue: 0, NewValue: 1000},
				},
				rejected: map[int]string{1: "a"},
			},
		},
		{
			name:   "not above",
			groups: [][]Op{{{Key: "b", Kind: OpAdd, Amount: 11, Guards: []Guard{NotAbove(10)}}}},
			want:   want{rejected: map[int]string{0: "b"}},
		},
		{
			name:   "missing key inserted",
			groups: [][]Op{{{Key: "n", Kind: OpAdd, Amount: 4}}},
			want:   want{writes: []checkpoint.Write{{Key: "n", NewValue: 4, Insert: true}}},
		},
		{
			name:   "net zero writes nothing",
			groups: [][]Op{{{Key: "a", Kind: OpAdd, Amount: -500}, {Key: "a", Kind: OpAdd, Amount: 500}}},
			want:   want{},
		},
		{
			name:   "overflow rejected",
			groups: [][]Op{{{Key: "a", Kind: OpAdd, Amount: math.MaxInt64}}},
			want:   want{rejected: map[int]string{0: "a"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Plan(cur, tt.groups...)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(res.Writes, tt.want.writes) {
				t.Errorf("writes = %+v, want %+v", res.Writes, tt.want.writes)
			}
			if len(res.Rejected) != len(tt.want.rejected) {
				t.Fatalf("rejected = %v, want %v", res.Rejected, tt.want.rejected)
			}
			for g, key := range tt.want.rejected {
				if res.Rejected[g] == nil || res.Rejected[g].Key != key {
					t.Errorf("group %d rejection = %v, want on key %s", g, res.Rejected[g], key)
				}
			}
		})
	}
}

func TestPlanMissingState(t *testing.T) {
	_, err := Plan(map[string]checkpoint.State{}, []Op{{Key: "x", Kind: OpAdd, Amount: 1}})
	if err == nil {
		t.Fatal("plan with no state for a key succeeded")
	}
	var g *GuardError
	if errors.As(err, &g) {
		t.Fatalf("missing state reported as a guard failure: %v", err)
	}
}

// FuzzPlan checks conservation (the planned deltas sum to the requested
// deltas of the accepted groups), that versions are the current ones (they
// only grow when written) and that a rejected group changes nothing.
func FuzzPlan(f *testing.F) {
	f.Add(int64(1000), int64(0), int64(-300), int64(500), int64(-2000), uint8(3))
	f.Add(int64(0), int64(0), int64(0), int64(0), int64(0), uint8(0))
	f.Add(int64(math.MaxInt64), int64(5), int64(1), int64(-1), int64(7), uint8(9))
	f.Fuzz(func(t *testing.T, a0, b0, d1, d2, d3 int64, mask uint8) {
		cur := map[string]checkpoint.State{
			"a": {Value: a0, Version: 1, Exists: true},
			"b": {Value: b0, Version: 9, Exists: true},
		}
		var groups [][]Op
		for i, d := range []int64{d1, d2, d3} {
			from, to := "a", "b"
			if mask&(1<<i) != 0 {
				from, to = "b", "a"
			}
			if d == math.MinInt64 {
				d++
			}
			groups = append(groups, []Op{
				{Key: from, Kind: OpAdd, Amount: -d, Guards: []Guard{NotBelow(0)}},
				{Key: to, Kind: OpAdd, Amount: d},
			})
		}
		res, err := Plan(cur, groups...)
		if err != nil {
			t.Fatal(err)
		}
		// Reference model: apply groups one by one; a group whose debit
		// would go below 0 (or overflow) must be rejected, else accepted.
		vals := map[string]int64{"a": a0, "b": b0}
		for gi, g := range groups {
			from, to, d := g[0].Key, g[1].Key, g[1].Amount
			nf, okf := addNoOverflow(vals[from], -d)
			okBelow := okf && nf >= 0
			vals2 := map[string]int64{"a": vals["a"], "b": vals["b"]}
			vals2[from] = nf
			nt, okt := addNoOverflow(vals2[to], d)
			accept := okBelow && okt
			if accept == (res.Rejected[gi] != nil) {
				t.Fatalf("group %d (move %d from %s to %s at %v): accepted=%v but planner rejected=%v", gi, d, from, to, vals, accept, res.Rejected[gi])
			}
			if accept {
				vals2[to] = nt
				vals = vals2
			}
		}
		var sumPlanned, sumRequested int64
		for _, w := range res.Writes {
			if w.OldVersion != cur[w.Key].Version || w.OldValue != cur[w.Key].Value {
				t.Fatalf("write %+v does not start from current %+v", w, cur[w.Key])
			}
			if w.NewValue != vals[w.Key] {
				t.Fatalf("write %+v, reference gives %d", w, vals[w.Key])
			}
			sumPlanned += w.NewValue - w.OldValue
		}
		for k, c := range cur {
			sumRequested += vals[k] - c.Value
		}
		if sumPlanned != sumRequested {
			t.Fatalf("planned deltas %d, requested %d", sumPlanned, sumRequested)
		}
	})
}

func addNoOverflow(a, b int64) (int64, bool) {
	c := a + b
	if (b > 0 && c < a) || (b < 0 && c > a) {
		return 0, false
	}
	return c, true
}
