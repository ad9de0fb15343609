package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

func steps(t *testing.T, st interface {
	Steps(context.Context, string, func(checkpoint.Step) error) error
}, runID string) []checkpoint.Step {
	t.Helper()
	var out []checkpoint.Step
	if err := st.Steps(context.Background(), runID, func(s checkpoint.Step) error { out = append(out, s); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestPutStepIdempotentConflictAndRetry(t *testing.T) {
	st, _ := openFresh(t)
	ctx := context.Background()
	c := mustClaim(t, st, claimReq("settle/2026-11-28", "a:1", t0))
	put := func(s checkpoint.Step) error {
		return st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error { return tx.PutStep(s) })
	}
	load := checkpoint.Step{ID: "load", Status: checkpoint.StepCompleted, Output: []byte(`{"n":3}`), InputHash: "i1",
		Tries: 1, StartedAt: t0, FinishedAt: t0.Add(time.Second), Plan: []byte(`{"writes":[]}`)}
	if err := put(load); err != nil {
		t.Fatal(err)
	}
	// The same content again is our own lost acknowledgement: success.
	if err := put(load); err != nil {
		t.Fatalf("identical PutStep: %v", err)
	}
	changed := load
	changed.Output = []byte(`{"n":4}`)
	var conflict *checkpoint.StepConflictError
	if err := put(changed); !errors.As(err, &conflict) || conflict.StepID != "load" || conflict.Status != checkpoint.StepCompleted {
		t.Fatalf("PutStep with other content: %v; want StepConflictError", err)
	}
	// A failed try is replaced by the next one.
	fail := checkpoint.Step{ID: "post", Status: checkpoint.StepFailed, Error: "timeout", Tries: 1, StartedAt: t0.Add(2 * time.Second), FinishedAt: t0.Add(3 * time.Second)}
	if err := put(fail); err != nil {
		t.Fatal(err)
	}
	done := checkpoint.Step{ID: "post", Status: checkpoint.StepCompleted, Output: nil, Tries: 2, StartedAt: t0.Add(2 * time.Second), FinishedAt: t0.Add(4 * time.Second)}
	if err := put(done); err != nil {
		t.Fatal(err)
	}
	got := steps(t, st, c.Lease.RunID)
	if len(got) != 2 || got[0].ID != "load" || got[1].ID != "post" {
		t.Fatalf("steps = %+v", got)
	}
	g := got[0]
	if !bytes.Equal(g.Output, load.Output) || g.InputHash != "i1" || g.Attempt != 1 || !g.StartedAt.Equal(t0) ||
		!g.FinishedAt.Equal(t0.Add(time.Second)) || string(g.Plan) != `{"writes":[]}` || g.RunID != c.Lease.RunID {
		t.Fatalf("load read back as %+v", g)
	}
	if p := got[1]; p.Status != checkpoint.StepCompleted || p.Tries != 2 || p.Output != nil || p.Error != "" {
		t.Fatalf("post read back as %+v", p)
	}
	// ResetStep removes a checkpoint so the step runs again.
	if err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error { return tx.ResetStep("post") }); err != nil {
		t.Fatal(err)
	}
	if got := steps(t, st, c.Lease.RunID); len(got) != 1 {
		t.Fatalf("after reset: %+v", got)
	}
}

func TestInTxRollsBackOnError(t *testing.T) {
	st, _ := openFresh(t)
	ctx := context.Background()
	c := mustClaim(t, st, claimReq("settle/2026-11-28", "a:1", t0))
	boom := errors.New("boom")
	err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(checkpoint.Step{ID: "a", Status: checkpoint.StepCompleted, StartedAt: t0, FinishedAt: t0}); err != nil {
			return err
		}
		if err := tx.PutItems([]checkpoint.Item{{Step: "b", Key: "k", Status: checkpoint.StepCompleted}}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx = %v, want fn's error", err)
	}
	if got := steps(t, st, c.Lease.RunID); len(got) != 0 {
		t.Fatalf("steps after a rolled back InTx: %+v", got)
	}
	counts, err := st.ItemCounts(ctx, c.Lease.RunID)
	if err != nil || len(counts) != 0 {
		t.Fatalf("item counts after a rolled back InTx: %v, %v", counts, err)
	}
	// A fenced write rolls back even when fn swallows the error.
	b := mustClaim(t, st, claimReq("settle/2026-11-28", "b:2", t0.Add(time.Hour)))
	err = st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		_ = tx.PutItems([]checkpoint.Item{{Step: "b", Key: "k", Status: checkpoint.StepCompleted}})
		return nil
	})
	if !errors.Is(err, checkpoint.ErrFenced) || !strings.Contains(err.Error(), "fence 2") {
		t.Fatalf("InTx of a fenced lease whose fn ignores the error: %v; want ErrFenced naming fence 2", err)
	}
	if counts, _ := st.ItemCounts(ctx, b.Lease.RunID); len(counts) != 0 {
		t.Fatalf("a fenced write left items: %v", counts)
	}
}

func TestItemsChunkPlansAndCounts(t *testing.T) {
	st, _ := openFresh(t)
	ctx := context.Background()
	c := mustClaim(t, st, claimReq("settle/2026-11-28", "a:1", t0))
	runID := c.Lease.RunID
	fp := func(s string) []byte { return []byte(s + "-fingerprint-16b")[:16] }
	err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutChunkPlan(checkpoint.ChunkPlan{Step: "post", EffectID: "e1", Plan: []byte(`{"p":1}`)}); err != nil {
			return err
		}
		return tx.PutItems([]checkpoint.Item{
			{Step: "post", Key: "T-1", Status: checkpoint.StepPlanned, Chunk: "e1", Fingerprint: fp("a")},
			{Step: "post", Key: "T-2", Status: checkpoint.StepPlanned, Chunk: "e1", Fingerprint: fp("b")},
			{Step: "post", Key: "T-3", Status: checkpoint.StepRejected, Output: []byte(`"insufficient funds"`), Error: "insufficient funds"},
			// Given twice: the last content wins, as sequential writes leave it.
			{Step: "post", Key: "T-4", Status: checkpoint.StepPlanned, Chunk: "e1"},
			{Step: "post", Key: "T-4", Status: checkpoint.ItemSkipped, Error: "bad row"},
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	plans, err := st.ChunkPlans(ctx, runID, "post")
	if err != nil || len(plans) != 1 || plans[0].EffectID != "e1" || string(plans[0].Plan) != `{"p":1}` {
		t.Fatalf("chunk plans = %+v, %v", plans, err)
	}
	// A re-plan supersedes e1 and takes over its planned items; finishing
	// it completes them.
	err = st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutChunkPlan(checkpoint.ChunkPlan{Step: "post", EffectID: "e2", Plan: []byte(`{"p":2}`), Supersedes: "e1"}); err != nil {
			return err
		}
		return tx.FinishChunk("post", "e2")
	})
	if err != nil {
		t.Fatal(err)
	}
	if plans, err := st.ChunkPlans(ctx, runID, "post"); err != nil || plans != nil {
		t.Fatalf("chunk plans after finishing = %+v, %v; want none planned", plans, err)
	}
	read := func(q checkpoint.ItemQuery) []checkpoint.Item {
		t.Helper()
		q.RunID, q.Step = runID, "post"
		var out []checkpoint.Item
		if err := st.Items(ctx, q, func(it checkpoint.Item) error { out = append(out, it); return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	all := read(checkpoint.ItemQuery{})
	if len(all) != 4 {
		t.Fatalf("items = %+v", all)
	}
	if a := all[0]; a.Key != "T-1" || a.Status != checkpoint.StepCompleted || a.Chunk != "e2" || !bytes.Equal(a.Fingerprint, fp("a")) || a.Attempt != 1 {
		t.Fatalf("T-1 = %+v", a)
	}
	if r := all[2]; r.Status != checkpoint.StepRejected || string(r.Output) != `"insufficient funds"` || r.Fingerprint != nil {
		t.Fatalf("T-3 = %+v", r)
	}
	if s := all[3]; s.Status != checkpoint.ItemSkipped || s.Error != "bad row" {
		t.Fatalf("T-4 = %+v", s)
	}
	if got := read(checkpoint.ItemQuery{Keys: []string{"T-3", "T-9", "T-1"}, KeysOnly: true}); len(got) != 2 || got[0].Key != "T-1" || got[1].Key != "T-3" || got[1].Output != nil {
		t.Fatalf("by keys = %+v", got)
	}
	if got := read(checkpoint.ItemQuery{From: "T-2", To: "T-3"}); len(got) != 2 || got[0].Key != "T-2" {
		t.Fatalf("range = %+v", got)
	}
	if got := read(checkpoint.ItemQuery{Status: checkpoint.StepCompleted, After: "T-1", Limit: 5}); len(got) != 1 || got[0].Key != "T-2" {
		t.Fatalf("completed after T-1 = %+v", got)
	}
	if got := read(checkpoint.ItemQuery{KeysOnly: true, Last: true, Limit: 1}); len(got) != 1 || got[0].Key != "T-4" {
		t.Fatalf("last key = %+v", got)
	}
	counts, err := st.ItemCounts(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	want := []checkpoint.ItemCount{{Step: "post", Status: "completed", Count: 2}, {Step: "post", Status: "rejected", Count: 1}, {Step: "post", Status: "skipped", Count: 1}}
	if len(counts) != len(want) {
		t.Fatalf("counts = %+v, want %+v", counts, want)
	}
	for i := range want {
		if counts[i] != want[i] {
			t.Fatalf("counts = %+v, want %+v", counts, want)
		}
	}

	// A finished item is never written again: the whole chunk is refused,
	// naming it, and nothing of the chunk is kept.
	err = st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		return tx.PutItems([]checkpoint.Item{
			{Step: "post", Key: "T-5", Status: checkpoint.StepCompleted},
			{Step: "post", Key: "T-1", Status: checkpoint.StepCompleted},
		})
	})
	if !errors.Is(err, checkpoint.ErrItemFinished) || !strings.Contains(err.Error(), "post/T-1") {
		t.Fatalf("rewriting a finished item: %v; want ErrItemFinished naming post/T-1", err)
	}
	if got := read(checkpoint.ItemQuery{Keys: []string{"T-5"}}); len(got) != 0 {
		t.Fatalf("a refused chunk left %+v", got)
	}
	// Finished earlier in the same transaction: refused too.
	err = st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutItems([]checkpoint.Item{{Step: "post", Key: "T-6", Status: checkpoint.StepCompleted}}); err != nil {
			return err
		}
		return tx.PutItems([]checkpoint.Item{{Step: "post", Key: "T-6", Status: checkpoint.StepFailed}})
	})
	if !errors.Is(err, checkpoint.ErrItemFinished) {
		t.Fatalf("rewriting an item finished in the same transaction: %v; want ErrItemFinished", err)
	}
	if got := read(checkpoint.ItemQuery{Keys: []string{"T-6"}}); len(got) != 0 {
		t.Fatalf("a refused chunk left %+v", got)
	}

	// Accepting changed items replaces fingerprints only, with an audit row.
	err = st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		return tx.AcceptItemChanges(checkpoint.Audit{RunID: runID, At: t0, Operator: "ops", Command: "accept-changed", Reason: "source fixed"},
			[]checkpoint.Item{{Step: "post", Key: "T-1", Fingerprint: fp("z")}}, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := read(checkpoint.ItemQuery{Keys: []string{"T-1"}}); !bytes.Equal(got[0].Fingerprint, fp("z")) || got[0].Status != checkpoint.StepCompleted {
		t.Fatalf("accepted T-1 = %+v", got[0])
	}
	var audits int
	if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM audit WHERE run_id = $1 AND command = 'accept-changed'`, runID).Scan(&audits); err != nil || audits != 1 {
		t.Fatalf("audit rows %d, %v", audits, err)
	}
	err = st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		return tx.AcceptItemChanges(checkpoint.Audit{RunID: runID, At: t0, Operator: "ops", Command: "accept-changed"},
			[]checkpoint.Item{{Step: "post", Key: "T-404"}}, nil)
	})
	if !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("accepting an unrecorded item: %v; want ErrNotFound", err)
	}
}

func TestEnqueueAndRuns(t *testing.T) {
	st, _ := openFresh(t)
	ctx := context.Background()
	c := mustClaim(t, st, claimReq("settle/2026-11-28", "a:1", t0))
	other := claimReq("report/2026-11-28", "a:1", t0.Add(time.Minute))
	other.Job = "report"
	mustClaim(t, st, other)
	msg := checkpoint.Message{Key: "settle/2026-11-28/notify", Topic: "settled", Payload: []byte(`{"n":1}`), CreatedAt: t0}
	for range 2 { // queuing a key twice keeps the first
		if err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error { return tx.Enqueue(msg) }); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	var payload []byte
	if err := st.Pool().QueryRow(ctx, `SELECT count(*) OVER (), payload FROM outbox WHERE run_id = $1 AND status = 'queued'`, c.Lease.RunID).Scan(&n, &payload); err != nil ||
		n != 1 || string(payload) != `{"n":1}` {
		t.Fatalf("outbox: %d rows, payload %s, %v", n, payload, err)
	}
	runs, err := st.Runs(ctx, checkpoint.RunFilter{})
	if err != nil || len(runs) != 2 || runs[0].ID != "report/2026-11-28" {
		t.Fatalf("runs newest first = %+v, %v", runs, err)
	}
	if runs, err := st.Runs(ctx, checkpoint.RunFilter{Job: "settle", Status: checkpoint.RunRunning}); err != nil || len(runs) != 1 || runs[0].ID != c.Lease.RunID {
		t.Fatalf("settle runs = %+v, %v", runs, err)
	}
	if runs, err := st.Runs(ctx, checkpoint.RunFilter{Limit: 1}); err != nil || len(runs) != 1 {
		t.Fatalf("one run = %+v, %v", runs, err)
	}
	if f, err := st.Fence(ctx, c.Lease.RunID); err != nil || f != 1 {
		t.Fatalf("fence = %d, %v", f, err)
	}
	if _, err := st.Fence(ctx, "nope/1"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("fence of a missing run: %v", err)
	}
}
