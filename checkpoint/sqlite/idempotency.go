package sqlite

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

const (
	// sqlBeginIdempotency inserts a key, or takes over a stale accepting
	// one of the same request; it returns a row only if it did either.
	sqlBeginIdempotency = `INSERT INTO idempotency_keys
    (key, request_hash, job, params, run_id, state, holder, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, 'accepting', ?8, ?6, ?6)
ON CONFLICT (key) DO UPDATE SET updated_at = excluded.updated_at, run_id = excluded.run_id, holder = excluded.holder
WHERE idempotency_keys.state = 'accepting' AND idempotency_keys.request_hash = excluded.request_hash
  AND idempotency_keys.updated_at < ?7
RETURNING created_at`
	sqlSelectIdempotency = `SELECT request_hash, job, params, run_id, state, created_at, updated_at
FROM idempotency_keys WHERE key = ?`
	sqlFinishIdempotency = `UPDATE idempotency_keys SET state = 'done', updated_at = ?3
WHERE key = ?1 AND holder = ?2 AND state = 'accepting'`
	sqlDropIdempotency = `DELETE FROM idempotency_keys WHERE key = ?1 AND holder = ?2 AND state = 'accepting'`
)

var _ checkpoint.IdempotencyStore = (*Store)(nil)

// BeginIdempotency implements checkpoint.IdempotencyStore.
func (s *Store) BeginIdempotency(ctx context.Context, k checkpoint.IdempotencyKey, staleBefore time.Time) (checkpoint.IdempotencyKey, bool, error) {
	op := "begin idempotency key " + k.Key
	// The holder token of this begin: only it finishes or drops the key.
	holder := rand.Text()
	// A key dropped between the insert that found it and the read is
	// tried again.
	for range 3 {
		var created sql.NullString
		err := s.db.QueryRowContext(ctx, sqlBeginIdempotency, k.Key, k.RequestHash, k.Job, string(k.Params), k.RunID,
			fmtTime(k.CreatedAt), fmtTime(staleBefore), holder).Scan(&created)
		switch {
		case err == nil:
			k.State, k.UpdatedAt, k.Holder = checkpoint.IdempotencyAccepting, k.CreatedAt, holder
			k.CreatedAt = parseTime(created)
			return k, true, nil
		case !errors.Is(err, sql.ErrNoRows):
			return checkpoint.IdempotencyKey{}, false, s.wrap(op, err)
		}
		rec := checkpoint.IdempotencyKey{Key: k.Key} // its holder stays the store's
		var params string
		var at, up sql.NullString
		err = s.db.QueryRowContext(ctx, sqlSelectIdempotency, k.Key).Scan(&rec.RequestHash, &rec.Job, &params, &rec.RunID, &rec.State, &at, &up)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return checkpoint.IdempotencyKey{}, false, s.wrap(op, err)
		}
		rec.Params, rec.CreatedAt, rec.UpdatedAt = []byte(params), parseTime(at), parseTime(up)
		return rec, false, nil
	}
	return checkpoint.IdempotencyKey{}, false, fmt.Errorf("checkpoint: %s: the key was recorded and dropped three times meanwhile", op)
}

// FinishIdempotency implements checkpoint.IdempotencyStore.
func (s *Store) FinishIdempotency(ctx context.Context, key, holder string, at time.Time) error {
	res, err := s.db.ExecContext(ctx, sqlFinishIdempotency, key, holder, fmtTime(at))
	if err != nil {
		return s.wrap("finish idempotency key "+key, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return s.wrap("finish idempotency key "+key, err)
	} else if n == 0 {
		return &checkpoint.IdempotencyLostError{Key: key, Holder: holder}
	}
	return nil
}

// DropIdempotency implements checkpoint.IdempotencyStore.
func (s *Store) DropIdempotency(ctx context.Context, key, holder string) error {
	_, err := s.db.ExecContext(ctx, sqlDropIdempotency, key, holder)
	return s.wrap("drop idempotency key "+key, err)
}
