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

// Plan folds groups of relative operations, in order, over the current
// state of their keys and returns absolute compare-and-set writes. It is a
// pure function. Each group is all-or-nothing: if any operation in it breaks
// a guard (or overflows int64), none of the group's operations count and the
// next group starts from the state before it. Keys missing from current are
// an error. Every written key's expected version is its current version;
// unchanged keys produce no write.
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
				if (op.Amount > 0 && cur > math.MaxInt64-op.Amount) || (op.Amount < 0 && cur < math.MinInt64-op.Amount) {
					rejected = &GuardError{Key: op.Key, Guard: Guard{Kind: "no_overflow"}, Value: cur}
				}
				next = cur + op.Amount
			case OpSet:
				next = op.Amount
			default:
				return PlanResult{}, fmt.Errorf("steps: plan: unknown operation %q on key %q", op.Kind, op.Key)
			}
			if rejected != nil {
				break
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
