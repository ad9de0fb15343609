package checkpoint

import (
	"context"
	"time"
)

// States of an IdempotencyKey.
const (
	// IdempotencyAccepting: the key's first request is being accepted
	// (its run is being created); another request with the key waits for
	// it to finish (HTTP 409).
	IdempotencyAccepting = "accepting"
	// IdempotencyDone: the key's request was accepted; a replay answers
	// with the run it named.
	IdempotencyDone = "done"
)

// IdempotencyKey is one Idempotency-Key an API client sent with a request
// that starts a run, kept so a replay, even after a restart, answers with
// the same run and a reuse of the key for another request is refused.
type IdempotencyKey struct {
	Key string
	// RequestHash fingerprints the request (its job and canonical
	// parameters): the same key with another fingerprint is another
	// request.
	RequestHash string
	Job         string
	Params      []byte // canonical JSON, to name the first request in refusals
	RunID       string
	State       string // IdempotencyAccepting or IdempotencyDone
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// IdempotencyStore keeps the Idempotency-Keys of the requests that
// started runs.
type IdempotencyStore interface {
	// BeginIdempotency records k as accepting, unless k.Key is recorded:
	// then it returns the recorded key and begun false. A recorded key
	// still accepting with the same RequestHash whose UpdatedAt is before
	// staleBefore (the process accepting it died) is taken over: it
	// becomes k, and begun is true.
	BeginIdempotency(ctx context.Context, k IdempotencyKey, staleBefore time.Time) (rec IdempotencyKey, begun bool, err error)
	// FinishIdempotency marks an accepting key done at at.
	FinishIdempotency(ctx context.Context, key string, at time.Time) error
	// DropIdempotency forgets a key still accepting, whose request failed
	// before it was accepted, so that a retry is processed anew. A done
	// key stays.
	DropIdempotency(ctx context.Context, key string) error
}
