package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/internal/idem"
)

const (
	// sqlBeginIdempotency inserts a key, or takes over a stale accepting
	// one of the same request; it returns a row only if it did either.
	sqlBeginIdempotency = `INSERT INTO idempotency_keys AS k
    (scope, key, request_hash, job, params, run_id, state, holder, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, 'accepting', $9, $7, $7)
ON CONFLICT (scope, key) DO UPDATE SET updated_at = excluded.updated_at, run_id = excluded.run_id, holder = excluded.holder
WHERE k.state = 'accepting' AND k.request_hash = excluded.request_hash AND k.updated_at < $8
RETURNING created_at`
	sqlSelectIdempotency = `SELECT request_hash, job, params, run_id, state, created_at, updated_at
FROM idempotency_keys WHERE scope = $1 AND key = $2`
	sqlFinishIdempotency = `UPDATE idempotency_keys SET state = 'done', updated_at = $4
WHERE scope = $1 AND key = $2 AND holder = $3 AND state = 'accepting'`
	sqlDropIdempotency = `DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2 AND holder = $3 AND state = 'accepting'`
)

var _ checkpoint.IdempotencyStore = (*Store)(nil)

// BeginIdempotency implements checkpoint.IdempotencyStore.
func (s *Store) BeginIdempotency(ctx context.Context, k checkpoint.IdempotencyKey, staleBefore time.Time) (checkpoint.IdempotencyKey, bool, error) {
	op := fmt.Sprintf("begin idempotency key %q of scope %q", k.Key, k.Scope)
	insert := func(holder string) (time.Time, bool, error) {
		var created pgtype.Timestamptz
		err := s.pool.QueryRow(ctx, sqlBeginIdempotency, k.Scope, k.Key, k.RequestHash, k.Job, string(k.Params), k.RunID,
			ts(k.CreatedAt), ts(staleBefore), holder).Scan(&created)
		if errors.Is(err, pgx.ErrNoRows) {
			return time.Time{}, false, nil // a live record holds the key
		}
		return tm(created), err == nil, s.wrap(op, err)
	}
	read := func() (checkpoint.IdempotencyKey, bool, error) {
		rec := checkpoint.IdempotencyKey{Scope: k.Scope, Key: k.Key} // its holder stays the store's
		var params string
		var at, up pgtype.Timestamptz
		err := s.pool.QueryRow(ctx, sqlSelectIdempotency, k.Scope, k.Key).Scan(&rec.RequestHash, &rec.Job, &params, &rec.RunID, &rec.State, &at, &up)
		if errors.Is(err, pgx.ErrNoRows) {
			return rec, false, nil // dropped meanwhile
		}
		rec.Params, rec.CreatedAt, rec.UpdatedAt = []byte(params), tm(at), tm(up)
		return rec, err == nil, s.wrap(op, err)
	}
	return idem.Begin(op, k, insert, read)
}

// FinishIdempotency implements checkpoint.IdempotencyStore.
func (s *Store) FinishIdempotency(ctx context.Context, k checkpoint.IdempotencyKey, at time.Time) error {
	tag, err := s.pool.Exec(ctx, sqlFinishIdempotency, k.Scope, k.Key, k.Holder, ts(at))
	if err != nil {
		return s.wrap(fmt.Sprintf("finish idempotency key %q of scope %q", k.Key, k.Scope), err)
	}
	if tag.RowsAffected() == 0 {
		return &checkpoint.IdempotencyLostError{Scope: k.Scope, Key: k.Key, Holder: k.Holder}
	}
	return nil
}

// DropIdempotency implements checkpoint.IdempotencyStore.
func (s *Store) DropIdempotency(ctx context.Context, k checkpoint.IdempotencyKey) error {
	_, err := s.pool.Exec(ctx, sqlDropIdempotency, k.Scope, k.Key, k.Holder)
	return s.wrap(fmt.Sprintf("drop idempotency key %q of scope %q", k.Key, k.Scope), err)
}
