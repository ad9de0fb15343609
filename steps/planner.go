package steps

import (
	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/steps/internal/plan"
)

// PlanResult is the planner's output: the compare-and-set writes, in the
// order keys were first touched, and which groups were rejected.
type PlanResult = plan.Result

// OverflowError is returned by Plan when an Add would take a key's value
// out of the int64 range. That is bad data or a bug, never a business
// outcome, so it is not pinned like a guard's rejection: the step (or the
// whole chunk of a batch step) fails, nothing of its plan is applied, and a
// rerun after the data is fixed plans it again.
type OverflowError = plan.OverflowError

// AddInt64 returns a+b and true, or 0 and false when the sum does not fit in
// an int64. Money code sums with it (totals, summaries, audits) so an
// overflow fails loudly instead of wrapping around.
func AddInt64(a, b int64) (int64, bool) { return plan.AddInt64(a, b) }

// Plan folds groups of relative operations, in order, over the current
// state of their keys and returns absolute compare-and-set writes, as a
// step's effects are applied: a pure function. Each group is
// all-or-nothing: if an operation in it breaks a guard, none of the
// group's operations count, the group is reported in Rejected, and the
// next group starts from the state before it. An Add that would overflow
// int64 fails the whole call with an *OverflowError. Keys missing from
// current are an error. Every written key's expected version is its
// current version; unchanged keys produce no write.
func Plan(current map[string]checkpoint.State, groups ...[]Op) (PlanResult, error) {
	return plan.Plan(current, groups...)
}

// keysOf lists the distinct keys of ops in first-touch order.
func keysOf(groups ...[]Op) []string { return plan.Keys(groups...) }
