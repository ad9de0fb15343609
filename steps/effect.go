package steps

import "github.com/stepwise-run/stepwise/steps/internal/plan"

// OpKind is the kind of a relative operation.
type OpKind = plan.OpKind

// Operation kinds.
const (
	OpAdd = plan.OpAdd // add Amount to the key's value
	OpSet = plan.OpSet // set the key's value to Amount
)

// Guard is a condition on a key's value after an operation, checked when
// the runner plans the step's effects against the current values.
type Guard = plan.Guard

// NotBelow guards a value from going under limit: NotBelow(0) is "no
// overdraft".
func NotBelow(limit int64) Guard { return plan.NotBelow(limit) }

// NotAbove guards a value from going over limit.
func NotAbove(limit int64) Guard { return plan.NotAbove(limit) }

// Op is one relative operation on one key, with the guards its result must
// satisfy.
type Op = plan.Op

// Effects collects a step's relative operations. The step's function
// records them; the runner turns them into compare-and-set writes after the
// function returns. Operations on one key fold in the order recorded.
type Effects struct {
	ops []Op
}

// Add records "add delta to key", e.g. Add("acct:42", -1000, NotBelow(0)).
// Money is int64 minor units.
func (e *Effects) Add(key string, delta int64, guards ...Guard) {
	e.ops = append(e.ops, Op{Key: key, Kind: OpAdd, Amount: delta, Guards: guards})
}

// Set records "set key to value".
func (e *Effects) Set(key string, value int64, guards ...Guard) {
	e.ops = append(e.ops, Op{Key: key, Kind: OpSet, Amount: value, Guards: guards})
}

// Ops returns the operations recorded so far.
func (e *Effects) Ops() []Op { return e.ops }

// GuardError is the planner's verdict that an operation would break a
// guard. Inside a step it becomes a pinned rejection.
type GuardError = plan.GuardError
