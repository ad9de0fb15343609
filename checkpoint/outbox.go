package checkpoint

import (
	"context"
	"fmt"
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
	// RetryAt is when the message is due again if it is not dead.
	RetryAt time.Time
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
