package plan

import (
	"errors"
	"math"
	"reflect"
	"strings"
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
			name: "a broken guard stops its group before an overflowing op",
			groups: [][]Op{{{Key: "b", Kind: OpAdd, Amount: -1, Guards: []Guard{NotBelow(0)}},
				{Key: "a", Kind: OpAdd, Amount: math.MaxInt64}}},
			want: want{rejected: map[int]string{0: "b"}},
		},
		{
			name:   "a sum up to the int64 limit is fine",
			groups: [][]Op{{{Key: "b", Kind: OpAdd, Amount: math.MaxInt64}}},
			want:   want{writes: []checkpoint.Write{{Key: "b", OldVersion: 3, OldValue: 0, NewValue: math.MaxInt64}}},
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

func TestPlanOverflow(t *testing.T) {
	cur := map[string]checkpoint.State{
		"a":   {Value: 1000, Version: 7, Exists: true},
		"b":   {Value: 0, Version: 3, Exists: true},
		"low": {Value: math.MinInt64 + 5, Version: 1, Exists: true},
	}
	transfer := func(from, to string, amount int64) []Op {
		return []Op{{Key: from, Kind: OpAdd, Amount: -amount, Guards: []Guard{NotBelow(0)}}, {Key: to, Kind: OpAdd, Amount: amount}}
	}
	tests := []struct {
		name   string
		groups [][]Op
		want   OverflowError
	}{
		{"add past the maximum", [][]Op{{{Key: "a", Kind: OpAdd, Amount: math.MaxInt64}}},
			OverflowError{Key: "a", Value: 1000, Delta: math.MaxInt64}},
		{"subtract past the minimum", [][]Op{{{Key: "low", Kind: OpAdd, Amount: -6}}},
			OverflowError{Key: "low", Value: math.MinInt64 + 5, Delta: -6}},
		{"after a set", [][]Op{{{Key: "b", Kind: OpSet, Amount: math.MaxInt64 - 1}, {Key: "b", Kind: OpAdd, Amount: 2}}},
			OverflowError{Key: "b", Value: math.MaxInt64 - 1, Delta: 2}},
		{"an intermediate value of a group overflows, even if the group would come back",
			[][]Op{{{Key: "a", Kind: OpAdd, Amount: math.MaxInt64 - 1000}, {Key: "a", Kind: OpAdd, Amount: 1}, {Key: "a", Kind: OpAdd, Amount: -5000}}},
			OverflowError{Key: "a", Value: math.MaxInt64, Delta: 1}},
		{"a later group, after a rejected one and an accepted one, fails the whole plan",
			[][]Op{transfer("b", "a", 1), transfer("a", "b", 500), {{Key: "b", Kind: OpAdd, Amount: math.MaxInt64}}},
			OverflowError{Key: "b", Value: 500, Delta: math.MaxInt64, Group: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Plan(cur, tt.groups...)
			var ov *OverflowError
			if !errors.As(err, &ov) {
				t.Fatalf("Plan = %+v, %v; want an *OverflowError", res, err)
			}
			if *ov != tt.want {
				t.Errorf("overflow = %+v, want %+v", *ov, tt.want)
			}
			var g *GuardError
			if errors.As(err, &g) {
				t.Errorf("an overflow is reported as a guard failure (it would be pinned): %v", err)
			}
			if res.Writes != nil || res.Rejected != nil {
				t.Errorf("a failed plan returned writes or rejections: %+v", res)
			}
			for _, w := range []string{tt.want.Key, "overflow"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

func TestAddInt64(t *testing.T) {
	for _, tt := range []struct {
		a, b, sum int64
		ok        bool
	}{
		{1, 2, 3, true},
		{math.MaxInt64, 0, math.MaxInt64, true},
		{math.MaxInt64, 1, 0, false},
		{math.MaxInt64 - 1, 1, math.MaxInt64, true},
		{math.MinInt64, -1, 0, false},
		{math.MinInt64, math.MaxInt64, -1, true},
		{-1, math.MinInt64 + 1, math.MinInt64, true},
		{math.MinInt64, math.MinInt64, 0, false},
	} {
		sum, ok := AddInt64(tt.a, tt.b)
		if sum != tt.sum || ok != tt.ok {
			t.Errorf("AddInt64(%d, %d) = %d, %v; want %d, %v", tt.a, tt.b, sum, ok, tt.sum, tt.ok)
		}
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

// FuzzPlan checks the planner against a reference model: a group whose
// debit would go below 0 is rejected and changes nothing, a debit or credit
// that would overflow int64 fails the whole plan with an *OverflowError
// naming the key and group; otherwise the planned deltas sum to the
// requested deltas of the accepted groups (conservation) and every write
// starts from the current version.
func FuzzPlan(f *testing.F) {
	f.Add(int64(1000), int64(0), int64(-300), int64(500), int64(-2000), uint8(3))
	f.Add(int64(0), int64(0), int64(0), int64(0), int64(0), uint8(0))
	f.Add(int64(math.MaxInt64), int64(5), int64(1), int64(-1), int64(7), uint8(9))   // credit overflows
	f.Add(int64(math.MaxInt64-2), int64(0), int64(-5), int64(1), int64(1), uint8(0)) // a negative debit overflows
	f.Add(int64(10), int64(math.MaxInt64), int64(20), int64(-3), int64(4), uint8(2)) // rejected, then overflow
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
		// Reference model: apply groups one by one, each op in order; a
		// debit that would go below 0 rejects its group (the credit is
		// never evaluated), an op that would overflow fails the plan.
		vals := map[string]int64{"a": a0, "b": b0}
		rejected := map[int]string{}
		var overflow *OverflowError
	model:
		for gi, g := range groups {
			from, to, d := g[0].Key, g[1].Key, g[1].Amount
			nf, ok := addNoOverflow(vals[from], -d)
			switch {
			case !ok:
				overflow = &OverflowError{Key: from, Value: vals[from], Delta: -d, Group: gi}
				break model
			case nf < 0:
				rejected[gi] = from
				continue
			}
			nt, ok := addNoOverflow(vals[to], d)
			if !ok {
				overflow = &OverflowError{Key: to, Value: vals[to], Delta: d, Group: gi}
				break model
			}
			vals[from], vals[to] = nf, nt
		}
		if overflow != nil {
			var got *OverflowError
			if !errors.As(err, &got) || *got != *overflow {
				t.Fatalf("plan = %+v, %v; the reference overflows: %+v", res, err, *overflow)
			}
			return
		}
		if err != nil {
			t.Fatalf("plan failed where the reference does not: %v", err)
		}
		if len(res.Rejected) != len(rejected) {
			t.Fatalf("planner rejected %v, the reference %v", res.Rejected, rejected)
		}
		for gi, key := range rejected {
			if res.Rejected[gi] == nil || res.Rejected[gi].Key != key {
				t.Fatalf("group %d: planner rejection %v, the reference rejects it on %s", gi, res.Rejected[gi], key)
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

// addNoOverflow is the reference model's own overflow check, written
// differently from AddInt64 (by the sign of the wrapped result).
func addNoOverflow(a, b int64) (int64, bool) {
	c := a + b
	if (b > 0 && c < a) || (b < 0 && c > a) {
		return 0, false
	}
	return c, true
}

// refPlan is Plan written the plain way (a map of pending values per
// group), the model FuzzPlanGroups holds Plan to.
func refPlan(current map[string]checkpoint.State, groups ...[]Op) (Result, error) {
	vals := map[string]int64{}
	touched := map[string]bool{}
	var order []string
	res := Result{}
	for gi, ops := range groups {
		pending := map[string]int64{}
		var rejected *GuardError
		for _, op := range ops {
			cur, ok := pending[op.Key]
			if !ok {
				if cur, ok = vals[op.Key]; !ok {
					c, ok := current[op.Key]
					if !ok {
						return Result{}, errors.New("missing")
					}
					cur, vals[op.Key] = c.Value, c.Value
				}
			}
			next := op.Amount
			if op.Kind == OpAdd {
				if next, ok = addNoOverflow(cur, op.Amount); !ok {
					return Result{}, &OverflowError{Key: op.Key, Value: cur, Delta: op.Amount, Group: gi}
				}
			}
			for _, g := range op.Guards {
				if !g.holds(next) {
					rejected = &GuardError{Key: op.Key, Guard: g, Value: next}
					break
				}
			}
			if rejected != nil {
				break
			}
			pending[op.Key] = next
		}
		if rejected != nil {
			if res.Rejected == nil {
				res.Rejected = map[int]*GuardError{}
			}
			res.Rejected[gi] = rejected
			continue
		}
		for _, op := range ops {
			if !touched[op.Key] {
				touched[op.Key] = true
				order = append(order, op.Key)
			}
			vals[op.Key] = pending[op.Key]
		}
	}
	for _, k := range order {
		c := current[k]
		if c.Exists && vals[k] == c.Value {
			continue
		}
		res.Writes = append(res.Writes, checkpoint.Write{Key: k, OldVersion: c.Version, OldValue: c.Value, NewValue: vals[k], Insert: !c.Exists})
	}
	return res, nil
}

// FuzzPlanGroups holds Plan to refPlan over groups small and large (a
// large group keeps its pending values in a map, a small one in a list),
// with repeated keys, sets, adds and guards.
func FuzzPlanGroups(f *testing.F) {
	f.Add([]byte{3, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{39, 1, 1, 1, 1, 200, 7, 7, 9, 30, 2, 2, 2, 2, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5})
	f.Add([]byte{19, 1, 2, 4, 5, 1, 2, 4, 5, 1, 2, 4, 5, 1, 2, 4, 5, 1, 2, 4, 5, 2, 8, 8}) // a large group without guards
	f.Add([]byte{17, 250, 251, 252, 253, 254, 255, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 3, 100})
	f.Fuzz(func(t *testing.T, data []byte) {
		cur := map[string]checkpoint.State{
			"a": {Value: 100, Version: 1, Exists: true}, "b": {Value: 0, Version: 4, Exists: true},
			"c": {Value: math.MaxInt64 - 300, Version: 2, Exists: true}, "n": {}, "m": {},
		}
		keys := []string{"a", "b", "c", "n", "m"}
		var groups [][]Op
		for len(data) > 0 {
			size := int(data[0])%40 + 1
			data = data[1:]
			var ops []Op
			for i := 0; i < size && len(data) > 0; i++ {
				x := data[0]
				data = data[1:]
				op := Op{Key: keys[int(x)%len(keys)], Kind: OpAdd, Amount: int64(x) - 128}
				if x%11 == 0 {
					op.Kind, op.Amount = OpSet, int64(x)
				}
				if x%3 == 0 {
					op.Guards = []Guard{NotBelow(0)}
				}
				if x%7 == 0 {
					op.Guards = append(op.Guards, NotAbove(500))
				}
				ops = append(ops, op)
			}
			groups = append(groups, ops)
		}
		got, gerr := Plan(cur, groups...)
		want, werr := refPlan(cur, groups...)
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("Plan error %v, reference %v", gerr, werr)
		}
		if gerr != nil {
			var g, w *OverflowError
			if !errors.As(gerr, &g) || !errors.As(werr, &w) || *g != *w {
				t.Fatalf("Plan error %v, reference %v", gerr, werr)
			}
			return
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Plan = %+v\nreference %+v", got, want)
		}
	})
}
