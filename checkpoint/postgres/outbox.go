package postgres

import (
	"context"
	"errors"
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
	messageCols = `key, run_id, topic, payload, status, tries, next_at, last_error, created_at, sent_at`
	// sqlClaim takes up to $2 due messages no other transaction holds
	// (SKIP LOCKED: concurrent claimers take disjoint sets without
	// waiting) and pushes them $3 microseconds past now, in one
	// statement; the outer SELECT orders them as they were due.
	sqlClaim = `WITH due AS (
    SELECT key, next_at FROM outbox
    WHERE status = 'queued' AND next_at <= coalesce($1::timestamptz, now())
    ORDER BY next_at, key LIMIT $2
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE outbox AS o SET next_at = coalesce($1::timestamptz, now()) + $3::bigint * interval '1 microsecond'
    FROM due WHERE o.key = due.key
    RETURNING o.key, o.run_id, o.topic, o.payload, o.status, o.tries, o.next_at, o.last_error, o.created_at, o.sent_at, due.next_at AS was_due
)
SELECT ` + messageCols + ` FROM claimed ORDER BY was_due, key`
	sqlRunMessages = `SELECT ` + messageCols + ` FROM outbox WHERE run_id = $1 ORDER BY created_at, key`
	// sqlMessages lists one status ('' for all), at most $2 (NULL: all).
	sqlMessages = `SELECT ` + messageCols + ` FROM outbox WHERE ($1 = '' OR status = $1) ORDER BY created_at, key LIMIT $2`
	sqlMarkSent = `UPDATE outbox SET status = 'sent', tries = tries + 1, sent_at = coalesce($2::timestamptz, now()), last_error = ''
WHERE key = $1`
	// sqlMarkFailed counts a failed try of a message still queued (a
	// failure reported after a delivery changes nothing) and makes it dead
	// at the limit of tries.
	sqlMarkFailed = `UPDATE outbox SET tries = tries + 1, last_error = $2,
next_at = coalesce($3::timestamptz, now() + $5::bigint * interval '1 microsecond'),
status = CASE WHEN tries + 1 >= $4 THEN 'dead' ELSE 'queued' END
WHERE key = $1 AND status = 'queued' RETURNING status`
	// sqlRequeueKeys and sqlRequeueDead queue dead messages again, due at
	// $1 (NULL: now()) with no tries; nothing but a dead message changes.
	// Each is one statement: a claim in flight (FOR UPDATE SKIP LOCKED)
	// locks only queued messages, and a delivery report only changes
	// queued ones.
	sqlRequeueKeys = `UPDATE outbox SET status = 'queued', tries = 0, next_at = coalesce($1::timestamptz, now())
WHERE key = ANY($2::text[]) AND status = 'dead' RETURNING ` + messageCols
	sqlRequeueDead = `UPDATE outbox SET status = 'queued', tries = 0, next_at = coalesce($1::timestamptz, now())
WHERE status = 'dead' AND ($2 = '' OR run_id = $2) RETURNING ` + messageCols
	// sqlNamedMessages reads the messages of the given keys that the
	// requeue left alone, in the order given.
	sqlNamedMessages = `SELECT o.key, o.run_id, o.topic, o.payload, o.status, o.tries, o.next_at, o.last_error, o.created_at, o.sent_at
FROM unnest($1::text[]) WITH ORDINALITY AS k(key, n) JOIN outbox AS o ON o.key = k.key ORDER BY k.n`
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
	out, err := queryMessages(ctx, s.pool, query, args...)
	return out, s.wrap(op, err)
}

// queryMessages runs a query of messageCols on q (the pool or a
// transaction).
func queryMessages(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, query string, args ...any) ([]checkpoint.Message, error) {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
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
	return out, err
}

// ClaimMessages implements checkpoint.OutboxStore with one statement
// (FOR UPDATE SKIP LOCKED): due at now, and claimed until now+visibleFor,
// on the caller's clock (Config.CallerClock), otherwise on the server's
// now().
func (s *Store) ClaimMessages(ctx context.Context, now time.Time, n int, visibleFor time.Duration) ([]checkpoint.Message, error) {
	if err := checkpoint.CheckClaim(n, visibleFor); err != nil {
		return nil, err
	}
	return s.messages(ctx, "claim messages", sqlClaim, s.clock(now), n, visibleFor.Microseconds())
}

// Messages implements checkpoint.OutboxStore.
func (s *Store) Messages(ctx context.Context, status string, n int) ([]checkpoint.Message, error) {
	return s.messages(ctx, "list messages", sqlMessages, status, limit(n))
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

// MarkFailed implements checkpoint.OutboxStore: the message is due again
// f.RetryIn after the server's now(), as leases are (f.RetryAt, the
// dispatcher's own reading, under Config.CallerClock or when RetryIn is
// not set).
func (s *Store) MarkFailed(ctx context.Context, f checkpoint.DeliveryFailure) (bool, error) {
	if err := f.Validate(); err != nil {
		return false, err
	}
	retryAt := ts(f.RetryAt)
	if f.RetryIn > 0 && !s.cfg.CallerClock {
		retryAt = nil
	}
	var status string
	err := s.pool.QueryRow(ctx, sqlMarkFailed, f.Key, f.Error, retryAt, f.MaxTries, f.RetryIn.Microseconds()).Scan(&status)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil // no longer queued: sent or dead already
	}
	return status == checkpoint.MessageDead, s.wrap("mark message "+f.Key+" failed", err)
}

// RequeueDead implements checkpoint.OutboxStore in one transaction: one
// UPDATE queues the selected dead messages again, then the messages named
// but not dead are read, and the audit rows written; an unknown key rolls
// it all back.
func (s *Store) RequeueDead(ctx context.Context, r checkpoint.Requeue) (checkpoint.RequeueResult, error) {
	if err := r.Validate(); err != nil {
		return checkpoint.RequeueResult{}, err
	}
	var res checkpoint.RequeueResult
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		res = checkpoint.RequeueResult{}
		var err error
		if len(r.Keys) == 0 {
			res.Requeued, err = queryMessages(ctx, tx, sqlRequeueDead, s.clock(r.Now), r.RunID)
			if err != nil {
				return err
			}
		} else {
			keys := checkpoint.UniqueKeys(r.Keys)
			if res.Requeued, err = queryMessages(ctx, tx, sqlRequeueKeys, s.clock(r.Now), keys); err != nil {
				return err
			}
			done := make(map[string]bool, len(res.Requeued))
			for _, m := range res.Requeued {
				done[m.Key] = true
			}
			var rest []string
			for _, k := range keys {
				if !done[k] {
					rest = append(rest, k)
				}
			}
			if len(rest) > 0 {
				if res.NotDead, err = queryMessages(ctx, tx, sqlNamedMessages, rest); err != nil {
					return err
				}
			}
			found := make(map[string]bool, len(res.NotDead))
			for _, m := range res.NotDead {
				found[m.Key] = true
			}
			var unknown []string
			for _, k := range rest {
				if !found[k] {
					unknown = append(unknown, k)
				}
			}
			if len(unknown) > 0 {
				return &checkpoint.UnknownMessagesError{Keys: unknown}
			}
		}
		return insertAudits(ctx, tx, checkpoint.RequeueAudits(r.Audit, res.Requeued)...)
	})
	if err != nil {
		return checkpoint.RequeueResult{}, s.wrap("requeue dead messages", err)
	}
	return res, nil
}
