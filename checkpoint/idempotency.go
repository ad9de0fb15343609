package checkpoint

import (
	"context"
	"fmt"
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
	// Holder is the token of the request accepting the key, unique to
	// each BeginIdempotency that began it (a takeover gets a new one):
	// FinishIdempotency and DropIdempotency act only for their holder, so
	// a request whose key was taken over can neither forget it nor mark
	// it done. Set by BeginIdempotency when begun; empty in a record
	// returned not begun.
	Holder    string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// IdempotencyLostError is returned by FinishIdempotency when the key is
// no longer accepting for this holder: another request took it over (this
// one took longer than the accept timeout) or it is gone. The request
// that gets it did not record the key's answer.
type IdempotencyLostError struct {
	Key    string
	Holder string
}

func (e *IdempotencyLostError) Error() string {
	return fmt.Sprintf("checkpoint: idempotency key %q is no longer accepting for this request: "+
		"another request with the key took it over (this one was slower than the accept timeout), or it was dropped", e.Key)
}

// IdempotencyStore keeps the Idempotency-Keys of the requests that
// started runs.
type IdempotencyStore interface {
	// BeginIdempotency records k as accepting, unless k.Key is recorded:
	// then it returns the recorded key and begun false. A recorded key
	// still accepting with the same RequestHash whose UpdatedAt is before
	// staleBefore (the process accepting it died) is taken over: it
	// becomes k, and begun is true. Begun, rec.Holder is a new token
	// (k.Holder is ignored) to give FinishIdempotency and DropIdempotency.
	BeginIdempotency(ctx context.Context, k IdempotencyKey, staleBefore time.Time) (rec IdempotencyKey, begun bool, err error)
	// FinishIdempotency marks the key done at at, if it is accepting for
	// holder; otherwise (taken over, dropped, done) it changes nothing and
	// returns an *IdempotencyLostError.
	FinishIdempotency(ctx context.Context, key, holder string, at time.Time) error
	// DropIdempotency forgets a key still accepting for holder, whose
	// request failed before it was accepted, so that a retry is processed
	// anew. A done key stays, and so does one another request took over
	// (nothing is dropped, and no error).
	DropIdempotency(ctx context.Context, key, holder string) error
}
