package checkpoint

import (
	"context"
	"database/sql"
	"fmt"
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

var _ OutboxStore = (*SQLite)(nil)

const (
	sqlEnqueue = `INSERT INTO outbox (key, run_id, topic, payload, status, next_at, created_at)
VALUES (?, ?, ?, ?, 'queued', ?, ?) ON CONFLICT (key) DO NOTHING`
	sqlMessageCols = `key, run_id, topic, payload, status, tries, next_at, last_error, created_at, sent_at`
	sqlDue         = `SELECT ` + sqlMessageCols + ` FROM outbox WHERE status = 'queued' AND next_at <= ? ORDER BY next_at, key LIMIT ?`
	sqlRunMessages = `SELECT ` + sqlMessageCols + ` FROM outbox WHERE run_id = ? ORDER BY created_at, key`
	sqlMarkSent    = `UPDATE outbox SET status = 'sent', tries = tries + 1, sent_at = ?, last_error = '' WHERE key = ?`
	sqlMarkFailed  = `UPDATE outbox SET tries = tries + 1, last_error = ?, next_at = ? WHERE key = ? AND status = 'queued'`
)

// Enqueue implements Tx: the message commits or rolls back with the
// transaction's checkpoint. Queuing a key twice keeps the first.
func (t *sqliteTx) Enqueue(m Message) error {
	if err := t.checkFence(); err != nil {
		return err
	}
	_, err := t.tx.ExecContext(t.ctx, sqlEnqueue, m.Key, t.lease.RunID, m.Topic, m.Payload, fmtTime(m.CreatedAt), fmtTime(m.CreatedAt))
	return err
}

func (s *SQLite) queryMessages(ctx context.Context, op, q string, args ...any) ([]Message, error) {
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, s.wrap(op, err)
	}
	defer rows.Close()
	var out []Message
	for rows.Next() {
		var m Message
		var next, created, sent sql.NullString
		if err := rows.Scan(&m.Key, &m.RunID, &m.Topic, &m.Payload, &m.Status, &m.Tries, &next, &m.LastError, &created, &sent); err != nil {
			return nil, s.wrap(op, err)
		}
		m.NextAt, m.CreatedAt, m.SentAt = parseTime(next), parseTime(created), parseTime(sent)
		out = append(out, m)
	}
	return out, s.wrap(op, rows.Err())
}

// DueMessages implements OutboxStore.
func (s *SQLite) DueMessages(ctx context.Context, now time.Time, limit int) ([]Message, error) {
	return s.queryMessages(ctx, "read due messages", sqlDue, fmtTime(now), limit)
}

// RunMessages implements OutboxStore.
func (s *SQLite) RunMessages(ctx context.Context, runID string) ([]Message, error) {
	return s.queryMessages(ctx, "read messages of "+runID, sqlRunMessages, runID)
}

// MarkSent implements OutboxStore.
func (s *SQLite) MarkSent(ctx context.Context, key string, at time.Time) error {
	_, err := s.db.ExecContext(ctx, sqlMarkSent, fmtTime(at), key)
	return s.wrap(fmt.Sprintf("mark message %s sent", key), err)
}

// MarkFailed implements OutboxStore.
func (s *SQLite) MarkFailed(ctx context.Context, key, errText string, next time.Time) error {
	_, err := s.db.ExecContext(ctx, sqlMarkFailed, errText, fmtTime(next), key)
	return s.wrap(fmt.Sprintf("mark message %s failed", key), err)
}
