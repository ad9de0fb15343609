package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stepwise-run/stepwise/checkpoint"
)

// Messages are stamped with the times the caller gives (a message's
// creation, its retry time); a time left zero is the server's now().
const (
	// sqlEnqueue queues a message due at its creation; a key queued
	// before keeps its first message.
	sqlEnqueue = `INSERT INTO outbox (key, run_id, topic, payload, status, next_at, created_at)
VALUES ($1, $2, $3, $4, 'queued', coalesce($5::timestamptz, now()), coalesce($5::timestamptz, now()))
ON CONFLICT (key) DO NOTHING`
	messageCols    = `key, run_id, topic, payload, status, tries, next_at, last_error, created_at, sent_at`
	sqlDue         = `SELECT ` + messageCols + ` FROM outbox WHERE status = 'queued' AND next_at <= coalesce($1::timestamptz, now()) ORDER BY next_at, key LIMIT $2`
	sqlRunMessages = `SELECT ` + messageCols + ` FROM outbox WHERE run_id = $1 ORDER BY created_at, key`
	sqlMarkSent    = `UPDATE outbox SET status = 'sent', tries = tries + 1, sent_at = coalesce($2::timestamptz, now()), last_error = ''
WHERE key = $1`
	// sqlMarkFailed counts a failed try of a message still queued (a
	// failure reported after a delivery changes nothing).
	sqlMarkFailed = `UPDATE outbox SET tries = tries + 1, last_error = $2, next_at = coalesce($3::timestamptz, now())
WHERE key = $1 AND status = 'queued'`
)

var _ checkpoint.OutboxStore = (*Store)(nil)

// Enqueue implements checkpoint.Tx: the message commits or rolls back
// with the transaction's checkpoint. Queuing a key twice keeps the first.
func (t *pgTx) Enqueue(m checkpoint.Message) error {
	b := &pgx.Batch{}
	b.Queue(sqlEnqueue, m.Key, t.lease.RunID, m.Topic, m.Payload, ts(m.CreatedAt))
	return t.write(b, nil)
}

// messages runs a query of messageCols.
func (s *Store) messages(ctx context.Context, op, query string, args ...any) ([]checkpoint.Message, error) {
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, s.wrap(op, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (checkpoint.Message, error) {
		var m checkpoint.Message
		var next, created, sent pgtype.Timestamptz
		err := r.Scan(&m.Key, &m.RunID, &m.Topic, &m.Payload, &m.Status, &m.Tries, &next, &m.LastError, &created, &sent)
		m.NextAt, m.CreatedAt, m.SentAt = tm(next), tm(created), tm(sent)
		return m, err
	})
	if len(out) == 0 {
		out = nil // as from the SQLite store
	}
	return out, s.wrap(op, err)
}

// DueMessages implements checkpoint.OutboxStore: due at now on the
// caller's clock (Config.CallerClock), otherwise at the server's now().
// A limit of 0 or less returns every due message.
func (s *Store) DueMessages(ctx context.Context, now time.Time, n int) ([]checkpoint.Message, error) {
	return s.messages(ctx, "read due messages", sqlDue, s.clock(now), limit(n))
}

// RunMessages implements checkpoint.OutboxStore.
func (s *Store) RunMessages(ctx context.Context, runID string) ([]checkpoint.Message, error) {
	return s.messages(ctx, "read messages of "+runID, sqlRunMessages, runID)
}

// MarkSent implements checkpoint.OutboxStore. A key not queued is no
// error, as on SQLite.
func (s *Store) MarkSent(ctx context.Context, key string, at time.Time) error {
	_, err := s.pool.Exec(ctx, sqlMarkSent, key, s.clock(at))
	return s.wrap("mark message "+key+" sent", err)
}

// MarkFailed implements checkpoint.OutboxStore: next is the retry time the
// dispatcher chose.
func (s *Store) MarkFailed(ctx context.Context, key, errText string, next time.Time) error {
	_, err := s.pool.Exec(ctx, sqlMarkFailed, key, errText, ts(next))
	return s.wrap("mark message "+key+" failed", err)
}
