// Package idem holds the rule both checkpoint backends keep when an
// idempotency key is begun (checkpoint.IdempotencyStore.BeginIdempotency);
// only their SQL and time types differ.
package idem

import (
	"crypto/rand"
	"fmt"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// Begin begins k: insert records it under a fresh holder token (only that
// begin finishes or drops the key), and reports ok false when a live
// record already holds the key; read then returns that record, or ok false
// when it was dropped meanwhile, and the insert is tried again, three
// times in all. Both functions return errors already named for the
// backend; op names the operation in the error when the key kept being
// recorded and dropped.
func Begin(op string, k checkpoint.IdempotencyKey,
	insert func(holder string) (created time.Time, ok bool, err error),
	read func() (rec checkpoint.IdempotencyKey, ok bool, err error),
) (checkpoint.IdempotencyKey, bool, error) {
	holder := rand.Text()
	for range 3 {
		created, ok, err := insert(holder)
		if err != nil {
			return checkpoint.IdempotencyKey{}, false, err
		}
		if ok {
			k.State, k.UpdatedAt, k.Holder = checkpoint.IdempotencyAccepting, k.CreatedAt, holder
			k.CreatedAt = created
			return k, true, nil
		}
		rec, ok, err := read()
		if err != nil {
			return checkpoint.IdempotencyKey{}, false, err
		}
		if ok {
			return rec, false, nil
		}
	}
	return checkpoint.IdempotencyKey{}, false, fmt.Errorf("checkpoint: %s: the key was recorded and dropped three times meanwhile", op)
}
