package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// Store is a complete backend: the runner, workers and the command line
// use it as they use the PostgreSQL store.
var _ checkpoint.Backend = (*Store)(nil)

var _ checkpoint.OutboxStore = (*Store)(nil)

const (
	sqlEnqueue = `INSERT INTO outbox (key, run_id, topic, payload, status, next_at, created_at)
VALUES (?, ?, ?, ?, 'queued', ?, ?) ON CONFLICT (key) DO NOTHING`
	sqlMessageCols = `key, run_id, topic, payload, status, tries, next_at, last_error, created_at, sent_at`
	sqlDue         = `SELECT key FROM outbox WHERE status = 'queued' AND next_at <= ? ORDER BY next_at, key LIMIT ?`
	sqlClaimOne    = `UPDATE outbox SET next_at = ? WHERE key = ? AND status = 'queued' RETURNING ` + sqlMessageCols
	sqlRunMessages = `SELECT ` + sqlMessageCols + ` FROM outbox WHERE run_id = ? ORDER BY created_at, key`
	// sqlMessages lists one status ('' for all); LIMIT -1 is no limit.
	sqlMessages = `SELECT ` + sqlMessageCols + ` FROM outbox WHERE (?1 = '' OR status = ?1) ORDER BY created_at, key LIMIT ?2`
	sqlMarkSent = `UPDATE outbox SET status = 'sent', tries = tries + 1, sent_at = ?, last_error = '' WHERE key = ?`
	// sqlMarkFailed counts a failed try of a message still queued and
	// makes it dead at the limit of tries.
	sqlMarkFailed = `UPDATE outbox SET tries = tries + 1, last_error = ?1, next_at = ?2,
status = CASE WHEN tries + 1 >= ?3 THEN 'dead' ELSE 'queued' END
WHERE key = ?4 AND status = 'queued' RETURNING status`
	// sqlRequeueKey and sqlRequeueDead queue dead messages again, due at
	// ?1 with no tries; nothing but a dead message changes.
	sqlRequeueKey  = `UPDATE outbox SET status = 'queued', tries = 0, next_at = ?1 WHERE key = ?2 AND status = 'dead' RETURNING ` + sqlMessageCols
	sqlRequeueDead = `UPDATE outbox SET status = 'queued', tries = 0, next_at = ?1
WHERE status = 'dead' AND (?2 = '' OR run_id = ?2) RETURNING ` + sqlMessageCols
	sqlMessage = `SELECT ` + sqlMessageCols + ` FROM outbox WHERE key = ?`
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

func scanMessage(row rowScanner) (checkpoint.Message, error) {
	var m checkpoint.Message
	var next, created, sent sql.NullString
	if err := row.Scan(&m.Key, &m.RunID, &m.Topic, &m.Payload, &m.Status, &m.Tries, &next, &m.LastError, &created, &sent); err != nil {
		return checkpoint.Message{}, err
	}
	m.NextAt, m.CreatedAt, m.SentAt = parseTime(next), parseTime(created), parseTime(sent)
	return m, nil
}

func (s *Store) queryMessages(ctx context.Context, op, q string, args ...any) ([]checkpoint.Message, error) {
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, s.wrap(op, err)
	}
	defer rows.Close()
	var out []checkpoint.Message
	for rows.Next() {
		m, err := scanMessage(rows)
		if err != nil {
			return nil, s.wrap(op, err)
		}
		out = append(out, m)
	}
	return out, s.wrap(op, rows.Err())
}

// ClaimMessages implements checkpoint.OutboxStore in one write
// transaction: the writer lock (BEGIN IMMEDIATE) serialises claims of
// every handle and process, so no two take one message in one window.
func (s *Store) ClaimMessages(ctx context.Context, now time.Time, limit int, visibleFor time.Duration) ([]checkpoint.Message, error) {
	if err := checkpoint.CheckClaim(limit, visibleFor); err != nil {
		return nil, err
	}
	var out []checkpoint.Message
	err := s.tx(ctx, "claim messages", func(tx *sql.Tx) error {
		out = out[:0]
		rows, err := tx.QueryContext(ctx, sqlDue, fmtTime(now), limit)
		if err != nil {
			return err
		}
		var keys []string
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				rows.Close()
				return err
			}
			keys = append(keys, k)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return err
		}
		until := fmtTime(now.Add(visibleFor))
		for _, k := range keys {
			m, err := scanMessage(tx.QueryRowContext(ctx, sqlClaimOne, until, k))
			if err != nil {
				return err
			}
			out = append(out, m)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Messages implements checkpoint.OutboxStore.
func (s *Store) Messages(ctx context.Context, status string, limit int) ([]checkpoint.Message, error) {
	if limit <= 0 {
		limit = -1
	}
	return s.queryMessages(ctx, "list messages", sqlMessages, status, limit)
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
func (s *Store) MarkFailed(ctx context.Context, f checkpoint.DeliveryFailure) (bool, error) {
	if err := f.Validate(); err != nil {
		return false, err
	}
	var status string
	err := s.db.QueryRowContext(ctx, sqlMarkFailed, f.Error, fmtTime(f.RetryAt), f.MaxTries, f.Key).Scan(&status)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil // no longer queued: sent or dead already
	}
	return status == checkpoint.MessageDead, s.wrap(fmt.Sprintf("mark message %s failed", f.Key), err)
}

// RequeueDead implements checkpoint.OutboxStore in one write transaction
// (BEGIN IMMEDIATE), serialised with every claim and delivery report.
func (s *Store) RequeueDead(ctx context.Context, r checkpoint.Requeue) (checkpoint.RequeueResult, error) {
	if err := r.Validate(); err != nil {
		return checkpoint.RequeueResult{}, err
	}
	var res checkpoint.RequeueResult
	err := s.tx(ctx, "requeue dead messages", func(tx *sql.Tx) error {
		res = checkpoint.RequeueResult{}
		now := fmtTime(r.Now)
		if len(r.Keys) == 0 {
			rows, err := tx.QueryContext(ctx, sqlRequeueDead, now, r.RunID)
			if err != nil {
				return err
			}
			for rows.Next() {
				m, err := scanMessage(rows)
				if err != nil {
					rows.Close()
					return err
				}
				res.Requeued = append(res.Requeued, m)
			}
			if err := errors.Join(rows.Err(), rows.Close()); err != nil {
				return err
			}
		}
		var unknown []string
		for _, k := range checkpoint.UniqueKeys(r.Keys) {
			m, err := scanMessage(tx.QueryRowContext(ctx, sqlRequeueKey, now, k))
			if err == nil {
				res.Requeued = append(res.Requeued, m)
				continue
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
			m, err = scanMessage(tx.QueryRowContext(ctx, sqlMessage, k))
			switch {
			case errors.Is(err, sql.ErrNoRows):
				unknown = append(unknown, k)
			case err != nil:
				return err
			default:
				res.NotDead = append(res.NotDead, m)
			}
		}
		if len(unknown) > 0 {
			return &checkpoint.UnknownMessagesError{Keys: unknown}
		}
		return insertAudits(ctx, tx, checkpoint.RequeueAudits(r.Audit, res.Requeued)...)
	})
	if err != nil {
		return checkpoint.RequeueResult{}, err
	}
	return res, nil
}
