package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

var _ checkpoint.OutboxStore = (*Store)(nil)

const (
	sqlEnqueue = `INSERT INTO outbox (key, run_id, topic, payload, status, next_at, created_at)
VALUES (?, ?, ?, ?, 'queued', ?, ?) ON CONFLICT (key) DO NOTHING`
	sqlMessageCols = `key, run_id, topic, payload, status, tries, next_at, last_error, created_at, sent_at`
	sqlDue         = `SELECT ` + sqlMessageCols + ` FROM outbox WHERE status = 'queued' AND next_at <= ? ORDER BY next_at, key LIMIT ?`
	sqlRunMessages = `SELECT ` + sqlMessageCols + ` FROM outbox WHERE run_id = ? ORDER BY created_at, key`
	sqlMarkSent    = `UPDATE outbox SET status = 'sent', tries = tries + 1, sent_at = ?, last_error = '' WHERE key = ?`
	sqlMarkFailed  = `UPDATE outbox SET tries = tries + 1, last_error = ?, next_at = ? WHERE key = ? AND status = 'queued'`
)

// Enqueue implements checkpoint.Tx: the message commits or rolls back with the
// transaction's checkpoint. Queuing a key twice keeps the first.
func (t *sqliteTx) Enqueue(m checkpoint.Message) error {
	if err := t.checkFence(); err != nil {
		return err
	}
	_, err := t.tx.ExecContext(t.ctx, sqlEnqueue, m.Key, t.lease.RunID, m.Topic, m.Payload, fmtTime(m.CreatedAt), fmtTime(m.CreatedAt))
	return err
}

func (s *Store) queryMessages(ctx context.Context, op, q string, args ...any) ([]checkpoint.Message, error) {
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, s.wrap(op, err)
	}
	defer rows.Close()
	var out []checkpoint.Message
	for rows.Next() {
		var m checkpoint.Message
		var next, created, sent sql.NullString
		if err := rows.Scan(&m.Key, &m.RunID, &m.Topic, &m.Payload, &m.Status, &m.Tries, &next, &m.LastError, &created, &sent); err != nil {
			return nil, s.wrap(op, err)
		}
		m.NextAt, m.CreatedAt, m.SentAt = parseTime(next), parseTime(created), parseTime(sent)
		out = append(out, m)
	}
	return out, s.wrap(op, rows.Err())
}

// DueMessages implements checkpoint.OutboxStore.
func (s *Store) DueMessages(ctx context.Context, now time.Time, limit int) ([]checkpoint.Message, error) {
	return s.queryMessages(ctx, "read due messages", sqlDue, fmtTime(now), limit)
}

// RunMessages implements checkpoint.OutboxStore.
func (s *Store) RunMessages(ctx context.Context, runID string) ([]checkpoint.Message, error) {
	return s.queryMessages(ctx, "read messages of "+runID, sqlRunMessages, runID)
}

// MarkSent implements checkpoint.OutboxStore.
func (s *Store) MarkSent(ctx context.Context, key string, at time.Time) error {
	_, err := s.db.ExecContext(ctx, sqlMarkSent, fmtTime(at), key)
	return s.wrap(fmt.Sprintf("mark message %s sent", key), err)
}

// MarkFailed implements checkpoint.OutboxStore.
func (s *Store) MarkFailed(ctx context.Context, key, errText string, next time.Time) error {
	_, err := s.db.ExecContext(ctx, sqlMarkFailed, errText, fmtTime(next), key)
	return s.wrap(fmt.Sprintf("mark message %s failed", key), err)
}
