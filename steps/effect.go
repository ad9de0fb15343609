package steps

import "fmt"

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
type GuardError struct {
	Key   string
	Guard Guard
	Value int64 // the value the operation would have produced
}

func (e *GuardError) Error() string {
	return fmt.Sprintf("%s would be %d, breaking its guard (%s)", e.Key, e.Value, e.Guard)
}
