package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

func failedRun(t *testing.T, h Harness) (*env, checkpoint.Store, operator, checkpoint.Claim) {
	e := newEnv(t, h)
	st := e.open()
	op := capability[operator](t, st, "operator actions")
	c := e.claim(st, "resume/1", ownerA, t0)
	if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunFailed, Error: "boom", At: t0.Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	return e, st, op, c
}

// testClaimAudits checks that an operator's record of a claim
// (ClaimRequest.Audits) commits with the claim or not at all, and that an
// operation whose record cannot be kept changes nothing.
func testClaimAudits(t *testing.T, h Harness) {
	// failedRun claims runID and records its attempt failed: a run an
	// operator resumes.

	t.Run("RecordedWithTheClaim", func(t *testing.T) { claimAuditRecordedWithTheClaim(t, h) })
	t.Run("RecordRefusedClaimsNothing", func(t *testing.T) { claimAuditRecordRefusedClaimsNothing(t, h) })
	t.Run("HeldRunRecordsNothing", func(t *testing.T) { claimAuditHeldRunRecordsNothing(t, h) })
	t.Run("OperationRecordRefusedChangesNothing", func(t *testing.T) { claimAuditOperationRecordRefusedChangesNothing(t, h) })
}

// claimAuditRecordedWithTheClaim is the ClaimAudits test RecordedWithTheClaim.
func claimAuditRecordedWithTheClaim(t *testing.T, h Harness) {
	e, st, op, c := failedRun(t, h)
	now := t0.Add(time.Hour)
	req := claimReq("resume/1", ownerB, now)
	a := audit("resume/1", "resume", now)
	a.Reason, a.Details = "the bank is back\nsecond line", "via HTTP API"
	req.Audits = []checkpoint.Audit{a}
	c2, err := st.Claim(e.ctx, req)
	if err != nil {
		t.Fatalf("claim with an audit record: %v", err)
	}
	if c2.Lease.Fence <= c.Lease.Fence || c2.Lease.Attempt != 2 {
		t.Errorf("claim = %+v; want attempt 2 under a higher fence", c2.Lease)
	}
	as, err := op.Audits(e.ctx, "resume/1")
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != 1 || as[0].Command != "resume" || as[0].Reason != a.Reason || as[0].Details != a.Details ||
		as[0].Operator != a.Operator || !sameTime(as[0].At, now) {
		t.Errorf("audit = %+v; want the claim's record as given", as)
	}
	// A claim that creates its run records its audits too.
	req = claimReq("resume/new", ownerB, now)
	req.Audits = []checkpoint.Audit{audit("resume/new", "backfill --reprocess", now)}
	if c3, err := st.Claim(e.ctx, req); err != nil || !c3.Created {
		t.Fatalf("creating claim with an audit record: %+v, %v", c3, err)
	}
	if got := e.commands(op, "resume/new"); !slices.Equal(got, []string{"backfill --reprocess"}) {
		t.Errorf("audit of the created run = %v; want its claim's record", got)
	}
}

// claimAuditRecordRefusedClaimsNothing is the ClaimAudits test RecordRefusedClaimsNothing.
func claimAuditRecordRefusedClaimsNothing(t *testing.T, h Harness) {
	e, st, op, _ := failedRun(t, h)
	before := e.run(st, "resume/1")
	now := t0.Add(time.Hour)
	for name, bad := range map[string]func(*checkpoint.Audit){
		"NUL in the reason":     func(a *checkpoint.Audit) { a.Reason = "why\x00not" },
		"operator not UTF-8":    func(a *checkpoint.Audit) { a.Operator = "ops\xff" },
		"second record refused": nil,
	} {
		req := claimReq("resume/1", ownerB, now)
		a := audit("resume/1", "resume", now)
		if bad != nil {
			bad(&a)
			req.Audits = []checkpoint.Audit{a}
		} else {
			b := a
			b.Details = "\x00"
			req.Audits = []checkpoint.Audit{a, b}
		}
		if _, err := st.Claim(e.ctx, req); !errors.Is(err, checkpoint.ErrBadAudit) {
			t.Errorf("%s: claim = %v; want ErrBadAudit", name, err)
		}
	}
	after := e.run(st, "resume/1")
	if r := after.Run; r.Status != checkpoint.RunFailed || r.Fence != before.Run.Fence || r.LeaseOwner != "" || len(after.Attempts) != 1 {
		t.Errorf("run after refused claims = %+v with %d attempts; want it as it was (failed, fence %d, no lease, 1 attempt)",
			r, len(after.Attempts), before.Run.Fence)
	}
	if got := e.commands(op, "resume/1"); len(got) != 0 {
		t.Errorf("audit after refused claims = %v; want none", got)
	}
	// A creating claim whose record is refused creates nothing.
	req := claimReq("resume/none", ownerB, now)
	a := audit("resume/none", "backfill --reprocess", now)
	a.Reason = "\x00"
	req.Audits = []checkpoint.Audit{a}
	if _, err := st.Claim(e.ctx, req); !errors.Is(err, checkpoint.ErrBadAudit) {
		t.Errorf("creating claim with a refused record = %v; want ErrBadAudit", err)
	}
	if _, err := st.Run(e.ctx, "resume/none"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("run of a creating claim refused for its record: %v; want ErrNotFound", err)
	}
	// The run is still the operator's to resume: the next claim is
	// attempt 2, one fence above the first.
	if c2 := e.claim(st, "resume/1", ownerB, now); c2.Lease.Attempt != 2 || c2.Lease.Fence != before.Run.Fence+1 {
		t.Errorf("claim after refused ones = %+v; want attempt 2 at fence %d", c2.Lease, before.Run.Fence+1)
	}
}

// claimAuditHeldRunRecordsNothing is the ClaimAudits test HeldRunRecordsNothing.
func claimAuditHeldRunRecordsNothing(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	op := capability[operator](t, st, "operator actions")
	e.claim(st, "resume/2", ownerA, t0)
	req := claimReq("resume/2", ownerB, t0.Add(time.Second))
	req.Audits = []checkpoint.Audit{audit("resume/2", "resume", t0)}
	var held *checkpoint.LeaseHeldError
	if _, err := st.Claim(e.ctx, req); !errors.As(err, &held) {
		t.Fatalf("claim of a held run = %v; want a *LeaseHeldError", err)
	}
	if got := e.commands(op, "resume/2"); len(got) != 0 {
		t.Errorf("audit after a refused claim = %v; want none: the resume did not happen", got)
	}
	// A record of another run is refused before anything is read.
	req = claimReq("resume/2", ownerB, t0.Add(lease))
	req.Audits = []checkpoint.Audit{audit("resume/other", "resume", t0)}
	if _, err := st.Claim(e.ctx, req); err == nil {
		t.Errorf("claim carrying another run's audit record succeeded; want it refused")
	}
}

// claimAuditOperationRecordRefusedChangesNothing is the ClaimAudits test OperationRecordRefusedChangesNothing.
func claimAuditOperationRecordRefusedChangesNothing(t *testing.T, h Harness) {
	e, st, op, _ := failedRun(t, h)
	before := e.run(st, "resume/1")
	now := t0.Add(time.Hour)
	a := audit("resume/1", "abandon", now)
	a.Reason = "gone\x00"
	if err := op.Abandon(e.ctx, a, now); !errors.Is(err, checkpoint.ErrBadAudit) {
		t.Errorf("abandon with a NUL in its reason = %v; want ErrBadAudit", err)
	}
	a.Command = "reset --step s"
	if err := op.ResetSteps(e.ctx, a, now, []string{"s"}); !errors.Is(err, checkpoint.ErrBadAudit) {
		t.Errorf("reset with a NUL in its reason = %v; want ErrBadAudit", err)
	}
	after := e.run(st, "resume/1")
	if after.Run.Status != checkpoint.RunFailed || after.Run.Fence != before.Run.Fence {
		t.Errorf("run after refused operations = %+v; want it as it was (failed, fence %d)", after.Run, before.Run.Fence)
	}
	if got := e.commands(op, "resume/1"); len(got) != 0 {
		t.Errorf("audit after refused operations = %v; want none", got)
	}
}
