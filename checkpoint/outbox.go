package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Message statuses.
const (
	// MessageQueued is a message waiting for delivery: due at NextAt, or
	// claimed by a dispatcher until NextAt.
	MessageQueued = "queued"
	// MessageSent is a message a dispatcher delivered.
	MessageSent = "sent"
	// MessageDead is a message whose deliveries failed MaxTries times: a
	// dead letter, never claimed again, listed for an operator.
	MessageDead = "dead"
)

// Message is a notification in the outbox.
type Message struct {
	Key     string `json:"key"` // RUN_ID/STEP_ID, stable across reruns
	RunID   string `json:"run_id"`
	Topic   string `json:"topic"`
	Payload []byte `json:"payload"`
	Status  string `json:"status"`
	// Tries counts the recorded outcomes of deliveries (MarkSent and
	// MarkFailed); a dispatcher that died mid-delivery recorded none.
	Tries int `json:"tries"`
	// NextAt is when a queued message is due; for a message just claimed,
	// the end of its claim's window.
	NextAt    time.Time `json:"next_at"`
	LastError string    `json:"last_error,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	SentAt    time.Time `json:"sent_at,omitzero"`
}

// DeliveryFailure is a failed delivery of one message, for MarkFailed.
type DeliveryFailure struct {
	// Key is the message's key.
	Key string
	// Error is what the delivery returned, kept as the message's LastError.
	Error string
	// RetryAt is when the message is due again if it is not dead, on the
	// caller's clock.
	RetryAt time.Time
	// RetryIn, when positive, is how long after the failure the message
	// is due again, on the store's clock: a store that keeps times on its
	// own clock (PostgreSQL's now(), as for leases) uses it instead of
	// RetryAt, so a dispatcher whose clock is skewed neither delays a
	// retry nor hurries it. SQLite, whose clock is the caller's, uses
	// RetryAt.
	RetryIn time.Duration
	// MaxTries is the number of tries, this one counted, after which the
	// message is dead. At least 1.
	MaxTries int
}

// InvalidClaimError is returned by ClaimMessages and MarkFailed for a
// limit, window or maximum of tries that is not positive.
type InvalidClaimError struct {
	Field string // "limit", "visibleFor" or "MaxTries"
	Value string
}

func (e *InvalidClaimError) Error() string {
	return fmt.Sprintf("checkpoint: outbox %s must be positive, got %s", e.Field, e.Value)
}

// OutboxStore is the outbox of a checkpoint store: messages are queued
// through Tx.Enqueue with a step's checkpoint, and delivered by any number
// of dispatchers that share the store.
//
// Delivery is at least once. A dispatcher claims due messages for a window
// (visibleFor): until the window ends no other claim returns them, so while
// every dispatcher records its outcome within the window, each message is
// delivered once. A dispatcher that dies, stalls or overruns the window
// leaves its messages queued, and the first claim after the window takes
// them again: the message may then be delivered twice, with the same key,
// which receivers deduplicate by.
type OutboxStore interface {
	// ClaimMessages atomically takes up to limit queued messages due at
	// now, oldest first, and makes them invisible to every other claim
	// until now+visibleFor (their NextAt, as returned). Concurrent claims,
	// through any handles, take disjoint sets. Dead and sent messages are
	// never claimed. On PostgreSQL now is the server's clock unless the
	// store was opened with CallerClock. A limit or visibleFor that is not
	// positive is an *InvalidClaimError.
	ClaimMessages(ctx context.Context, now time.Time, limit int, visibleFor time.Duration) ([]Message, error)
	// RunMessages returns a run's messages, for show.
	RunMessages(ctx context.Context, runID string) ([]Message, error)
	// Messages returns up to limit messages with the given status (every
	// status if empty), oldest first by creation, for operators. A limit
	// of 0 or less returns every one.
	Messages(ctx context.Context, status string, limit int) ([]Message, error)
	// MarkSent records a delivery.
	MarkSent(ctx context.Context, key string, at time.Time) error
	// MarkFailed records a failed delivery of a queued message: one more
	// try, its error, and either its retry time or, when its tries reach
	// f.MaxTries, the status MessageDead (dead reports which). A message
	// no longer queued is left as it is. A MaxTries below 1 is an
	// *InvalidClaimError.
	MarkFailed(ctx context.Context, f DeliveryFailure) (dead bool, err error)
	// RequeueDead is an operator's manual operation: it queues dead
	// messages again (after their receiver was fixed), due at r.Now with
	// no tries counted, in one transaction, and records r.Audit in the
	// audit log of every run whose messages it queued. Only dead messages
	// change: a message r.Keys names that is queued or sent is left as it
	// is and reported in RequeueResult.NotDead, and a key no message has
	// fails the whole request with an *UnknownMessagesError (nothing
	// changes). Dispatchers may run meanwhile: a requeued message is
	// claimed like a new one, once per window.
	RequeueDead(ctx context.Context, r Requeue) (RequeueResult, error)
}

// ErrBadRequeue is returned by RequeueDead for a Requeue that selects by
// none, or more than one, of Keys, RunID and All.
var ErrBadRequeue = errors.New("checkpoint: a requeue selects dead messages by keys, by run, or all of them")

// Requeue says which dead messages RequeueDead queues again, and who
// asks: exactly one of Keys, RunID and All selects them.
type Requeue struct {
	// Keys are the messages to queue again, by exact key.
	Keys []string
	// RunID selects every dead message of one run.
	RunID string
	// All selects every dead message in the outbox. It must be set:
	// a Requeue that selects nothing is an error, never "all".
	All bool
	// Now is when the messages are due again; on PostgreSQL the
	// server's clock unless the store was opened with CallerClock.
	Now time.Time
	// Audit is the operator's record (who, when, the command, why). It is
	// stored once for each run whose messages were queued again, with that
	// run's ID and the keys in Details (before its own Details, if any);
	// its RunID is not read.
	Audit Audit
}

// Validate returns the error (wrapping ErrBadRequeue) a backend's
// RequeueDead returns for a Requeue that does not select by exactly one
// of Keys, RunID and All, or nil.
func (r Requeue) Validate() error {
	n := 0
	for _, set := range []bool{len(r.Keys) > 0, r.RunID != "", r.All} {
		if set {
			n++
		}
	}
	switch n {
	case 0:
		return fmt.Errorf("%w; this one selects none", ErrBadRequeue)
	case 1:
		return nil
	}
	return fmt.Errorf("%w, one of these; this one gives more than one (keys %d, run %q, all %t)", ErrBadRequeue, len(r.Keys), r.RunID, r.All)
}

// RequeueResult is what RequeueDead did.
type RequeueResult struct {
	// Requeued are the messages queued again, as they are now (queued,
	// due at Now, no tries; their last error kept until the next
	// delivery), oldest first by creation.
	Requeued []Message `json:"requeued"`
	// NotDead are the messages Keys named that were not dead (queued or
	// sent), left as they are, in the order named.
	NotDead []Message `json:"not_dead"`
}

// UnknownMessagesError is returned by RequeueDead when keys it was given
// name no message: nothing was queued again. errors.Is(err, ErrNotFound)
// holds.
type UnknownMessagesError struct {
	Keys []string // the unknown keys, in the order given
}

func (e *UnknownMessagesError) Error() string {
	if len(e.Keys) == 1 {
		return fmt.Sprintf("no message %q in the outbox; nothing was requeued", e.Keys[0])
	}
	return fmt.Sprintf("no messages %s in the outbox; nothing was requeued", JoinIDs(quoted(e.Keys), 10))
}

// Unwrap makes errors.Is(err, ErrNotFound) hold.
func (e *UnknownMessagesError) Unwrap() error { return ErrNotFound }

func quoted(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = fmt.Sprintf("%q", k)
	}
	return out
}

// RequeueAudits sorts requeued messages oldest first by creation (then
// key) and returns the audit records of a RequeueDead that queued them
// again: a copy of a for each run, in the order of the run's first
// message, with every key of the run in Details, then a's own Details. A backend stores them in
// the transaction that requeued the messages.
func RequeueAudits(a Audit, requeued []Message) []Audit {
	slices.SortFunc(requeued, func(x, y Message) int {
		if c := x.CreatedAt.Compare(y.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(x.Key, y.Key)
	})
	var runs []string
	keys := map[string][]string{}
	for _, m := range requeued {
		if _, ok := keys[m.RunID]; !ok {
			runs = append(runs, m.RunID)
		}
		keys[m.RunID] = append(keys[m.RunID], m.Key)
	}
	out := make([]Audit, 0, len(runs))
	for _, id := range runs {
		ra := a
		ra.RunID = id
		ra.Details = fmt.Sprintf("requeued %d dead messages: %s", len(keys[id]), strings.Join(keys[id], ", "))
		if len(keys[id]) == 1 {
			ra.Details = "requeued dead message " + keys[id][0]
		}
		if a.Details != "" { // e.g. the request it came through
			ra.Details += "; " + a.Details
		}
		out = append(out, ra)
	}
	return out
}

// UniqueKeys returns keys without repeats, in first-given order, for a
// backend's RequeueDead.
func UniqueKeys(keys []string) []string {
	seen := make(map[string]bool, len(keys))
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// CheckClaim returns the *InvalidClaimError a backend's ClaimMessages
// returns for a limit or window that is not positive, or nil.
func CheckClaim(limit int, visibleFor time.Duration) error {
	if limit < 1 {
		return &InvalidClaimError{Field: "limit", Value: fmt.Sprint(limit)}
	}
	if visibleFor <= 0 {
		return &InvalidClaimError{Field: "visibleFor", Value: visibleFor.String()}
	}
	return nil
}

// Validate returns the *InvalidClaimError a backend's MarkFailed returns
// for a MaxTries below 1, or nil.
func (f DeliveryFailure) Validate() error {
	if f.MaxTries < 1 {
		return &InvalidClaimError{Field: "MaxTries", Value: fmt.Sprint(f.MaxTries)}
	}
	return nil
}
