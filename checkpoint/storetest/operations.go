package storetest

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// goneA is the dead-owner option that finds ownerA gone.
var goneA = checkpoint.WithOwnerGone(func(owner string) bool { return owner == ownerA })

// commands lists the commands of a run's audit records.
func (e *env) commands(op operator, runID string) []string {
	e.t.Helper()
	as, err := op.Audits(e.ctx, runID)
	if err != nil {
		e.t.Fatalf("Audits of %s: %v", runID, err)
	}
	var out []string
	for _, a := range as {
		out = append(out, a.Command)
	}
	return out
}

// checkFencedOut checks lease l can no longer write.
func (e *env) checkFencedOut(st checkpoint.Store, l checkpoint.Lease, after string) {
	e.t.Helper()
	if err := st.InTx(e.ctx, l, func(tx checkpoint.Tx) error { return tx.PutStep(completed("late", `1`)) }); !errors.Is(err, checkpoint.ErrFenced) {
		e.t.Errorf("a write of the old lease after %s: %v; want ErrFenced", after, err)
	}
	if err := st.Heartbeat(e.ctx, l, t0, t0.Add(lease)); !errors.Is(err, checkpoint.ErrFenced) {
		e.t.Errorf("a heartbeat of the old lease after %s: %v; want ErrFenced", after, err)
	}
}

func opHosts(t *testing.T, h Harness) (*env, checkpoint.Store, operator) {
	e := newEnv(t, h)
	st := e.open()
	return e, st, capability[operator](t, e.open(), "operator actions")
}

func testOperations(t *testing.T, h Harness) {
	callerClock(t, h, "RecoverStaleRun", opRecoverStaleRun)
	t.Run("RecoverRefusals", func(t *testing.T) { opRecoverRefusals(t, h) })
	callerClock(t, h, "Abandon", opAbandon)
	t.Run("ResetSteps", func(t *testing.T) { opResetSteps(t, h) })
	callerClock(t, h, "ResolveStep", opResolveStep)
	callerClock(t, h, "ResetWithFence", opResetWithFence)
	callerClock(t, h, "ResolveReplace", opResolveReplace)
	callerClock(t, h, "PruneKeepsTombstones", opPruneKeepsTombstones)
	callerClock(t, h, "PruneDeletesIdempotencyKeys", opPruneDeletesIdempotencyKeys)
	t.Run("ClaimAudits", func(t *testing.T) { testClaimAudits(t, h) })

	t.Run("AuditKeepsOrder", func(t *testing.T) { opAuditKeepsOrder(t, h) })
}

// opRecoverStaleRun is the Operations test RecoverStaleRun.
func opRecoverStaleRun(t *testing.T, h Harness) {
	e, st, op := opHosts(t, h)
	c := e.claim(st, "ops/1", ownerA, t0)
	now := t0.Add(lease)
	if err := op.Recover(e.ctx, audit("ops/1", "recover", now), now, false); err != nil {
		t.Fatalf("recover of a stale run: %v", err)
	}
	info := e.run(st, "ops/1")
	if r := info.Run; r.Status != checkpoint.RunFailed || r.Fence <= c.Lease.Fence || r.LeaseOwner != "" || !strings.Contains(r.Error, "ops@host-c") || !sameTime(r.UpdatedAt, now) {
		t.Errorf("recovered run = %+v; want failed, fence grown, no lease, its error naming the operator, updated %s", r, now)
	}
	if a := info.Attempts[0]; a.Status != checkpoint.AttemptLost || !sameTime(a.FinishedAt, now) {
		t.Errorf("attempt of the recovered run = %+v; want lost at %s", a, now)
	}
	e.checkFencedOut(st, c.Lease, "recover")
	if got := e.commands(op, "ops/1"); !slices.Equal(got, []string{"recover"}) {
		t.Errorf("audit = %v; want the recover", got)
	}
	if c2 := e.claim(st, "ops/1", ownerB, now); c2.PreviousStatus != checkpoint.RunFailed || c2.TookOverFrom != "" {
		t.Errorf("claim after recover = %+v; want it to resume a failed run", c2)
	}
}

// opRecoverRefusals is the Operations test RecoverRefusals.
func opRecoverRefusals(t *testing.T, h Harness) {
	e, st, op := opHosts(t, h)
	c := e.claim(st, "ops/2", ownerA, t0)
	now := t0.Add(time.Second) // the lease is live
	err := op.Recover(e.ctx, audit("ops/2", "recover", now), now, false)
	if !errors.Is(err, checkpoint.ErrNotStale) || !errors.As(err, new(*checkpoint.LeaseHeldError)) {
		t.Errorf("recover of a live run: %v; want ErrNotStale wrapping a *LeaseHeldError", err)
	}
	if f, _ := st.Fence(e.ctx, "ops/2"); f != c.Lease.Fence {
		t.Errorf("fence after a refused recover = %d; want %d", f, c.Lease.Fence)
	}
	if got := e.commands(op, "ops/2"); len(got) != 0 {
		t.Errorf("audit after a refused recover = %v; want nothing recorded", got)
	}
	if err := op.Recover(e.ctx, audit("ops/2", "recover", now), now, false, goneA); err != nil {
		t.Errorf("recover of a live lease whose owner is gone: %v; want it recovered", err)
	}
	if err := op.Recover(e.ctx, audit("ops/2", "recover", now), now, false); !errors.Is(err, checkpoint.ErrNotStale) {
		t.Errorf("recover of a failed run: %v; want ErrNotStale (nothing to recover)", err)
	}
	e.claim(st, "ops/3", ownerA, t0)
	if err := op.Recover(e.ctx, audit("ops/3", "recover", now), now, true); err != nil {
		t.Errorf("forced recover of a live run: %v", err)
	}
	if err := op.Recover(e.ctx, audit("ops/none", "recover", now), now, true); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("recover of an unknown run: %v; want ErrNotFound", err)
	}
}

// opAbandon is the Operations test Abandon.
func opAbandon(t *testing.T, h Harness) {
	e, st, op := opHosts(t, h)
	c := e.claim(st, "ops/4", ownerA, t0)
	now := t0.Add(time.Second)
	var held *checkpoint.LeaseHeldError
	if err := op.Abandon(e.ctx, audit("ops/4", "abandon", now), now); !errors.As(err, &held) || held.Owner != ownerA {
		t.Errorf("abandon of a live run: %v; want *LeaseHeldError naming %s", err, ownerA)
	}
	if err := op.Abandon(e.ctx, audit("ops/4", "abandon", now), now, goneA); err != nil {
		t.Fatalf("abandon of a run whose owner is gone: %v", err)
	}
	r := e.run(st, "ops/4").Run
	if r.Status != checkpoint.RunAbandoned || !sameTime(r.FinishedAt, now) || r.LeaseOwner != "" {
		t.Errorf("abandoned run = %+v; want abandoned, finished %s, no lease", r, now)
	}
	e.checkFencedOut(st, c.Lease, "abandon")
	if err := op.Abandon(e.ctx, audit("ops/4", "abandon", now), now); !errors.Is(err, checkpoint.ErrAbandoned) {
		t.Errorf("abandon of an abandoned run: %v; want ErrAbandoned", err)
	}
	if _, err := st.Claim(e.ctx, claimReq("ops/4", ownerB, now)); !errors.Is(err, checkpoint.ErrAbandoned) {
		t.Errorf("claim of an abandoned run: %v; want ErrAbandoned", err)
	}
	if got := e.commands(op, "ops/4"); !slices.Equal(got, []string{"abandon"}) {
		t.Errorf("audit = %v; want the one abandon that happened", got)
	}
}

// opResetSteps is the Operations test ResetSteps.
func opResetSteps(t *testing.T, h Harness) {
	e, st, op := opHosts(t, h)
	c := e.claim(st, "ops/5", ownerA, t0)
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
		for _, s := range []string{"load", "post", "report"} {
			if err := tx.PutStep(completed(s, `1`)); err != nil {
				return err
			}
		}
		if err := chunk(tx, "post@1.c1", "", "", "a"); err != nil {
			return err
		}
		return tx.PutItems([]checkpoint.Item{{Step: "load", Key: "x", Status: checkpoint.StepCompleted}})
	})
	now := t0.Add(time.Second)
	if err := op.ResetSteps(e.ctx, audit("ops/5", "reset", now), now, []string{"post"}); !errors.As(err, new(*checkpoint.LeaseHeldError)) {
		t.Errorf("reset under a live lease: %v; want *LeaseHeldError", err)
	}
	if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: now}); err != nil {
		t.Fatal(err)
	}
	if err := op.ResetSteps(e.ctx, audit("ops/5", "reset", now), now, []string{"post", "report"}); err != nil {
		t.Fatalf("reset of a succeeded run: %v", err)
	}
	steps := e.steps(st, "ops/5")
	if len(steps) != 1 || steps["load"].Status != checkpoint.StepCompleted {
		t.Errorf("steps after resetting post and report = %+v; want only load", steps)
	}
	if got := e.items(st, checkpoint.ItemQuery{RunID: "ops/5", Step: "post"}); len(got) != 0 {
		t.Errorf("items of the reset step = %+v; want none", got)
	}
	if got := e.plannedIDs(st, "ops/5"); len(got) != 0 {
		t.Errorf("chunk plans of the reset step = %v; want none", got)
	}
	if got := e.items(st, checkpoint.ItemQuery{RunID: "ops/5", Step: "load"}); len(got) != 1 {
		t.Errorf("items of a step not reset = %+v; want kept", got)
	}
	r := e.run(st, "ops/5").Run
	if r.Status != checkpoint.RunFailed || r.Fence <= c.Lease.Fence || !r.FinishedAt.IsZero() {
		t.Errorf("run after reset = %+v; want reopened as failed, fence grown, unfinished", r)
	}
	if c2 := e.claim(st, "ops/5", ownerB, now); c2.PreviousStatus != checkpoint.RunFailed {
		t.Errorf("claim after reset = %+v; want it to resume without force", c2)
	}
	// The new runner holds it, but is gone: reset with the dead-owner check.
	req := claimReq("ops/6", ownerA, t0)
	c6, err := st.Claim(e.ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := op.ResetSteps(e.ctx, audit("ops/6", "reset", now), now, []string{"x"}, goneA); err != nil {
		t.Errorf("reset of a run whose owner is gone: %v", err)
	}
	e.checkFencedOut(st, c6.Lease, "reset")
}

// opResolveStep is the Operations test ResolveStep.
func opResolveStep(t *testing.T, h Harness) {
	e, st, op := opHosts(t, h)
	c := e.claim(st, "ops/7", ownerA, t0)
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
		for _, id := range []string{"pay/1", "pay/2"} {
			if err := tx.PutStep(checkpoint.Step{ID: id, Status: checkpoint.StepCalling, StartedAt: t0, FinishedAt: t0}); err != nil {
				return err
			}
		}
		return tx.PutStep(completed("load", `1`))
	})
	now := t0.Add(time.Second)
	if err := op.ResolveStep(e.ctx, audit("ops/7", "resolve", now), now, "pay/1", true, []byte(`{"ok":true}`)); !errors.As(err, new(*checkpoint.LeaseHeldError)) {
		t.Errorf("resolve under a live lease: %v; want *LeaseHeldError", err)
	}
	if err := op.ResolveStep(e.ctx, audit("ops/7", "resolve", now), now, "pay/1", true, []byte(`{"ok":true}`), goneA); err != nil {
		t.Fatalf("resolve done, owner gone: %v", err)
	}
	// Like every operation that changes a run, resolve grows its
	// fence: the runner it declared gone writes nothing more.
	if err := st.InTx(e.ctx, c.Lease, func(tx checkpoint.Tx) error { return tx.PutStep(completed("late", `1`)) }); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("the old runner's write after a resolve: %v; want ErrFenced", err)
	}
	later := now.Add(time.Minute)
	if err := op.ResolveStep(e.ctx, audit("ops/7", "resolve", later), later, "pay/2", false, nil, goneA); err != nil {
		t.Fatalf("resolve not done: %v", err)
	}
	steps := e.steps(st, "ops/7")
	if s := steps["pay/1"]; s.Status != checkpoint.StepCompleted || string(s.Output) != `{"ok":true}` || s.Error != "" || !sameTime(s.FinishedAt, now) {
		t.Errorf("step resolved done = %+v; want completed with the output, finished %s", s, now)
	}
	if s := steps["pay/2"]; s.Status != checkpoint.StepFailed || !strings.Contains(s.Error, "ops@host-c") || !sameTime(s.FinishedAt, later) {
		t.Errorf("step resolved not done = %+v; want failed, its error naming the operator, finished %s", s, later)
	}
	if err := op.ResolveStep(e.ctx, audit("ops/7", "resolve", now), now, "load", true, nil, goneA); !errors.Is(err, checkpoint.ErrNotUnknown) {
		t.Errorf("resolve of a completed step: %v; want ErrNotUnknown", err)
	}
	if err := op.ResolveStep(e.ctx, audit("ops/7", "resolve", now), now, "nope", true, nil, goneA); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("resolve of a step never recorded: %v; want ErrNotFound", err)
	}
	if got := e.commands(op, "ops/7"); !slices.Equal(got, []string{"resolve", "resolve"}) {
		t.Errorf("audit = %v; want the two resolves that happened", got)
	}
}

// opPruneKeepsTombstones is the Operations test PruneKeepsTombstones.
func opPruneKeepsTombstones(t *testing.T, h Harness) {
	e, st, op := opHosts(t, h)
	finish := func(id, status string, at time.Time) {
		c := e.claim(st, id, ownerA, at.Add(-time.Hour))
		e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
			if err := tx.PutStep(completed("load", `{"big":"payload"}`)); err != nil {
				return err
			}
			return tx.PutItems([]checkpoint.Item{{Step: "post", Key: "k", Status: checkpoint.StepCompleted, Output: []byte(`1`)}})
		})
		if status != checkpoint.RunRunning {
			if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: status, At: at}); err != nil {
				t.Fatal(err)
			}
		}
	}
	cutoff := t0.Add(30 * 24 * time.Hour)
	finish("prune/old-ok", checkpoint.RunSucceeded, t0)
	finish("prune/old-abandoned", checkpoint.RunAbandoned, t0.Add(time.Hour))
	finish("prune/old-failed", checkpoint.RunFailed, t0)
	finish("prune/running", checkpoint.RunRunning, t0)
	finish("prune/new-ok", checkpoint.RunSucceeded, cutoff)
	a := audit("", "prune", cutoff.Add(time.Hour))
	dry, err := op.Prune(e.ctx, a, cutoff, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"prune/old-ok", "prune/old-abandoned"}
	if !slices.Equal(dry.Runs, want) || dry.Steps != 2 || dry.Items != 2 || dry.Bytes <= 0 {
		t.Errorf("dry prune = %+v; want runs %v, 2 steps, 2 items, some bytes", dry, want)
	}
	if got := e.steps(st, "prune/old-ok"); string(got["load"].Output) == "" {
		t.Errorf("a dry prune removed a payload")
	}
	res, err := op.Prune(e.ctx, a, cutoff, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Runs, want) || res.Steps != dry.Steps || res.Items != dry.Items || res.Bytes != dry.Bytes {
		t.Errorf("prune = %+v; want what the dry run counted, %+v", res, dry)
	}
	for _, id := range want {
		r := e.run(st, id).Run
		if !sameTime(r.PrunedAt, a.At) {
			t.Errorf("pruned run %s = %+v; want its tombstone, pruned at %s", id, r, a.At)
		}
		if s := e.steps(st, id)["load"]; len(s.Output) != 0 || s.Status != checkpoint.StepCompleted {
			t.Errorf("step of pruned run %s = %+v; want its status kept and its output gone", id, s)
		}
		if got := e.items(st, checkpoint.ItemQuery{RunID: id, Step: "post"}); len(got) != 0 {
			t.Errorf("items of pruned run %s = %+v; want none", id, got)
		}
		req := claimReq(id, ownerB, a.At)
		req.Force = true
		if _, err := st.Claim(e.ctx, req); !errors.Is(err, checkpoint.ErrPruned) {
			t.Errorf("forced claim of pruned run %s: %v; want ErrPruned", id, err)
		}
		if got := e.commands(op, id); !slices.Equal(got, []string{"prune"}) {
			t.Errorf("audit of pruned run %s = %v; want the prune", id, got)
		}
		if err := op.ResetSteps(e.ctx, audit(id, "reset", a.At), a.At, []string{"load"}); !errors.Is(err, checkpoint.ErrPruned) {
			t.Errorf("reset of pruned run %s: %v; want ErrPruned", id, err)
		}
	}
	for _, id := range []string{"prune/old-failed", "prune/running", "prune/new-ok"} {
		if s := e.steps(st, id)["load"]; string(s.Output) != `{"big":"payload"}` || !e.run(st, id).Run.PrunedAt.IsZero() {
			t.Errorf("run %s not due for pruning lost its payload or got a tombstone", id)
		}
	}
}

// opPruneDeletesIdempotencyKeys is the Operations test PruneDeletesIdempotencyKeys.
//
// Longer than 80 lines: one prune scenario on one database, each check reading what the last left.
func opPruneDeletesIdempotencyKeys(t *testing.T, h Harness) {
	e, st, op := opHosts(t, h)
	ik := capability[checkpoint.IdempotencyStore](t, st, "idempotency keys")
	finish := func(id, status string, at time.Time) {
		c := e.claim(st, id, ownerA, at.Add(-time.Hour))
		e.inTx(st, c.Lease, func(tx checkpoint.Tx) error { return tx.PutStep(completed("load", `1`)) })
		if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: status, At: at}); err != nil {
			t.Fatal(err)
		}
	}
	key := func(scope, k, runID string) checkpoint.IdempotencyKey {
		return checkpoint.IdempotencyKey{Scope: scope, Key: k, RequestHash: "h-" + runID, Job: "prune", Params: []byte(params), RunID: runID, CreatedAt: t0}
	}
	// begin records a key naming runID, done unless accepting.
	begin := func(k checkpoint.IdempotencyKey, accepting bool) {
		rec, begun, err := ik.BeginIdempotency(e.ctx, k, t0.Add(-time.Minute))
		if err != nil || !begun {
			t.Fatalf("BeginIdempotency %s/%s: %v, begun %v", k.Scope, k.Key, err, begun)
		}
		if !accepting {
			if err := ik.FinishIdempotency(e.ctx, rec, t0); err != nil {
				t.Fatal(err)
			}
		}
	}
	// recorded says whether k is still recorded, and checks it names
	// its run; a key found gone is recorded again, as a fresh start
	// with it would.
	recorded := func(k checkpoint.IdempotencyKey) bool {
		t.Helper()
		rec, begun, err := ik.BeginIdempotency(e.ctx, k, t0.Add(-time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if !begun && rec.RunID != k.RunID {
			t.Errorf("key %s/%s names %s; want %s", k.Scope, k.Key, rec.RunID, k.RunID)
		}
		return !begun
	}
	cutoff := t0.Add(30 * 24 * time.Hour)
	finish("keys/old-ok", checkpoint.RunSucceeded, t0)
	finish("keys/old-abandoned", checkpoint.RunAbandoned, t0.Add(time.Hour))
	finish("keys/old-failed", checkpoint.RunFailed, t0)
	finish("keys/new-ok", checkpoint.RunSucceeded, cutoff)
	gone := []checkpoint.IdempotencyKey{
		key("token:a", "k-1", "keys/old-ok"),
		key("token:b", "k-1", "keys/old-ok"), // the same key of another caller
		key("token:a", "k-2", "keys/old-ok"), // still accepting: goes too
	}
	begin(gone[0], false)
	begin(gone[1], false)
	begin(gone[2], true)
	kept := []checkpoint.IdempotencyKey{
		key("token:a", "k-3", "keys/old-failed"),
		key("token:a", "k-4", "keys/new-ok"),
		key("token:a", "k-5", "keys/never-started"),
	}
	for _, k := range kept {
		begin(k, false)
	}

	a := audit("", "prune", cutoff.Add(time.Hour))
	dry, err := op.Prune(e.ctx, a, cutoff, true)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"keys/old-ok", "keys/old-abandoned"}; !slices.Equal(dry.Runs, want) || dry.IdempotencyKeys != 3 {
		t.Errorf("dry prune = %+v; want runs %v and 3 idempotency keys", dry, want)
	}
	for _, k := range gone {
		if !recorded(k) {
			t.Errorf("a dry prune deleted the key %s/%s", k.Scope, k.Key)
		}
	}
	res, err := op.Prune(e.ctx, a, cutoff, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Runs, dry.Runs) || res.IdempotencyKeys != 3 {
		t.Errorf("prune = %+v; want what the dry run counted, %+v", res, dry)
	}
	for _, k := range gone {
		if recorded(k) {
			t.Errorf("after the prune of %s, its key %s/%s is still recorded", k.RunID, k.Scope, k.Key)
		}
	}
	for _, k := range kept {
		if !recorded(k) {
			t.Errorf("the prune deleted the key %s/%s of %s, a run it did not prune", k.Scope, k.Key, k.RunID)
		}
	}
	for id, want := range map[string]string{"keys/old-ok": ", 3 idempotency keys", "keys/old-abandoned": ""} {
		as, err := op.Audits(e.ctx, id)
		if err != nil || len(as) != 1 || !strings.HasSuffix(as[0].Details, " bytes"+want) {
			t.Errorf("audit of pruned run %s = %+v, %v; want the prune, its details ending %q", id, as, err, " bytes"+want)
		}
	}
	// Nothing more to prune, no key counted.
	if again, err := op.Prune(e.ctx, a, cutoff, false); err != nil || len(again.Runs) != 0 || again.IdempotencyKeys != 0 {
		t.Errorf("a second prune = %+v, %v; want nothing", again, err)
	}
}

// opAuditKeepsOrder is the Operations test AuditKeepsOrder.
func opAuditKeepsOrder(t *testing.T, h Harness) {
	e, st, op := opHosts(t, h)
	c := e.claim(st, "ops/8", ownerA, t0)
	if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunFailed, Error: "boom", At: t0}); err != nil {
		t.Fatal(err)
	}
	// Recorded times go back and forth: the log keeps the order of
	// recording. (Resets of no step: each records its audit and changes
	// nothing else a reader here looks at.)
	for i, at := range []time.Time{t0.Add(time.Hour), t0, t0.Add(2 * time.Hour)} {
		a := audit("ops/8", []string{"rerun", "note", "rerun-again"}[i], at)
		a.Details = "d"
		if err := op.ResetSteps(e.ctx, a, at, nil); err != nil {
			t.Fatal(err)
		}
	}
	as, err := op.Audits(e.ctx, "ops/8")
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != 3 || as[0].Command != "rerun" || as[1].Command != "note" || as[2].Command != "rerun-again" ||
		!sameTime(as[1].At, t0) || as[0].Operator != "ops@host-c" || as[0].Reason != "conformance" || as[0].Details != "d" || as[0].RunID != "ops/8" {
		t.Errorf("audit = %+v; want the three records in the order recorded, as given", as)
	}
}

// opResetWithFence: a reset judged at an older fence (an attempt claimed
// the run since its caller read what it clears) clears nothing.
func opResetWithFence(t *testing.T, h Harness) {
	e, st, op := opHosts(t, h)
	c := e.claim(st, "ops/9", ownerA, t0)
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error { return tx.PutStep(completed("pay", `1`)) })
	now := t0.Add(2 * lease)
	judged := c.Lease.Fence
	c2 := e.claim(st, "ops/9", ownerB, now)
	if err := st.Finish(e.ctx, c2.Lease, checkpoint.Ending{Status: checkpoint.RunFailed, At: now}); err != nil {
		t.Fatal(err)
	}
	err := op.ResetSteps(e.ctx, audit("ops/9", "reset", now), now, []string{"pay"}, goneA, checkpoint.WithFence(judged))
	if !errors.Is(err, checkpoint.ErrRunChanged) {
		t.Fatalf("reset judged at fence %d, run at %d: %v; want ErrRunChanged", judged, c2.Lease.Fence, err)
	}
	if _, ok := e.steps(st, "ops/9")["pay"]; !ok {
		t.Errorf("the refused reset cleared the step")
	}
	if got := e.commands(op, "ops/9"); len(got) != 0 {
		t.Errorf("audit after a refused reset: %v; want none", got)
	}
	if err := op.ResetSteps(e.ctx, audit("ops/9", "reset", now), now, []string{"pay"}, goneA, checkpoint.WithFence(c2.Lease.Fence)); err != nil {
		t.Fatalf("reset judged at the run's fence: %v", err)
	}
	if _, ok := e.steps(st, "ops/9")["pay"]; ok {
		t.Errorf("the reset kept the step")
	}
}

// opResolveReplace: a resolution is kept in the step's call record and
// can be replaced until a checkpoint recorded by a later attempt may have
// used it.
func opResolveReplace(t *testing.T, h Harness) {
	e, st, op := opHosts(t, h)
	c := e.claim(st, "ops/8", ownerA, t0)
	rec := checkpoint.CallRecord{Key: "ops/8/pay", OutputShape: []byte(`{"type":"string"}`)}
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(checkpoint.Step{ID: "pay", Status: checkpoint.StepCalling, StartedAt: t0, FinishedAt: t0, Call: rec.Encode()}); err != nil {
			return err
		}
		return tx.PutStep(completed("load", `1`))
	})
	now := t0.Add(time.Second)
	replace := checkpoint.WithReplace()
	if err := op.ResolveStep(e.ctx, audit("ops/8", "resolve", now), now, "load", true, []byte(`2`), goneA, replace); !errors.Is(err, checkpoint.ErrNotResolved) {
		t.Errorf("replace on a step no operator resolved: %v; want ErrNotResolved", err)
	}
	if err := op.ResolveStep(e.ctx, audit("ops/8", "resolve", now), now, "pay", true, []byte(`"r-1"`), goneA); err != nil {
		t.Fatalf("resolve: %v", err)
	}
	got, err := checkpoint.DecodeCallRecord(e.steps(st, "ops/8")["pay"].Call)
	if err != nil || got.Key != rec.Key || string(got.OutputShape) != string(rec.OutputShape) || got.Resolved == nil ||
		got.Resolved.As != "done" || got.Resolved.AfterAttempt != c.Lease.Attempt {
		t.Fatalf("call record after resolve: %+v (%v); want the key, the shape and the resolution after attempt %d", got, err, c.Lease.Attempt)
	}
	if err := op.ResolveStep(e.ctx, audit("ops/8", "resolve", now), now, "pay", true, []byte(`"r-2"`), goneA); !errors.Is(err, checkpoint.ErrNotUnknown) {
		t.Errorf("resolve again without replace: %v; want ErrNotUnknown", err)
	}
	later := now.Add(time.Minute)
	if err := op.ResolveStep(e.ctx, audit("ops/8", "resolve --replace", later), later, "pay", true, []byte(`"r-2"`), goneA, replace); err != nil {
		t.Fatalf("replace an unused resolution: %v", err)
	}
	if s := e.steps(st, "ops/8")["pay"]; s.Status != checkpoint.StepCompleted || string(s.Output) != `"r-2"` {
		t.Errorf("step after replace = %+v; want completed with the new output", s)
	}
	// A later attempt that records nothing has not used it; one that
	// records a step has.
	e.claim(st, "ops/8", ownerB, later.Add(time.Second))
	if err := op.ResolveStep(e.ctx, audit("ops/8", "resolve --replace", later), later, "pay", false, nil, checkpoint.WithOwnerGone(func(string) bool { return true }), replace); err != nil {
		t.Fatalf("replace after an attempt that recorded nothing: %v", err)
	}
	c3 := e.claim(st, "ops/8", ownerA, later.Add(2*lease))
	e.inTx(st, c3.Lease, func(tx checkpoint.Tx) error { return tx.PutStep(completed("report", `3`)) })
	if err := op.ResolveStep(e.ctx, audit("ops/8", "resolve --replace", later), later, "pay", true, []byte(`"r-3"`), goneA, replace); !errors.Is(err, checkpoint.ErrResolutionUsed) ||
		!strings.Contains(err.Error(), "report") {
		t.Errorf("replace after a later step was recorded: %v; want ErrResolutionUsed naming report", err)
	}
	if got := e.commands(op, "ops/8"); !slices.Equal(got, []string{"resolve", "resolve --replace", "resolve --replace"}) {
		t.Errorf("audit = %v; want the resolve and the two replaces that happened", got)
	}
}
