package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
)

// written counts what a run holds: steps, items, outbox messages and
// chunk plans, read through the store.
func written(t *testing.T, st *postgres.Store, runID string) (steps, items, messages, plans int) {
	t.Helper()
	ctx := context.Background()
	if err := st.Steps(ctx, runID, func(checkpoint.Step) error { steps++; return nil }); err != nil {
		t.Fatal(err)
	}
	counts, err := st.ItemCounts(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range counts {
		items += int(c.Count)
	}
	ms, err := st.RunMessages(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.RunChunkPlans(ctx, runID, checkpoint.Page{}, func(checkpoint.ChunkPlan) error { plans++; return nil }); err != nil {
		t.Fatal(err)
	}
	return steps, items, len(ms), plans
}

func step(id, output string) checkpoint.Step {
	return checkpoint.Step{ID: id, Status: checkpoint.StepCompleted, Output: []byte(output), StartedAt: t0, FinishedAt: t0}
}

// TestDeferredPutStepAfterRecover: a lone step checkpoint is sent when fn
// returns, so a recover made while fn runs does not wait for it; the
// checkpoint then fails with ErrFenced, naming both fences, and writes
// nothing.
func TestDeferredPutStepAfterRecover(t *testing.T) {
	st, url := openFresh(t)
	ops := open(t, postgres.Config{URL: url, CallerClock: true})
	ctx := context.Background()
	c := mustClaim(t, st, claimReq("settle/2026-11-28", "host-a:1", t0))
	err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(step("load", `1`)); err != nil {
			return err
		}
		// The operator on another host: it must not wait for us.
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := ops.Recover(rctx, opAudit(c.Lease.RunID, "recover", t0.Add(time.Second)), t0.Add(time.Second), true); err != nil {
			t.Errorf("recover while a lone checkpoint is queued: %v; want it done at once", err)
		}
		return nil
	})
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("the lone checkpoint after the recover: %v; want ErrFenced", err)
	}
	if !strings.Contains(err.Error(), "is at fence 2, this attempt (1) holds fence 1") {
		t.Errorf("fenced error %q does not name both fences", err)
	}
	if s, _, _, _ := written(t, st, c.Lease.RunID); s != 0 {
		t.Errorf("%d steps written by the fenced checkpoint; want none", s)
	}
}

// TestLoneBatchFencedWritesNothing: every kind of queued write, sent in
// the one batch under a lease another claim took, leaves nothing.
func TestLoneBatchFencedWritesNothing(t *testing.T) {
	st, _ := openFresh(t)
	ctx := context.Background()
	old := mustClaim(t, st, claimReq("settle/2026-11-28", "host-a:1", t0))
	mustClaim(t, st, claimReq("settle/2026-11-28", "host-b:2", t0.Add(2*time.Minute)))
	err := st.InTx(ctx, old.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(step("load", `1`)); err != nil {
			return err
		}
		if err := tx.PutItems([]checkpoint.Item{{Step: "post", Key: "T-1", Status: checkpoint.StepCompleted, Output: []byte(`{}`)}}); err != nil {
			return err
		}
		if err := tx.Enqueue(checkpoint.Message{Key: "settle/2026-11-28/n", Topic: "done", Payload: []byte(`{}`), CreatedAt: t0}); err != nil {
			return err
		}
		return tx.PutChunkPlan(checkpoint.ChunkPlan{Step: "post", EffectID: "e1", Plan: []byte(`{}`)})
	})
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("queued writes under a lost lease: %v; want ErrFenced", err)
	}
	if s, i, m, p := written(t, st, old.Lease.RunID); s+i+m+p != 0 {
		t.Errorf("fenced batch left %d steps, %d items, %d messages, %d chunk plans; want nothing", s, i, m, p)
	}
}

// TestLoneBatchMissingRun: a lease of a run that is not there is
// ErrNotFound, as from an explicit transaction.
func TestLoneBatchMissingRun(t *testing.T) {
	st, _ := openFresh(t)
	err := st.InTx(context.Background(), checkpoint.Lease{RunID: "settle/none", Attempt: 1, Fence: 1}, func(tx checkpoint.Tx) error {
		return tx.PutStep(step("load", `1`))
	})
	if !errors.Is(err, checkpoint.ErrNotFound) || !strings.Contains(err.Error(), "run settle/none is not in") {
		t.Errorf("a lone checkpoint of a missing run: %v; want ErrNotFound naming it", err)
	}
}

// TestLoneBatchFailingStatementRollsBackAll: the batch is one implicit
// transaction. A statement failing after the first (a chunk plan recorded
// twice, or a step checkpoint in conflict) leaves the first's row absent,
// and InTx reports the failing call's error.
func TestLoneBatchFailingStatementRollsBackAll(t *testing.T) {
	st, _ := openFresh(t)
	ctx := context.Background()
	c := mustClaim(t, st, claimReq("settle/2026-11-28", "host-a:1", t0))
	if err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(step("done", `1`)); err != nil {
			return err
		}
		return tx.PutChunkPlan(checkpoint.ChunkPlan{Step: "post", EffectID: "e1", Plan: []byte(`{}`)})
	}); err != nil {
		t.Fatal(err)
	}
	if s, _, _, p := written(t, st, c.Lease.RunID); s != 1 || p != 1 {
		t.Fatalf("after the first batch: %d steps, %d chunk plans; want 1 and 1", s, p)
	}

	err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(step("first", `2`)); err != nil {
			return err
		}
		return tx.PutChunkPlan(checkpoint.ChunkPlan{Step: "post", EffectID: "e1", Plan: []byte(`{}`)})
	})
	if err == nil || !strings.Contains(err.Error(), "chunk_plans_pkey") {
		t.Errorf("a chunk plan recorded twice: %v; want the unique violation", err)
	}

	err = st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(step("first", `2`)); err != nil {
			return err
		}
		if err := tx.Enqueue(checkpoint.Message{Key: "settle/2026-11-28/n", Topic: "done", Payload: []byte(`{}`), CreatedAt: t0}); err != nil {
			return err
		}
		return tx.PutStep(step("done", `"other"`))
	})
	var conflict *checkpoint.StepConflictError
	if !errors.As(err, &conflict) || conflict.StepID != "done" {
		t.Errorf("a lone batch with a conflicting checkpoint: %v; want *StepConflictError of done", err)
	}

	if s, _, m, p := written(t, st, c.Lease.RunID); s != 1 || m != 0 || p != 1 {
		t.Errorf("after the failed batches: %d steps, %d messages, %d chunk plans; want only the first batch's (1, 0, 1)", s, m, p)
	}
}

// TestLoneBatchAcceptsOwnEarlierCommit: a queued checkpoint of a finished
// step with the same content (our own commit whose acknowledgement was
// lost) is accepted, and the writes beside it commit.
func TestLoneBatchAcceptsOwnEarlierCommit(t *testing.T) {
	st, _ := openFresh(t)
	ctx := context.Background()
	c := mustClaim(t, st, claimReq("settle/2026-11-28", "host-a:1", t0))
	put := func(tx checkpoint.Tx) error { return tx.PutStep(step("done", `1`)) }
	if err := st.InTx(ctx, c.Lease, put); err != nil {
		t.Fatal(err)
	}
	err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		if err := put(tx); err != nil {
			return err
		}
		return tx.PutItems([]checkpoint.Item{{Step: "post", Key: "T-1", Status: checkpoint.StepCompleted, Output: []byte(`{}`)}})
	})
	if err != nil {
		t.Fatalf("the same checkpoint again, with an item: %v; want it accepted", err)
	}
	if s, i, _, _ := written(t, st, c.Lease.RunID); s != 1 || i != 1 {
		t.Errorf("after the repeated checkpoint: %d steps, %d items; want 1 and 1", s, i)
	}
	// A finished item given again is refused, naming it, and the step
	// queued before it is not kept.
	err = st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(step("next", `1`)); err != nil {
			return err
		}
		return tx.PutItems([]checkpoint.Item{{Step: "post", Key: "T-1", Status: checkpoint.StepCompleted, Output: []byte(`{"again":1}`)}})
	})
	if !errors.Is(err, checkpoint.ErrItemFinished) || !strings.Contains(err.Error(), "post/T-1") {
		t.Errorf("a finished item queued again: %v; want ErrItemFinished naming post/T-1", err)
	}
	if s, _, _, _ := written(t, st, c.Lease.RunID); s != 1 {
		t.Errorf("%d steps after the refused items; want 1 (next rolled back)", s)
	}
}

// TestQueuedWritesGoFirst: a call that needs a result sends the writes
// queued before it first, in one explicit transaction with its own: a
// target read sees nothing new, and a failure later rolls back the queued
// writes too.
func TestQueuedWritesGoFirst(t *testing.T) {
	st, _ := openFresh(t)
	ctx := context.Background()
	c := mustClaim(t, st, claimReq("settle/2026-11-28", "host-a:1", t0))
	boom := errors.New("boom")
	err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(step("load", `1`)); err != nil {
			return err
		}
		conn, err := postgres.Conn(tx)
		if err != nil {
			return err
		}
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM steps WHERE run_id = $1`, c.Lease.RunID).Scan(&n); err != nil {
			return err
		}
		if n != 1 {
			t.Errorf("the transaction sees %d steps after Conn; want the queued one", n)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx: %v; want fn's error", err)
	}
	if s, _, _, _ := written(t, st, c.Lease.RunID); s != 0 {
		t.Errorf("%d steps after fn failed; want the queued one rolled back", s)
	}
	// fn failing before anything is sent sends nothing.
	err = st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(step("load", `1`)); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx: %v; want fn's error", err)
	}
	if s, _, _, _ := written(t, st, c.Lease.RunID); s != 0 {
		t.Errorf("%d steps after fn failed with only queued writes; want none", s)
	}
}
