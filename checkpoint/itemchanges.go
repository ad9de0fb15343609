package checkpoint

import "time"

// Statuses of an ItemChange.
const (
	// ItemChangeRefused: a rerun found the change and refused to go on;
	// the refusal named it to the operator, who may accept it.
	ItemChangeRefused = "refused"
	// ItemChangeAccepted: an operator accepted the change (audited).
	ItemChangeAccepted = "accepted"
)

// ItemChange is a change to a batch step's source that a rerun found (a
// finished item whose content changed, one no longer yielded, a new item
// beyond the declared total or among finished ones) and what was decided:
// refused, and named to the operator, or accepted by one. An acceptance
// covers only changes a refusal recorded, matched by key, kind and
// fingerprint, so an operator accepts exactly what was shown.
type ItemChange struct {
	Step string
	// Key is the item's key; "" stands for finished items that could not
	// be named (Items counts them).
	Key    string
	Change string // the kind of change, as the batch step names it
	// Fingerprint is the item's fingerprint as the refusal found it (nil
	// for an item no longer yielded).
	Fingerprint []byte
	Items       int64 // 1, or the count of unnamed items for Key ""
	Status      string
	Attempt     int       // the attempt that recorded the row
	At          time.Time // when it was refused or accepted
	Operator    string    // who accepted it; "" while refused
}
