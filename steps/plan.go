package steps

import (
	"fmt"
	"math"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// PlanResult is the planner's output: the compare-and-set writes, in the
// order keys were first touched, and which groups were rejected.
type PlanResult struct {
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
func Plan(current map[string]checkpoint.State, groups ...[]Op) (PlanResult, error) {
	type acc struct {
		value   int64
		touched bool
	}
	state := make(map[string]*acc)
	var order []string
	res := PlanResult{}
	for gi, ops := range groups {
		// Work on a copy of touched values so a rejected group leaves none.
		pending := map[string]int64{}
		var rejected *GuardError
		for _, op := range ops {
			cur, ok := pending[op.Key]
			if !ok {
				a := state[op.Key]
				if a == nil {
					c, ok := current[op.Key]
					if !ok {
						return PlanResult{}, fmt.Errorf("steps: plan: no current state for key %q", op.Key)
					}
					a = &acc{value: c.Value}
					state[op.Key] = a
				}
				cur = a.value
			}
			var next int64
			switch op.Kind {
			case OpAdd:
				var ok bool
				if next, ok = AddInt64(cur, op.Amount); !ok {
					return PlanResult{}, &OverflowError{Key: op.Key, Value: cur, Delta: op.Amount, Group: gi}
				}
			case OpSet:
				next = op.Amount
			default:
				return PlanResult{}, fmt.Errorf("steps: plan: unknown operation %q on key %q", op.Kind, op.Key)
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
				res.Rejected = make(map[int]*GuardError)
			}
			res.Rejected[gi] = rejected
			continue
		}
		for _, op := range ops {
			a := state[op.Key]
			if !a.touched {
				a.touched = true
				order = append(order, op.Key)
			}
			a.value = pending[op.Key]
		}
	}
	for _, k := range order {
		c := current[k]
		nv := state[k].value
		if c.Exists && nv == c.Value {
			continue // folded back to where it was: nothing to write
		}
		res.Writes = append(res.Writes, checkpoint.Write{
			Key: k, OldVersion: c.Version, OldValue: c.Value, NewValue: nv, Insert: !c.Exists,
		})
	}
	return res, nil
}

// keysOf lists the distinct keys of ops in first-touch order.
func keysOf(groups ...[]Op) []string {
	seen := map[string]bool{}
	var keys []string
	for _, ops := range groups {
		for _, op := range ops {
			if !seen[op.Key] {
				seen[op.Key] = true
				keys = append(keys, op.Key)
			}
		}
	}
	return keys
}
