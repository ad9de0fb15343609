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
	// Scope is whose key it is (the API's caller): a key is recorded,
	// replayed and refused within its scope only, so two callers that
	// pick the same Key make two independent requests. The empty scope
	// holds the keys recorded before keys were scoped (no caller has it).
	Scope string
	Key   string
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
	Scope  string
	Key    string
	Holder string
}

func (e *IdempotencyLostError) Error() string {
	return fmt.Sprintf("checkpoint: idempotency key %q of scope %q is no longer accepting for this request: "+
		"another request with the key took it over (this one was slower than the accept timeout), or it was dropped", e.Key, e.Scope)
}

// IdempotencyStore keeps the Idempotency-Keys of the requests that
// started runs.
type IdempotencyStore interface {
	// BeginIdempotency records k as accepting, unless k.Key is recorded
	// in k.Scope: then it returns the recorded key and begun false (the
	// same Key in another scope is another key). A recorded key
	// still accepting with the same RequestHash whose UpdatedAt is before
	// staleBefore (the process accepting it died) is taken over: it
	// becomes k, and begun is true. Begun, rec.Holder is a new token
	// (k.Holder is ignored) to give FinishIdempotency and DropIdempotency.
	BeginIdempotency(ctx context.Context, k IdempotencyKey, staleBefore time.Time) (rec IdempotencyKey, begun bool, err error)
	// FinishIdempotency marks the key k.Key of k.Scope done at at, if it
	// is accepting for k.Holder (k is the record BeginIdempotency returned
	// begun; its other fields are not read); otherwise (taken over,
	// dropped, done) it changes nothing and returns an
	// *IdempotencyLostError.
	FinishIdempotency(ctx context.Context, k IdempotencyKey, at time.Time) error
	// DropIdempotency forgets the key k.Key of k.Scope if it is still
	// accepting for k.Holder (k as for FinishIdempotency): its request
	// failed before it was accepted, so that a retry is processed anew. A
	// done key stays, and so does one another request took over (nothing
	// is dropped, and no error).
	DropIdempotency(ctx context.Context, k IdempotencyKey) error
}
