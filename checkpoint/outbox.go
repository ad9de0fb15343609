package checkpoint

import (
	"context"
	"time"
)

// Message statuses.
const (
	MessageQueued = "queued"
	MessageSent   = "sent"
)

// Message is a notification in the outbox.
type Message struct {
	Key       string    `json:"key"` // RUN_ID/STEP_ID, stable across reruns
	RunID     string    `json:"run_id"`
	Topic     string    `json:"topic"`
	Payload   []byte    `json:"payload"`
	Status    string    `json:"status"`
	Tries     int       `json:"tries"`
	NextAt    time.Time `json:"next_at"`
	LastError string    `json:"last_error,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	SentAt    time.Time `json:"sent_at,omitzero"`
}

// OutboxStore is the outbox of a checkpoint store: messages are queued
// through Tx.Enqueue with a step's checkpoint, and delivered by a
// dispatcher.
type OutboxStore interface {
	// DueMessages returns up to limit queued messages due at now, oldest
	// first.
	DueMessages(ctx context.Context, now time.Time, limit int) ([]Message, error)
	// RunMessages returns a run's messages, for show.
	RunMessages(ctx context.Context, runID string) ([]Message, error)
	// MarkSent records a delivery.
	MarkSent(ctx context.Context, key string, at time.Time) error
	// MarkFailed records a failed delivery and when to try again.
	MarkFailed(ctx context.Context, key, errText string, next time.Time) error
}
