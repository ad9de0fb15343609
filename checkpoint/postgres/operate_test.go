package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

func opAudit(runID, command string, at time.Time) checkpoint.Audit {
	return checkpoint.Audit{RunID: runID, At: at, Operator: "ops@host-c", Command: command, Reason: "test"}
}

// TestOperationWaitsForWriteInFlight: an operator's recover on another
// host, made while a runner's transaction is open inside InTx, waits for
// the runner's commit (its step is kept) and then fences it out: the
// runner's next write is refused. The transaction opens with Conn, as it
// does with any call that needs a result (a lone step checkpoint opens
// none: TestDeferredPutStepAfterRecover).
func TestOperationWaitsForWriteInFlight(t *testing.T) {
	url := pgtest.Schema(t)
	a := open(t, postgres.Config{URL: url, CallerClock: true})
	ops := open(t, postgres.Config{URL: url, CallerClock: true})
	ctx := context.Background()
	c := mustClaim(t, a, claimReq("settle/2026-11-28", "host-a:1", t0))
	wrote := make(chan struct{})
	recovered := make(chan error, 1)
	const hold = 200 * time.Millisecond
	go func() {
		<-wrote
		recovered <- ops.Recover(ctx, opAudit(c.Lease.RunID, "recover", t0.Add(time.Second)), t0.Add(time.Second), true)
	}()
	err := a.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		if _, err := postgres.Conn(tx); err != nil {
			return err
		}
		if err := tx.PutStep(checkpoint.Step{ID: "load", Status: checkpoint.StepCompleted, Output: []byte(`1`), StartedAt: t0, FinishedAt: t0}); err != nil {
			return err
		}
		close(wrote)
		select {
		case err := <-recovered:
			t.Errorf("recover returned (%v) while the runner's transaction was open; want it to wait for the commit", err)
			recovered <- err // for the checks below
		case <-time.After(hold):
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the runner's write in flight: %v; want it committed (the operation waits for it)", err)
	}
	if err := <-recovered; err != nil {
		t.Fatalf("recover after the runner's commit: %v", err)
	}
	var saw int
	if err := ops.Steps(ctx, c.Lease.RunID, func(checkpoint.Step) error { saw++; return nil }); err != nil || saw != 1 {
		t.Errorf("steps after the recover: %d, %v; want the runner's committed step", saw, err)
	}
	err = a.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		return tx.PutStep(checkpoint.Step{ID: "post", Status: checkpoint.StepCompleted, Output: []byte(`2`)})
	})
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("the runner's write after the recover: %v; want ErrFenced", err)
	}
	if info, err := ops.Run(ctx, c.Lease.RunID); err != nil || info.Run.Status != checkpoint.RunFailed || info.Run.Fence <= c.Lease.Fence {
		t.Errorf("run after the recover = %+v, %v; want failed with its fence raised", info.Run, err)
	}
}

// TestOperationsOnServerClock: without CallerClock, leases are judged by
// the server's now(), whatever time the operator's request gives.
func TestOperationsOnServerClock(t *testing.T) {
	url := pgtest.Schema(t)
	st := open(t, postgres.Config{URL: url})
	ctx := context.Background()
	future := time.Now().Add(24 * time.Hour)
	req := claimReq("settle/2026-11-28", "host-a:1", time.Now())
	req.LeaseFor = time.Hour
	mustClaim(t, st, req)
	err := st.Recover(ctx, opAudit(req.RunID, "recover", future), future, false)
	if !errors.Is(err, checkpoint.ErrNotStale) || !errors.As(err, new(*checkpoint.LeaseHeldError)) {
		t.Errorf("recover of a run live by the server's clock, asked a day ahead: %v; want ErrNotStale", err)
	}
	if err := st.Abandon(ctx, opAudit(req.RunID, "abandon", future), future); !errors.As(err, new(*checkpoint.LeaseHeldError)) {
		t.Errorf("abandon of a run live by the server's clock, asked a day ahead: %v; want *LeaseHeldError", err)
	}

	short := claimReq("settle/2026-11-29", "host-a:1", time.Now())
	short.LeaseFor = time.Millisecond
	mustClaim(t, st, short)
	time.Sleep(20 * time.Millisecond)
	past := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := st.Recover(ctx, opAudit(short.RunID, "recover", past), past, false); err != nil {
		t.Errorf("recover of a run stale by the server's clock, asked in 2001: %v; want it recovered", err)
	}
	info, err := st.Run(ctx, short.RunID)
	if err != nil || info.Run.Status != checkpoint.RunFailed || info.Run.UpdatedAt.Before(time.Now().Add(-time.Hour)) {
		t.Errorf("recovered run = %+v, %v; want failed, updated at the server's now", info.Run, err)
	}

	// Schedules likewise: a live lease stays held whatever the request says.
	sreq := checkpoint.ScheduleClaimRequest{Name: "nightly", Owner: "host-a:1", Now: time.Now(), LeaseFor: time.Hour}
	if _, err := st.ClaimSchedule(ctx, sreq); err != nil {
		t.Fatal(err)
	}
	sreq.Owner, sreq.Now = "host-b:2", future
	if _, err := st.ClaimSchedule(ctx, sreq); !errors.As(err, new(*checkpoint.ScheduleHeldError)) {
		t.Errorf("claim of a schedule live by the server's clock, asked a day ahead: %v; want *ScheduleHeldError", err)
	}
}

// TestPruneSkipsRunReopenedMeanwhile: a run claimed again while prune
// waits for its row is no longer prunable when prune gets it, and keeps
// its payloads.
func TestPruneSkipsRunReopenedMeanwhile(t *testing.T) {
	url := pgtest.Schema(t)
	st := open(t, postgres.Config{URL: url, CallerClock: true})
	ctx := context.Background()
	c := mustClaim(t, st, claimReq("settle/2026-11-28", "host-a:1", t0))
	if err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		return tx.PutStep(checkpoint.Step{ID: "load", Status: checkpoint.StepCompleted, Output: []byte(`{"big":1}`)})
	}); err != nil {
		t.Fatal(err)
	}
	if err := st.Finish(ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: t0}); err != nil {
		t.Fatal(err)
	}
	// A forced claim in flight: the run row locked and reopened, not yet
	// committed.
	claimTx, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer claimTx.Rollback(ctx)
	if _, err := claimTx.Exec(ctx, `UPDATE runs SET status = 'running', fence = fence + 1, finished_at = NULL WHERE id = $1`, c.Lease.RunID); err != nil {
		t.Fatal(err)
	}
	type result struct {
		res checkpoint.PruneResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := st.Prune(ctx, opAudit("", "prune", t0.Add(48*time.Hour)), t0.Add(time.Hour), false)
		done <- result{res, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("prune returned %+v, %v while a claim held the run; want it to wait", r.res, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := claimTx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || len(r.res.Runs) != 0 {
		t.Errorf("prune after the run was reopened = %+v, %v; want nothing pruned", r.res, r.err)
	}
	var out string
	if err := st.Steps(ctx, c.Lease.RunID, func(s checkpoint.Step) error { out = string(s.Output); return nil }); err != nil || out != `{"big":1}` {
		t.Errorf("step output after the skipped prune = %q, %v; want it kept", out, err)
	}
	if as, err := st.Audits(ctx, c.Lease.RunID); err != nil || len(as) != 0 {
		t.Errorf("audit after the skipped prune = %+v, %v; want none", as, err)
	}
}
