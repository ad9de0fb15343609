package steps_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/steps"
)

// bumpStore is the real store with one fault: after each partition
// transaction that recorded a chunk plan commits, another writer moves
// account B's version (while bumps last; -1: for ever), so that plan is
// stale before it applies.
type bumpStore struct {
	checkpoint.Backend
	target *sql.DB
	mu     sync.Mutex
	bumps  int
	bumped int
}

func (s *bumpStore) InPartitionTx(ctx context.Context, w checkpoint.PartitionWrite, fn func(checkpoint.Tx) error) error {
	planned := false
	err := s.Backend.InPartitionTx(ctx, w, func(tx checkpoint.Tx) error {
		return fn(planTx{Tx: tx, planned: &planned})
	})
	if err != nil || !planned {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bumps >= 0 && s.bumped >= s.bumps {
		return nil
	}
	s.bumped++
	if _, berr := s.target.Exec(`UPDATE accounts SET version = version + 1 WHERE id = 'B'`); berr != nil {
		return fmt.Errorf("the other writer: %w", berr)
	}
	return nil
}

type planTx struct {
	checkpoint.Tx
	planned *bool
}

func (tx planTx) PutChunkPlan(p checkpoint.ChunkPlan) error {
	*tx.planned = true
	return tx.Tx.PutChunkPlan(p)
}

// A partition's chunk on a separate target that runs out of re-plans
// under contention does not fail its partition (and so its run, for an
// operator): the partition is handed back and claimed again after a
// pause, and the step succeeds once the other writer lets it, each item
// applied once. Contention that never ends fails the step after the
// store retry policy's tries with a *steps.ContendedError (a transient
// error, which the runner tries again from the checkpoints), nothing
// applied twice.
func TestContendedPartitionIsHandedBackNotFailed(t *testing.T) {
	// Not parallel: it shortens PartitionReplanTime for the package.
	t.Cleanup(steps.SetPartitionReplanTime(time.Nanosecond))
	for _, tc := range []struct {
		name  string
		bumps int
	}{{"contention-ends", steps.MaxReplans + 3}, {"contention-never-ends", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			storeLoc, targetLoc := checkpointtest.SeparateLocations(t)
			st := checkpointtest.OpenLocation(t, storeLoc)
			ledger(t, targetLoc, map[string]int64{"A": 1000, "B": 0})
			hook := &bumpStore{Backend: st, target: checkpointtest.SQL(t, targetLoc), bumps: tc.bumps}
			c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: "j/contended", Job: "j", RunKey: "k", Params: []byte("{}"), ParamsHash: "h",
				Owner: "test:1", Now: time.Now(), LeaseFor: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			var log bytes.Buffer // read once ForEach has joined the partitions' goroutines
			logger := zerolog.New(zerolog.SyncWriter(&log))
			run, err := steps.Begin(ctx, steps.Config{Store: hook, Lease: c.Lease, Logger: &logger,
				Sleep: func(ctx context.Context, _ time.Duration) error { return ctx.Err() }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { run.Close() })
			var items []xfer
			for i := range 8 {
				items = append(items, xfer{ID: fmt.Sprintf("T-%d", i), From: "A", To: "B", Amount: 10})
			}
			sum, err := steps.ForEach(ctx, run, "post", steps.Slice(items, xferKey), post,
				steps.WithTarget(steps.Target{Location: targetLoc, Table: accountsTable}), steps.ChunkSize(4), steps.Partitions(2))
			applied := sum.Completed
			if tc.bumps >= 0 {
				if err != nil || applied != 8 {
					t.Fatalf("ForEach: %+v, %v; want all 8 transfers completed once the other writer stopped", sum, err)
				}
				if !strings.Contains(log.String(), "ran out of re-plans under contention; the partition is claimed again") {
					t.Errorf("no partition was handed back after running out of re-plans; log:\n%s", log.String())
				}
			} else {
				var contended *steps.ContendedError
				var conflict *checkpoint.VersionConflictError
				if !errors.As(err, &contended) || !errors.Is(err, checkpoint.ErrTransient) || !errors.As(err, &conflict) ||
					!strings.Contains(err.Error(), "re-planned") || !strings.Contains(err.Error(), "handed back") {
					t.Fatalf("ForEach under endless contention: %v; want a *steps.ContendedError, transient, wrapping the conflict", err)
				}
				applied = 0
				parts, perr := st.Partitions(ctx, "j/contended", "post")
				if perr != nil {
					t.Fatal(perr)
				}
				for _, p := range parts {
					if p.State == checkpoint.PartitionFailed {
						t.Errorf("partition %d failed (%s); want it handed back", p.Index, p.Error)
					}
					applied += p.Done
				}
			}
			// Each completed transfer moved 10 from A to B exactly once.
			if a, _ := balance(t, targetLoc, "A"); a != 1000-10*applied {
				t.Errorf("A = %d; want %d: %d transfers applied once", a, 1000-10*applied, applied)
			}
			if b, _ := balance(t, targetLoc, "B"); b != 10*applied {
				t.Errorf("B = %d; want %d", b, 10*applied)
			}
		})
	}
}
