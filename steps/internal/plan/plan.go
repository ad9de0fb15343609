// Package plan is the planner behind steps' effects: it folds groups of
// relative operations (steps.Effects) over the current state of their keys
// into absolute compare-and-set writes, a pure function the exactly-once
// protocol applies. Its types are steps' own (steps.Op, steps.Guard,
// steps.GuardError, ...), aliased there, so job code never imports it.
package plan

import (
	"fmt"
	"math"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// OpKind is the kind of a relative operation.
type OpKind string

// Operation kinds.
const (
	OpAdd OpKind = "add" // add Amount to the key's value
	OpSet OpKind = "set" // set the key's value to Amount
)

// Guard is a condition on a key's value after an operation, checked when
// the runner plans the step's effects against the current values.
type Guard struct {
	Kind  string `json:"kind"` // "not_below" or "not_above"
	Limit int64  `json:"limit"`
}

// NotBelow guards a value from going under limit: NotBelow(0) is "no
// overdraft".
func NotBelow(limit int64) Guard { return Guard{Kind: "not_below", Limit: limit} }

// NotAbove guards a value from going over limit.
func NotAbove(limit int64) Guard { return Guard{Kind: "not_above", Limit: limit} }

func (g Guard) holds(v int64) bool {
	switch g.Kind {
	case "not_below":
		return v >= g.Limit
	case "not_above":
		return v <= g.Limit
	}
	return false
}

func (g Guard) String() string {
	if g.Kind == "not_below" {
		return fmt.Sprintf("not below %d", g.Limit)
	}
	return fmt.Sprintf("not above %d", g.Limit)
}

// Op is one relative operation on one key, with the guards its result must
// satisfy.
type Op struct {
	Key    string  `json:"key"`
	Kind   OpKind  `json:"kind"`
	Amount int64   `json:"amount"`
	Guards []Guard `json:"guards,omitempty"`
}

// GuardError is the planner's verdict that an operation would break a
// guard. Inside a step it becomes a pinned rejection.
type GuardError struct {
	Key   string
	Guard Guard
	Value int64 // the value the operation would have produced
}

func (e *GuardError) Error() string {
	return fmt.Sprintf("%s would be %d, breaking its guard (%s)", e.Key, e.Value, e.Guard)
}

// Result is the planner's output: the compare-and-set writes, in the
// order keys were first touched, and which groups were rejected.
type Result struct {
	Writes []checkpoint.Write
	// Rejected maps the index of each rejected group to why.
	Rejected map[int]*GuardError
}

// OverflowError is returned by Plan when an Add would take a key's value
// out of the int64 range. That is bad data or a bug, never a business
// outcome, so it is not pinned like a guard's rejection: the step (or the
// whole chunk of a batch step) fails, nothing of its plan is applied, and a
// rerun after the data is fixed plans it again.
type OverflowError struct {
	// Key is the key whose value would overflow.
	Key string
	// Value is the key's value before the Add (after the earlier
	// operations of the plan).
	Value int64
	// Delta is the Add's amount.
	Delta int64
	// Group is the index of the operation's group in the Plan call: the
	// batch item, for a batch step's chunk.
	Group int
}

func (e *OverflowError) Error() string {
	return fmt.Sprintf("adding %d to %s (now %d) would overflow int64 minor units; nothing of this plan was applied", e.Delta, e.Key, e.Value)
}

// AddInt64 returns a+b and true, or 0 and false when the sum does not fit in
// an int64. Money code sums with it (totals, summaries, audits) so an
// overflow fails loudly instead of wrapping around.
func AddInt64(a, b int64) (int64, bool) {
	if (b > 0 && a > math.MaxInt64-b) || (b < 0 && a < math.MinInt64-b) {
		return 0, false
	}
	return a + b, true
}

// Plan folds groups of relative operations, in order, over the current
// state of their keys and returns absolute compare-and-set writes. It is a
// pure function. Each group is all-or-nothing: if an operation in it breaks
// a guard, none of the group's operations count, the group is reported in
// Rejected, and the next group starts from the state before it. An Add that
// would overflow int64 fails the whole call with an *OverflowError (the
// operations of a group are checked in order, so one after a broken guard
// is never evaluated). Keys missing from current are an error. Every written
// key's expected version is its current version; unchanged keys produce no
// write.
func Plan(current map[string]checkpoint.State, groups ...[]Op) (Result, error) {
	p := &planner{current: current, idx: make(map[string]int, len(current)), accs: make([]acc, 0, len(current))}
	res := Result{}
	for gi, ops := range groups {
		rejected, err := p.group(gi, ops)
		if err != nil {
			return Result{}, err
		}
		if rejected != nil {
			if res.Rejected == nil {
				res.Rejected = make(map[int]*GuardError)
			}
			res.Rejected[gi] = rejected
			continue
		}
		p.keep()
	}
	res.Writes = p.writes()
	return res, nil
}

// planner is Plan's state. Each key read is an entry of accs, found by
// idx; a group's values are pending until it ends, in first-touch order.
// A chunk plans thousands of small groups, so nothing is allocated per
// group or per operation: pending is reused, searched linearly in a small
// group and through pendingAt in a large one.
type planner struct {
	current   map[string]checkpoint.State
	idx       map[string]int
	accs      []acc
	order     []int // accs touched by a kept group, in first-touch order
	pending   []pend
	pendingAt map[int]int // acc index -> pending index, in a large group
	large     bool        // the group being folded is large
}

type acc struct {
	key     string
	value   int64
	touched bool
}

type pend struct {
	at    int
	value int64
}

// smallGroup is the largest group whose pending values are searched
// linearly.
const smallGroup = 16

// group folds the operations of group gi into pending values, stopping at
// the first broken guard (returned).
func (p *planner) group(gi int, ops []Op) (*GuardError, error) {
	p.pending = p.pending[:0]
	p.large = len(ops) > smallGroup
	if p.large {
		if p.pendingAt == nil {
			p.pendingAt = make(map[int]int, len(ops))
		}
		clear(p.pendingAt)
	}
	for _, op := range ops {
		if rejected, err := p.apply(gi, op); rejected != nil || err != nil {
			return rejected, err
		}
	}
	return nil, nil
}

// apply folds one operation of group gi into its key's pending value.
func (p *planner) apply(gi int, op Op) (*GuardError, error) {
	at, ok := p.idx[op.Key]
	if !ok {
		c, ok := p.current[op.Key]
		if !ok {
			return nil, fmt.Errorf("steps: plan: no current state for key %q", op.Key)
		}
		at = len(p.accs)
		p.accs = append(p.accs, acc{key: op.Key, value: c.Value})
		p.idx[op.Key] = at
	}
	// The key's value so far in this group, and where it is kept.
	cur, pi := p.accs[at].value, p.pendingOf(at)
	if pi >= 0 {
		cur = p.pending[pi].value
	}
	var next int64
	switch op.Kind {
	case OpAdd:
		var ok bool
		if next, ok = AddInt64(cur, op.Amount); !ok {
			return nil, &OverflowError{Key: op.Key, Value: cur, Delta: op.Amount, Group: gi}
		}
	case OpSet:
		next = op.Amount
	default:
		return nil, fmt.Errorf("steps: plan: unknown operation %q on key %q", op.Kind, op.Key)
	}
	for _, g := range op.Guards {
		if !g.holds(next) {
			return &GuardError{Key: op.Key, Guard: g, Value: next}, nil
		}
	}
	if pi >= 0 {
		p.pending[pi].value = next
		return nil, nil
	}
	if p.large {
		p.pendingAt[at] = len(p.pending)
	}
	p.pending = append(p.pending, pend{at: at, value: next})
	return nil, nil
}

// pendingOf is the index in pending of the acc at, or -1.
func (p *planner) pendingOf(at int) int {
	if p.large {
		if j, ok := p.pendingAt[at]; ok {
			return j
		}
		return -1
	}
	for j := range p.pending {
		if p.pending[j].at == at {
			return j
		}
	}
	return -1
}

// keep makes the group's pending values count.
func (p *planner) keep() {
	for _, pv := range p.pending {
		a := &p.accs[pv.at]
		if !a.touched {
			a.touched = true
			p.order = append(p.order, pv.at)
		}
		a.value = pv.value
	}
}

// writes are the compare-and-set writes of the kept groups, in
// first-touch order.
func (p *planner) writes() []checkpoint.Write {
	var out []checkpoint.Write
	for _, at := range p.order {
		a := p.accs[at]
		c := p.current[a.key]
		if c.Exists && a.value == c.Value {
			continue // folded back to where it was: nothing to write
		}
		out = append(out, checkpoint.Write{
			Key: a.key, OldVersion: c.Version, OldValue: c.Value, NewValue: a.value, Insert: !c.Exists,
		})
	}
	return out
}

// Keys lists the distinct keys of ops in first-touch order.
func Keys(groups ...[]Op) []string {
	n := 0
	for _, ops := range groups {
		n += len(ops)
	}
	seen := make(map[string]struct{}, n)
	keys := make([]string, 0, n)
	for _, ops := range groups {
		for _, op := range ops {
			if _, ok := seen[op.Key]; !ok {
				seen[op.Key] = struct{}{}
				keys = append(keys, op.Key)
			}
		}
	}
	return keys
}
