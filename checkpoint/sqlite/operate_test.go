package sqlite_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
)

// The manual operations (recover, abandon, reset, prune) run on the store
// at times the tests choose: the store never reads the clock, so a lease
// "expires" by passing a later now.

// opAudit is an operation by alice at the given time.
func opAudit(runID, command, reason string, at time.Time) checkpoint.Audit {
	return checkpoint.Audit{RunID: runID, At: at, Operator: "alice", Command: command, Reason: reason}
}

func opAudits(t *testing.T, st *sqlite.Store, runID string) []checkpoint.Audit {
	t.Helper()
	as, err := st.Audits(context.Background(), runID)
	if err != nil {
		t.Fatalf("audits of %s: %v", runID, err)
	}
	return as
}

// opWantAudit fails unless the run's audit log is exactly one row per
// command given, in order, by alice.
func opWantAudit(t *testing.T, st *sqlite.Store, runID string, commands ...string) []checkpoint.Audit {
	t.Helper()
	as := opAudits(t, st, runID)
	var got []string
	for _, a := range as {
		got = append(got, a.Command)
		if a.RunID != runID || a.Operator != "alice" {
			t.Errorf("audit row %+v; want run %s, operator alice", a, runID)
		}
	}
	if !slices.Equal(got, commands) {
		t.Errorf("audit commands of %s = %q; want %q", runID, got, commands)
	}
	return as
}

// opDone is a completed step checkpoint.
func opDone(id, output string, at time.Time) checkpoint.Step {
	return checkpoint.Step{ID: id, Status: checkpoint.StepCompleted, Output: []byte(output), Tries: 1, StartedAt: at, FinishedAt: at}
}

func opMustPut(t *testing.T, st checkpoint.Store, l checkpoint.Lease, ss ...checkpoint.Step) {
	t.Helper()
	for _, s := range ss {
		if err := putStep(st, l, s); err != nil {
			t.Fatalf("put step %s of %s: %v", s.ID, l.RunID, err)
		}
	}
}

func opStepIDs(ss []checkpoint.Step) []string {
	var ids []string
	for _, s := range ss {
		ids = append(ids, s.ID)
	}
	return ids
}

func opCount(t *testing.T, st *sqlite.Store, query string, args ...any) int {
	t.Helper()
	var n int
	if err := st.ReadDB().QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func TestRecoverFencesOutTheOldLease(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	ctx := context.Background()
	old := mustClaim(t, st, claimReq(leaseRunID, "otherhost:1", claimNow)).Lease
	opMustPut(t, st, old, opDone("load", `1`, claimNow))

	now := claimNow.Add(2 * time.Minute) // the one-minute lease ran out
	if !runInfo(t, st, leaseRunID).Run.Stale(now) {
		t.Fatal("run is not stale after its lease ran out")
	}
	if err := st.Recover(ctx, opAudit(leaseRunID, "recover", "host died", now), now, false); err != nil {
		t.Fatalf("Recover of a stale run: %v", err)
	}

	info := runInfo(t, st, leaseRunID)
	r := info.Run
	if r.Status != checkpoint.RunFailed || r.Fence != old.Fence+1 || r.LeaseOwner != "" || !r.LeaseUntil.IsZero() ||
		!r.FinishedAt.IsZero() || !strings.Contains(r.Error, "recovered by alice: host died") || r.Stale(now) {
		t.Errorf("recovered run = %+v; want failed (resumable, unfinished), fence %d, no lease, error naming alice and the reason",
			r, old.Fence+1)
	}
	if len(info.Attempts) != 1 {
		t.Fatalf("attempts = %+v; want the one", info.Attempts)
	}
	if a := info.Attempts[0]; a.Status != checkpoint.AttemptLost || !a.FinishedAt.Equal(now) || !strings.Contains(a.Error, "recovered by alice") {
		t.Errorf("the dead runner's attempt = %+v; want lost at %s, saying who recovered it", a, now)
	}
	as := opWantAudit(t, st, leaseRunID, "recover")
	if len(as) == 1 && (as[0].Reason != "host died" || !as[0].At.Equal(now)) {
		t.Errorf("audit = %+v; want reason \"host died\" at %s", as[0], now)
	}

	// The old runner, should it wake, writes nothing.
	if err := putStep(st, old, opDone("price", `2`, now)); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("PutStep with the recovered lease: %v; want ErrFenced", err)
	}
	if err := st.Heartbeat(ctx, old, now, now.Add(time.Minute)); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("Heartbeat with the recovered lease: %v; want ErrFenced", err)
	}
	if err := st.Finish(ctx, old, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: now}); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("Finish with the recovered lease: %v; want ErrFenced", err)
	}
	if got := opStepIDs(allSteps(t, st, leaseRunID)); !slices.Equal(got, []string{"load"}) {
		t.Errorf("steps after fenced writes = %v; want [load]", got)
	}
	if r := runInfo(t, st, leaseRunID).Run; r.Status != checkpoint.RunFailed {
		t.Errorf("fenced Finish changed the status to %q", r.Status)
	}

	// A resume claims it like any failed run, keeping the checkpoint.
	c := mustClaim(t, st, claimReq(leaseRunID, "b:2", now))
	if c.Created || c.TookOverFrom != "" || c.Lease.Fence != old.Fence+2 || c.Lease.Attempt != 2 {
		t.Errorf("claim after recover = %+v; want attempt 2 at fence %d, no takeover", c, old.Fence+2)
	}
	if got := opStepIDs(allSteps(t, st, leaseRunID)); !slices.Equal(got, []string{"load"}) {
		t.Errorf("steps after the resume claim = %v; want [load]", got)
	}
}

func TestRecoverRefusals(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	ctx := context.Background()
	l := mustClaim(t, st, claimReq(leaseRunID, "otherhost:1", claimNow)).Lease

	live := claimNow.Add(30 * time.Second)
	err := st.Recover(ctx, opAudit(leaseRunID, "recover", "impatient", live), live, false)
	var held *checkpoint.LeaseHeldError
	if !errors.Is(err, checkpoint.ErrNotStale) || !errors.As(err, &held) || held.Owner != "otherhost:1" ||
		!strings.Contains(err.Error(), "otherhost:1") || strings.Contains(err.Error(), "--") {
		t.Fatalf("Recover of a live run: %v; want ErrNotStale with a LeaseHeldError naming the holder, and no CLI flag", err)
	}
	if r := runInfo(t, st, leaseRunID).Run; r.Status != checkpoint.RunRunning || r.Fence != l.Fence || r.LeaseOwner != "otherhost:1" {
		t.Errorf("refused Recover changed the run: %+v", r)
	}
	opWantAudit(t, st, leaseRunID)

	if err := st.Recover(ctx, opAudit(leaseRunID, "recover", "host is gone", live), live, true); err != nil {
		t.Fatalf("forced Recover of a live run: %v", err)
	}
	if r := runInfo(t, st, leaseRunID).Run; r.Status != checkpoint.RunFailed || r.Fence != l.Fence+1 {
		t.Errorf("forced Recover: run %+v; want failed at fence %d", r, l.Fence+1)
	}
	if err := putStep(st, l, opDone("load", `1`, live)); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("PutStep after a forced Recover: %v; want ErrFenced", err)
	}

	// Not running any more: nothing to recover, forced or not.
	for _, force := range []bool{false, true} {
		err := st.Recover(ctx, opAudit(leaseRunID, "recover", "again", live), live, force)
		if !errors.Is(err, checkpoint.ErrNotStale) || !strings.Contains(err.Error(), "not running") {
			t.Errorf("Recover (force %v) of a failed run: %v; want ErrNotStale saying it is not running", force, err)
		}
	}
	opWantAudit(t, st, leaseRunID, "recover")

	err = st.Recover(ctx, opAudit("report/nope", "recover", "", live), live, true)
	if !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("Recover of an unknown run: %v; want ErrNotFound", err)
	}
	opWantAudit(t, st, "report/nope")
}

func TestAbandon(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	ctx := context.Background()
	l := mustClaim(t, st, claimReq(leaseRunID, "otherhost:1", claimNow)).Lease

	live := claimNow.Add(30 * time.Second)
	err := st.Abandon(ctx, opAudit(leaseRunID, "abandon", "bad input", live), live)
	var held *checkpoint.LeaseHeldError
	if !errors.As(err, &held) || held.Owner != "otherhost:1" {
		t.Fatalf("Abandon of a live run: %v; want a LeaseHeldError naming otherhost:1", err)
	}
	opWantAudit(t, st, leaseRunID)

	now := claimNow.Add(2 * time.Minute)
	if err := st.Abandon(ctx, opAudit(leaseRunID, "abandon", "bad input", now), now); err != nil {
		t.Fatalf("Abandon of a stale run: %v", err)
	}
	info := runInfo(t, st, leaseRunID)
	if r := info.Run; r.Status != checkpoint.RunAbandoned || r.Fence != l.Fence+1 || r.LeaseOwner != "" ||
		!r.FinishedAt.Equal(now) || !strings.Contains(r.Error, "abandoned by alice: bad input") {
		t.Errorf("abandoned run = %+v; want abandoned at %s, fence %d, no lease, error with operator and reason", r, now, l.Fence+1)
	}
	if a := info.Attempts[0]; a.Status != checkpoint.AttemptLost || !a.FinishedAt.Equal(now) {
		t.Errorf("attempt = %+v; want lost at %s", a, now)
	}
	if err := putStep(st, l, opDone("load", `1`, now)); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("PutStep after Abandon: %v; want ErrFenced", err)
	}

	if err := st.Abandon(ctx, opAudit(leaseRunID, "abandon", "twice", now), now); !errors.Is(err, checkpoint.ErrAbandoned) {
		t.Errorf("Abandon of an abandoned run: %v; want ErrAbandoned", err)
	}
	opWantAudit(t, st, leaseRunID, "abandon")

	if _, err := st.Claim(ctx, claimReq(leaseRunID, "b:2", now)); !errors.Is(err, checkpoint.ErrAbandoned) || !strings.Contains(err.Error(), "bad input") {
		t.Errorf("claim of the abandoned run: %v; want ErrAbandoned with the reason", err)
	}
	req := claimReq(leaseRunID, "b:2", now)
	req.Force = true
	if c := mustClaim(t, st, req); c.Lease.Fence != l.Fence+2 || c.Lease.Attempt != 2 {
		t.Errorf("forced claim = %+v; want attempt 2 at fence %d", c.Lease, l.Fence+2)
	}
}

func TestResetStepsRefusedWhileLeaseHeld(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	ctx := context.Background()
	l := mustClaim(t, st, claimReq(leaseRunID, "otherhost:1", claimNow)).Lease
	opMustPut(t, st, l, opDone("load", `1`, claimNow), opDone("price", `2`, claimNow))
	err := st.InTx(ctx, l, func(tx checkpoint.Tx) error {
		if err := tx.PutItems([]checkpoint.Item{
			{Step: "price", Key: "O-1", Status: checkpoint.StepCompleted, Output: []byte(`1`), Attempt: 1},
			{Step: "load", Key: "O-1", Status: checkpoint.StepCompleted, Output: []byte(`1`), Attempt: 1},
		}); err != nil {
			return err
		}
		return tx.PutChunkPlan(checkpoint.ChunkPlan{Step: "price", EffectID: "e1", Status: checkpoint.StepPlanned, Plan: []byte(`{}`)})
	})
	if err != nil {
		t.Fatal(err)
	}

	live := claimNow.Add(30 * time.Second)
	err = st.ResetSteps(ctx, opAudit(leaseRunID, "reset --step price", "recompute", live), live, []string{"price"})
	var held *checkpoint.LeaseHeldError
	if !errors.As(err, &held) || held.Owner != "otherhost:1" || held.RunID != leaseRunID {
		t.Fatalf("ResetSteps while the lease is live: %v; want a LeaseHeldError naming otherhost:1", err)
	}
	if got := opStepIDs(allSteps(t, st, leaseRunID)); !slices.Equal(got, []string{"load", "price"}) {
		t.Errorf("refused ResetSteps left steps %v; want both", got)
	}
	if r := runInfo(t, st, leaseRunID).Run; r.Fence != l.Fence {
		t.Errorf("refused ResetSteps moved the fence to %d", r.Fence)
	}
	opWantAudit(t, st, leaseRunID)

	now := claimNow.Add(2 * time.Minute)
	if err := st.ResetSteps(ctx, opAudit(leaseRunID, "reset --step price", "recompute", now), now, []string{"price"}); err != nil {
		t.Fatalf("ResetSteps after the lease ran out: %v", err)
	}
	if got := opStepIDs(allSteps(t, st, leaseRunID)); !slices.Equal(got, []string{"load"}) {
		t.Errorf("steps after ResetSteps(price) = %v; want [load]", got)
	}
	if n := opCount(t, st, `SELECT count(*) FROM items WHERE run_id = ? AND step_id = 'price'`, leaseRunID); n != 0 {
		t.Errorf("%d items of the reset step remain; want 0", n)
	}
	if n := opCount(t, st, `SELECT count(*) FROM items WHERE run_id = ? AND step_id = 'load'`, leaseRunID); n != 1 {
		t.Errorf("%d items of another step remain; want 1", n)
	}
	if n := opCount(t, st, `SELECT count(*) FROM chunk_plans WHERE run_id = ?`, leaseRunID); n != 0 {
		t.Errorf("%d chunk plans of the reset step remain; want 0", n)
	}
	if r := runInfo(t, st, leaseRunID).Run; r.Fence != l.Fence+1 || r.Status != checkpoint.RunRunning {
		t.Errorf("run after resetting a stale run's step = %+v; want still running (stale), fence %d", r, l.Fence+1)
	}
	if err := putStep(st, l, opDone("price", `2`, now)); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("PutStep with the old lease after ResetSteps: %v; want ErrFenced", err)
	}
	opWantAudit(t, st, leaseRunID, "reset --step price")
}

func TestResetStepsReopensSucceededRun(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	ctx := context.Background()
	l := mustClaim(t, st, claimReq(leaseRunID, "a:1", claimNow)).Lease
	opMustPut(t, st, l, opDone("load", `1`, claimNow), opDone("price", `2`, claimNow), opDone("summary", `3`, claimNow))
	if err := st.Finish(ctx, l, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: claimNow.Add(time.Second)}); err != nil {
		t.Fatal(err)
	}

	now := claimNow.Add(time.Hour)
	a := opAudit(leaseRunID, "rerun --from-step price", "fee table fixed", now)
	a.Details = "cleared price, summary"
	if err := st.ResetSteps(ctx, a, now, []string{"price", "summary"}); err != nil {
		t.Fatalf("ResetSteps of a succeeded run: %v", err)
	}
	r := runInfo(t, st, leaseRunID).Run
	if r.Status != checkpoint.RunFailed || !r.FinishedAt.IsZero() || r.Fence != l.Fence+1 ||
		!strings.Contains(r.Error, "reopened by alice (rerun --from-step price): fee table fixed") {
		t.Errorf("reopened run = %+v; want failed, unfinished, fence %d, error saying who reopened it and why", r, l.Fence+1)
	}
	if got := opStepIDs(allSteps(t, st, leaseRunID)); !slices.Equal(got, []string{"load"}) {
		t.Errorf("steps = %v; want [load]", got)
	}
	if as := opWantAudit(t, st, leaseRunID, "rerun --from-step price"); len(as) == 1 && as[0].Details != a.Details {
		t.Errorf("audit details = %q; want %q", as[0].Details, a.Details)
	}
	// Reopened, it resumes without --force.
	if c := mustClaim(t, st, claimReq(leaseRunID, "b:2", now)); c.Lease.Attempt != 2 {
		t.Errorf("claim after reset = %+v; want attempt 2", c.Lease)
	}
}

func TestPruneKeepsTombstones(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	ctx := context.Background()
	finish := func(l checkpoint.Lease, status string, at time.Time) {
		t.Helper()
		if err := st.Finish(ctx, l, checkpoint.Ending{Status: status, At: at}); err != nil {
			t.Fatal(err)
		}
	}

	// An old succeeded run with step payloads, an effect plan, items and a
	// chunk plan.
	const oldID, abandonedID, failedID, newID = "report/old", "report/abandoned", "report/failed", "report/new"
	old := mustClaim(t, st, claimReq(oldID, "a:1", claimNow)).Lease
	planned := opDone("credit", `{"ok":true}`, claimNow)
	planned.Plan = []byte(`{"target":"stepwise_state","ops":[],"writes":[]}`)
	opMustPut(t, st, old, opDone("load", `[1,2,3]`, claimNow), planned)
	items := []checkpoint.Item{
		{Step: "price", Key: "O-1", Status: checkpoint.StepCompleted, Output: []byte(`30`), Attempt: 1},
		{Step: "price", Key: "O-2", Status: checkpoint.StepCompleted, Output: []byte(`45`), Attempt: 1},
		{Step: "price", Key: "O-3", Status: checkpoint.ItemSkipped, Error: "no price", Attempt: 1},
	}
	err := st.InTx(ctx, old, func(tx checkpoint.Tx) error {
		if err := tx.PutItems(items); err != nil {
			return err
		}
		return tx.PutChunkPlan(checkpoint.ChunkPlan{Step: "price", EffectID: "e1", Status: checkpoint.StepPlanned, Plan: []byte(`{}`)})
	})
	if err != nil {
		t.Fatal(err)
	}
	finish(old, checkpoint.RunSucceeded, claimNow.Add(time.Second))
	wantBytes := int64(len(`[1,2,3]`) + len(`{"ok":true}`) + len(planned.Plan))
	for _, it := range items {
		wantBytes += int64(len(it.Output) + len(it.Error) + len(it.Key))
	}

	// An old abandoned run: pruned too.
	ab := mustClaim(t, st, claimReq(abandonedID, "a:1", claimNow)).Lease
	opMustPut(t, st, ab, opDone("load", `7`, claimNow))
	wantBytes += int64(len(`7`))
	if err := st.Abandon(ctx, opAudit(abandonedID, "abandon", "wrong day", claimNow.Add(2*time.Minute)), claimNow.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	// An old failed run: resumable, so kept whole.
	failed := mustClaim(t, st, claimReq(failedID, "a:1", claimNow)).Lease
	opMustPut(t, st, failed, opDone("load", `8`, claimNow))
	finish(failed, checkpoint.RunFailed, claimNow.Add(time.Second))
	// A recent succeeded run: newer than the cutoff.
	recent := claimNow.AddDate(0, 0, 100)
	nw := mustClaim(t, st, claimReq(newID, "a:1", recent)).Lease
	opMustPut(t, st, nw, opDone("load", `9`, recent))
	finish(nw, checkpoint.RunSucceeded, recent.Add(time.Second))

	now := recent.Add(time.Hour)
	cutoff := claimNow.AddDate(0, 0, 50)
	a := opAudit("", "prune --older-than 50d", "retention", now)
	wantRes := checkpoint.PruneResult{Runs: []string{oldID, abandonedID}, Steps: 3, Items: 3, Bytes: wantBytes}

	res, err := st.Prune(ctx, a, cutoff, true)
	if err != nil {
		t.Fatalf("dry-run Prune: %v", err)
	}
	if !slices.Equal(res.Runs, wantRes.Runs) || res.Steps != wantRes.Steps || res.Items != wantRes.Items || res.Bytes != wantRes.Bytes {
		t.Errorf("dry-run Prune = %+v; want %+v", res, wantRes)
	}
	for _, id := range []string{oldID, abandonedID} {
		if r := runInfo(t, st, id).Run; !r.PrunedAt.IsZero() {
			t.Errorf("dry run pruned %s", id)
		}
	}
	if n := opCount(t, st, `SELECT count(*) FROM items`); n != 3 {
		t.Errorf("dry run left %d items; want 3", n)
	}
	if ss := allSteps(t, st, oldID); len(ss) != 2 || ss[0].Output == nil || ss[0].Plan == nil && ss[1].Plan == nil {
		t.Errorf("dry run changed the steps: %+v", ss)
	}
	opWantAudit(t, st, oldID)

	res, err = st.Prune(ctx, a, cutoff, false)
	if err != nil {
		t.Fatalf("Prune: %v", err)
	}
	if !slices.Equal(res.Runs, wantRes.Runs) || res.Steps != wantRes.Steps || res.Items != wantRes.Items || res.Bytes != wantRes.Bytes {
		t.Errorf("Prune = %+v; want %+v", res, wantRes)
	}
	for id, before := range map[string][]string{oldID: nil, abandonedID: {"abandon"}} {
		info := runInfo(t, st, id)
		if !info.Run.PrunedAt.Equal(now) {
			t.Errorf("%s pruned_at = %s; want %s", id, info.Run.PrunedAt, now)
		}
		ss := allSteps(t, st, id)
		if len(ss) == 0 {
			t.Errorf("%s: Prune deleted the step rows; want them kept without payloads", id)
		}
		for _, s := range ss {
			if s.Output != nil || s.Plan != nil {
				t.Errorf("%s step %s keeps output %s, plan %s; want both gone", id, s.ID, s.Output, s.Plan)
			}
		}
		as := opWantAudit(t, st, id, append(before, "prune --older-than 50d")...)
		for _, p := range as {
			if p.Command == "prune --older-than 50d" && (p.Reason != "retention" || !strings.Contains(p.Details, "bytes") || !p.At.Equal(now)) {
				t.Errorf("%s prune audit = %+v; want reason retention at %s and what was freed", id, p, now)
			}
		}
	}
	if n := opCount(t, st, `SELECT count(*) FROM items`); n != 0 {
		t.Errorf("%d items left after Prune; want 0", n)
	}
	if n := opCount(t, st, `SELECT count(*) FROM chunk_plans`); n != 0 {
		t.Errorf("%d chunk plans left after Prune; want 0", n)
	}
	if r := runInfo(t, st, oldID).Run; r.Status != checkpoint.RunSucceeded {
		t.Errorf("pruned run's status = %q; want it kept (succeeded)", r.Status)
	}
	for _, id := range []string{failedID, newID} {
		if r := runInfo(t, st, id).Run; !r.PrunedAt.IsZero() {
			t.Errorf("%s (%s) was pruned", id, r.Status)
		}
		if ss := allSteps(t, st, id); len(ss) != 1 || ss[0].Output == nil {
			t.Errorf("%s lost its checkpoint: %+v", id, ss)
		}
		opWantAudit(t, st, id)
	}

	// The tombstone refuses the key, forced or not.
	for _, force := range []bool{false, true} {
		req := claimReq(oldID, "b:2", now)
		req.Force = force
		if _, err := st.Claim(ctx, req); !errors.Is(err, checkpoint.ErrPruned) || !strings.Contains(err.Error(), oldID) {
			t.Errorf("claim (force %v) of a pruned run: %v; want ErrPruned naming it", force, err)
		}
	}
	if info := runInfo(t, st, oldID); len(info.Attempts) != 1 {
		t.Errorf("refused claims recorded attempts: %+v", info.Attempts)
	}

	// Pruning again finds nothing.
	if res, err := st.Prune(ctx, a, cutoff, false); err != nil || len(res.Runs) != 0 || res.Bytes != 0 {
		t.Errorf("second Prune = %+v, %v; want nothing (the failed run is never pruned)", res, err)
	}
}

// TestResetStepsRefusesPrunedRun: a pruned run's tombstone stays as it
// is. Its steps cannot run again (claims are refused), so clearing them
// and reopening the run would only destroy the record.
func TestResetStepsRefusesPrunedRun(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	ctx := context.Background()
	l := mustClaim(t, st, claimReq(leaseRunID, "a:1", claimNow)).Lease
	opMustPut(t, st, l, opDone("load", `1`, claimNow))
	if err := st.Finish(ctx, l, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: claimNow}); err != nil {
		t.Fatal(err)
	}
	now := claimNow.Add(time.Hour)
	if _, err := st.Prune(ctx, opAudit("", "prune", "retention", now), now, false); err != nil {
		t.Fatal(err)
	}
	before := runInfo(t, st, leaseRunID).Run

	err := st.ResetSteps(ctx, opAudit(leaseRunID, "reset --step load", "x", now), now, []string{"load"})
	if !errors.Is(err, checkpoint.ErrPruned) {
		t.Errorf("ResetSteps of a pruned run: %v; want ErrPruned", err)
	}
	if r := runInfo(t, st, leaseRunID).Run; r.Status != before.Status || r.Fence != before.Fence {
		t.Errorf("ResetSteps changed the pruned run: %s at fence %d; want %s at fence %d", r.Status, r.Fence, before.Status, before.Fence)
	}
	if got := opStepIDs(allSteps(t, st, leaseRunID)); !slices.Equal(got, []string{"load"}) {
		t.Errorf("steps of the pruned run = %v; want [load] kept", got)
	}
	opWantAudit(t, st, leaseRunID, "prune")
}

// TestOperationsTakeTheDeadOwnerCheck checks that every manual operation
// refused on a live lease takes the claim's dead-owner check: an owner it
// reports gone holds nothing (as Claim treats it), any other owner keeps
// the run until its lease expires. The full owner string is what the
// check is asked about; the refusal shows only its name.
func TestOperationsTakeTheDeadOwnerCheck(t *testing.T) {
	ctx := context.Background()
	const owner = "node1:4242 boot=b pidns=1"
	live := claimNow.Add(10 * time.Second) // inside the one-minute lease
	var asked []string
	gone := func(dead bool) checkpoint.OperateOption {
		return checkpoint.WithOwnerGone(func(o string) bool { asked = append(asked, o); return dead })
	}
	ops := []struct {
		name string
		do   func(st *sqlite.Store, opt checkpoint.OperateOption) error
		want string // the run's status afterwards, when allowed
	}{
		{"recover", func(st *sqlite.Store, opt checkpoint.OperateOption) error {
			return st.Recover(ctx, opAudit(leaseRunID, "recover", "r", live), live, false, opt)
		}, checkpoint.RunFailed},
		{"abandon", func(st *sqlite.Store, opt checkpoint.OperateOption) error {
			return st.Abandon(ctx, opAudit(leaseRunID, "abandon", "r", live), live, opt)
		}, checkpoint.RunAbandoned},
		{"reset", func(st *sqlite.Store, opt checkpoint.OperateOption) error {
			return st.ResetSteps(ctx, opAudit(leaseRunID, "reset", "r", live), live, []string{"pay"}, opt)
		}, checkpoint.RunRunning},
		{"resolve", func(st *sqlite.Store, opt checkpoint.OperateOption) error {
			return st.ResolveStep(ctx, opAudit(leaseRunID, "resolve", "r", live), live, "pay", true, []byte(`"r"`), opt)
		}, checkpoint.RunRunning},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			st := checkpointtest.OpenSQLite(t)
			l := mustClaim(t, st, claimReq(leaseRunID, owner, claimNow)).Lease
			opMustPut(t, st, l, checkpoint.Step{ID: "pay", Status: checkpoint.StepCalling, Tries: 1, StartedAt: claimNow, FinishedAt: claimNow})

			asked = nil
			err := op.do(st, gone(false))
			var held *checkpoint.LeaseHeldError
			if op.name == "recover" {
				if !errors.Is(err, checkpoint.ErrNotStale) || !strings.Contains(err.Error(), "held by node1:4242 until") {
					t.Fatalf("%s of a live owner's run: %v; want ErrNotStale naming node1:4242", op.name, err)
				}
			} else if !errors.As(err, &held) || held.Owner != owner || !strings.Contains(err.Error(), "held by node1:4242 until") {
				t.Fatalf("%s of a live owner's run: %v; want a LeaseHeldError showing node1:4242", op.name, err)
			}
			if len(asked) == 0 || asked[0] != owner {
				t.Errorf("the dead-owner check was asked about %q; want %q", asked, owner)
			}
			opWantAudit(t, st, leaseRunID)

			if err := op.do(st, gone(true)); err != nil {
				t.Fatalf("%s once the owner is gone: %v; want it done at once, the lease notwithstanding", op.name, err)
			}
			if r := runInfo(t, st, leaseRunID).Run; r.Status != op.want {
				t.Errorf("after %s: status %s, want %s", op.name, r.Status, op.want)
			}
			opWantAudit(t, st, leaseRunID, op.name)
		})
	}

	// Without the check (nil), a live lease is never treated as gone.
	st := checkpointtest.OpenSQLite(t)
	mustClaim(t, st, claimReq(leaseRunID, owner, claimNow))
	var held *checkpoint.LeaseHeldError
	if err := st.Abandon(ctx, opAudit(leaseRunID, "abandon", "r", live), live); !errors.As(err, &held) {
		t.Fatalf("abandon without a dead-owner check: %v; want LeaseHeldError", err)
	}
}
