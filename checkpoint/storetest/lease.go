package storetest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

func testClaimAndLease(t *testing.T, h Harness) {
	callerClock(t, h, "CreateRecordsRunAndAttempt", claimCreateRecordsRunAndAttempt)
	callerClock(t, h, "RequestIsValidated", claimRequestIsValidated)
	callerClock(t, h, "LiveLeaseIsHeld", claimLiveLeaseIsHeld)
	callerClock(t, h, "ExpiredLeaseIsTakenOver", claimExpiredLeaseIsTakenOver)
	callerClock(t, h, "OwnerGoneIsTakenOverAtOnce", claimOwnerGoneIsTakenOverAtOnce)
	t.Run("FinishedRunsResume", func(t *testing.T) { claimFinishedRunsResume(t, h) })
	t.Run("SucceededAndAbandonedNeedForce", func(t *testing.T) { claimSucceededAndAbandonedNeedForce(t, h) })
	t.Run("ForceDoesNotBreakALiveLease", func(t *testing.T) { claimForceDoesNotBreakALiveLease(t, h) })
	t.Run("ParamsMismatch", func(t *testing.T) { claimParamsMismatch(t, h) })
	callerClock(t, h, "FencesGrow", claimFencesGrow)
	callerClock(t, h, "Heartbeat", claimHeartbeat)
	callerClock(t, h, "ExpiredLeaseRenewedPastLimit", claimExpiredLeaseRenewedPastLimit)
	t.Run("HeartbeatMustExtend", func(t *testing.T) { claimHeartbeatMustExtend(t, h) })
	callerClock(t, h, "Finish", claimFinish)
	t.Run("UnknownRun", func(t *testing.T) { claimUnknownRun(t, h) })
	t.Run("RunsList", func(t *testing.T) { claimRunsList(t, h) })
	callerClock(t, h, "StaleIsSeenFromTheLease", claimStaleIsSeenFromTheLease)
}

// claimCreateRecordsRunAndAttempt is the ClaimAndLease test CreateRecordsRunAndAttempt.
func claimCreateRecordsRunAndAttempt(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "settle/2031-03-14", ownerA, t0)
	want := checkpoint.Lease{RunID: "settle/2031-03-14", Fence: 1, Attempt: 1, Owner: ownerA}
	if !c.Created || c.Lease != want || c.PreviousStatus != "" || c.TookOverFrom != "" || !c.PreviousLeaseUntil.IsZero() {
		t.Fatalf("claim of a new run = %+v; want Created with lease %+v and nothing taken over", c, want)
	}
	r := c.Run
	if r.ID != want.RunID || r.Job != "settle" || r.RunKey != "2031-03-14" || string(r.Params) != params ||
		r.ParamsHash != "sha256:"+params || r.Status != checkpoint.RunRunning || r.Fence != 1 || r.LeaseOwner != ownerA {
		t.Errorf("claimed run = %+v; want the request's identity and parameters, running at fence 1 held by %s", r, ownerA)
	}
	if !sameTime(r.LeaseUntil, t0.Add(lease)) || !sameTime(r.CreatedAt, t0) || !sameTime(r.UpdatedAt, t0) || !r.FinishedAt.IsZero() {
		t.Errorf("claimed run times = until %s, created %s, updated %s, finished %s; want %s, %s, %s, zero",
			r.LeaseUntil, r.CreatedAt, r.UpdatedAt, r.FinishedAt, t0.Add(lease), t0, t0)
	}
	info := e.run(st, want.RunID)
	if info.Run.Fence != 1 || info.Run.Status != checkpoint.RunRunning {
		t.Errorf("Run after the claim = %+v; want running at fence 1", info.Run)
	}
	if len(info.Attempts) != 1 {
		t.Fatalf("attempts = %+v; want one", info.Attempts)
	}
	a := info.Attempts[0]
	if a.Number != 1 || a.Fence != 1 || a.Owner != ownerA || a.Status != checkpoint.RunRunning ||
		!sameTime(a.StartedAt, t0) || !a.FinishedAt.IsZero() {
		t.Errorf("attempt = %+v; want number 1, fence 1, %s, running since %s", a, ownerA, t0)
	}
}

// claimRequestIsValidated is the ClaimAndLease test RequestIsValidated.
func claimRequestIsValidated(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	for name, mod := range map[string]func(*checkpoint.ClaimRequest){
		"no run ID":      func(r *checkpoint.ClaimRequest) { r.RunID = "" },
		"no owner":       func(r *checkpoint.ClaimRequest) { r.Owner = "" },
		"no time":        func(r *checkpoint.ClaimRequest) { r.Now = time.Time{} },
		"no lease":       func(r *checkpoint.ClaimRequest) { r.LeaseFor = 0 },
		"negative lease": func(r *checkpoint.ClaimRequest) { r.LeaseFor = -time.Second },
	} {
		req := claimReq("check/bad", ownerA, t0)
		mod(&req)
		if _, err := st.Claim(e.ctx, req); err == nil {
			t.Errorf("claim with %s succeeded; want an error", name)
		}
	}
	if _, err := st.Run(e.ctx, "check/bad"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("Run after refused claims: %v; want ErrNotFound (nothing created)", err)
	}
}

// claimLiveLeaseIsHeld is the ClaimAndLease test LiveLeaseIsHeld.
func claimLiveLeaseIsHeld(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	c := e.claim(a, "held/1", ownerA, t0)
	for _, st := range []checkpoint.Store{a, b} {
		_, err := st.Claim(e.ctx, claimReq("held/1", ownerB, t0.Add(lease-time.Microsecond)))
		var held *checkpoint.LeaseHeldError
		if !errors.As(err, &held) {
			t.Fatalf("claim of a held run: %v; want *LeaseHeldError", err)
		}
		if held.RunID != "held/1" || held.Owner != ownerA || !sameTime(held.Until, t0.Add(lease)) {
			t.Errorf("LeaseHeldError = %+v; want run held/1, owner %q, until %s", held, ownerA, t0.Add(lease))
		}
		if msg := err.Error(); !strings.Contains(msg, checkpoint.OwnerName(ownerA)) || strings.Contains(msg, "boot=") {
			t.Errorf("message %q; want the owner's name %q and not its details", msg, checkpoint.OwnerName(ownerA))
		}
	}
	if f, _ := a.Fence(e.ctx, "held/1"); f != c.Lease.Fence {
		t.Errorf("fence after refused claims = %d; want %d", f, c.Lease.Fence)
	}
	if n := len(e.run(b, "held/1").Attempts); n != 1 {
		t.Errorf("attempts after refused claims = %d; want 1", n)
	}
}

// claimExpiredLeaseIsTakenOver is the ClaimAndLease test ExpiredLeaseIsTakenOver.
func claimExpiredLeaseIsTakenOver(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	e.claim(a, "expire/1", ownerA, t0)
	at := t0.Add(lease) // the lease ends at until: a claim at that instant takes over
	c := e.claim(b, "expire/1", ownerB, at)
	if c.Created || c.Lease.Fence != 2 || c.Lease.Attempt != 2 || c.Lease.Owner != ownerB {
		t.Fatalf("takeover = %+v; want fence 2, attempt 2, owner %s", c, ownerB)
	}
	if c.TookOverFrom != ownerA || c.PreviousStatus != checkpoint.RunRunning || !sameTime(c.PreviousLeaseUntil, t0.Add(lease)) {
		t.Errorf("takeover = from %q, previous %q, previous until %s; want %q, running, %s",
			c.TookOverFrom, c.PreviousStatus, c.PreviousLeaseUntil, ownerA, t0.Add(lease))
	}
	info := e.run(a, "expire/1")
	if len(info.Attempts) != 2 {
		t.Fatalf("attempts = %+v; want 2", info.Attempts)
	}
	lost, now := info.Attempts[0], info.Attempts[1]
	if lost.Status != checkpoint.AttemptLost || !sameTime(lost.FinishedAt, at) ||
		!strings.Contains(lost.Error, checkpoint.OwnerName(ownerB)) {
		t.Errorf("taken-over attempt = %+v; want lost at %s, its error naming %s", lost, at, checkpoint.OwnerName(ownerB))
	}
	if now.Number != 2 || now.Fence != 2 || now.Owner != ownerB || now.Status != checkpoint.RunRunning || !sameTime(now.StartedAt, at) {
		t.Errorf("new attempt = %+v; want number 2, fence 2, %s, running since %s", now, ownerB, at)
	}
	if r := info.Run; r.LeaseOwner != ownerB || !sameTime(r.LeaseUntil, at.Add(lease)) || !sameTime(r.CreatedAt, t0) || !sameTime(r.UpdatedAt, at) {
		t.Errorf("run after takeover = %+v; want held by %s until %s, created %s, updated %s", r, ownerB, at.Add(lease), t0, at)
	}
}

// claimOwnerGoneIsTakenOverAtOnce is the ClaimAndLease test OwnerGoneIsTakenOverAtOnce.
func claimOwnerGoneIsTakenOverAtOnce(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	e.claim(a, "gone/1", ownerA, t0)
	var asked []string
	req := claimReq("gone/1", ownerB, t0.Add(time.Second))
	req.OwnerGone = func(owner string) bool { asked = append(asked, owner); return false }
	if _, err := b.Claim(e.ctx, req); !errors.As(err, new(*checkpoint.LeaseHeldError)) {
		t.Fatalf("claim with the owner alive: %v; want *LeaseHeldError", err)
	}
	if len(asked) == 0 || asked[0] != ownerA {
		t.Errorf("OwnerGone asked about %q; want the full owner string %q", asked, ownerA)
	}
	req.OwnerGone = func(owner string) bool { return owner == ownerA }
	c, err := b.Claim(e.ctx, req)
	if err != nil {
		t.Fatalf("claim with the owner gone: %v", err)
	}
	if c.Lease.Fence != 2 || c.TookOverFrom != ownerA || !sameTime(c.PreviousLeaseUntil, t0.Add(lease)) {
		t.Errorf("takeover = %+v; want fence 2 from %s, previous lease until %s (still ahead)", c, ownerA, t0.Add(lease))
	}
}

// claimFinishedRunsResume is the ClaimAndLease test FinishedRunsResume.
func claimFinishedRunsResume(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	for i, status := range []string{checkpoint.RunFailed, checkpoint.RunInterrupted} {
		id := "resume/" + status
		c := e.claim(st, id, ownerA, t0)
		if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: status, Error: "boom", At: t0.Add(time.Second)}); err != nil {
			t.Fatal(err)
		}
		c2 := e.claim(st, id, ownerB, t0.Add(2*time.Second))
		if c2.Created || c2.PreviousStatus != status || c2.TookOverFrom != "" || c2.Lease.Fence != 2 || c2.Lease.Attempt != 2 {
			t.Errorf("case %d: resume of a %s run = %+v; want fence 2, attempt 2, previous %s, nothing taken over", i, status, c2, status)
		}
		if c2.Run.Status != checkpoint.RunRunning || c2.Run.Error != "" {
			t.Errorf("case %d: resumed run = %+v; want running with its error cleared", i, c2.Run)
		}
	}
}

// claimSucceededAndAbandonedNeedForce is the ClaimAndLease test SucceededAndAbandonedNeedForce.
func claimSucceededAndAbandonedNeedForce(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	for _, tc := range []struct {
		status string
		want   error
	}{{checkpoint.RunSucceeded, checkpoint.ErrAlreadySucceeded}, {checkpoint.RunAbandoned, checkpoint.ErrAbandoned}} {
		id := "force/" + tc.status
		c := e.claim(st, id, ownerA, t0)
		if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: tc.status, At: t0.Add(time.Second)}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Claim(e.ctx, claimReq(id, ownerB, t0.Add(2*time.Second))); !errors.Is(err, tc.want) {
			t.Errorf("claim of a %s run: %v; want %v", tc.status, err, tc.want)
		}
		if f, _ := st.Fence(e.ctx, id); f != 1 {
			t.Errorf("fence after the refused claim of a %s run = %d; want 1", tc.status, f)
		}
		req := claimReq(id, ownerB, t0.Add(3*time.Second))
		req.Force = true
		c2, err := st.Claim(e.ctx, req)
		if err != nil {
			t.Fatalf("forced claim of a %s run: %v", tc.status, err)
		}
		if c2.Lease.Fence != 2 || c2.PreviousStatus != tc.status || c2.Run.Status != checkpoint.RunRunning || !c2.Run.FinishedAt.IsZero() {
			t.Errorf("forced claim of a %s run = %+v; want fence 2, running again, unfinished", tc.status, c2)
		}
	}
}

// claimForceDoesNotBreakALiveLease is the ClaimAndLease test ForceDoesNotBreakALiveLease.
func claimForceDoesNotBreakALiveLease(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	e.claim(st, "force/live", ownerA, t0)
	req := claimReq("force/live", ownerB, t0.Add(time.Second))
	req.Force = true
	if _, err := st.Claim(e.ctx, req); !errors.As(err, new(*checkpoint.LeaseHeldError)) {
		t.Errorf("forced claim of a held run: %v; want *LeaseHeldError (Force reruns finished runs, it does not break leases)", err)
	}
}

// claimParamsMismatch is the ClaimAndLease test ParamsMismatch.
func claimParamsMismatch(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "params/1", ownerA, t0)
	if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunFailed, At: t0}); err != nil {
		t.Fatal(err)
	}
	req := claimReq("params/1", ownerB, t0.Add(time.Second))
	req.Params, req.ParamsHash = []byte(`{"date":"2031-03-15"}`), `sha256:{"date":"2031-03-15"}`
	_, err := st.Claim(e.ctx, req)
	var pm *checkpoint.ParamsMismatchError
	if !errors.As(err, &pm) {
		t.Fatalf("claim with other parameters: %v; want *ParamsMismatchError", err)
	}
	if pm.RunID != "params/1" || pm.Stored != params || pm.Given != string(req.Params) {
		t.Errorf("ParamsMismatchError = %+v; want run params/1, stored %s, given %s", pm, params, req.Params)
	}
	if f, _ := st.Fence(e.ctx, "params/1"); f != 1 {
		t.Errorf("fence after the refused claim = %d; want 1", f)
	}
}

// claimFencesGrow is the ClaimAndLease test FencesGrow.
func claimFencesGrow(t *testing.T, h Harness) {
	e := newEnv(t, h)
	hosts := []checkpoint.Store{e.open(), e.open(), e.open()}
	var last int64
	for i := range 7 {
		st := hosts[i%len(hosts)]
		at := t0.Add(time.Duration(i) * time.Hour)
		c := e.claim(st, "grow/1", ownerA, at)
		if c.Lease.Fence <= last || c.Lease.Attempt != i+1 {
			t.Fatalf("claim %d: fence %d, attempt %d; want a fence above %d and attempt %d", i+1, c.Lease.Fence, c.Lease.Attempt, last, i+1)
		}
		last = c.Lease.Fence
		for j, other := range hosts {
			if f, err := other.Fence(e.ctx, "grow/1"); err != nil || f != last {
				t.Errorf("claim %d: host %d reads fence %d, %v; want %d", i+1, j, f, err, last)
			}
		}
		if i%2 == 0 { // every other claim finds the run failed, the rest find it stale
			if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunFailed, At: at}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// claimHeartbeat is the ClaimAndLease test Heartbeat.
func claimHeartbeat(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	c := e.claim(a, "beat/1", ownerA, t0)
	until := t0.Add(10 * lease)
	if err := a.Heartbeat(e.ctx, c.Lease, t0.Add(30*time.Second), until); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	r := e.run(b, "beat/1").Run
	if !sameTime(r.LeaseUntil, until) || !sameTime(r.UpdatedAt, t0.Add(30*time.Second)) || r.Fence != 1 {
		t.Errorf("run after heartbeat = %+v; want until %s, updated %s, fence 1", r, until, t0.Add(30*time.Second))
	}
	if _, err := b.Claim(e.ctx, claimReq("beat/1", ownerB, t0.Add(2*lease))); !errors.As(err, new(*checkpoint.LeaseHeldError)) {
		t.Errorf("claim after the first lease would have ended but the heartbeat extended it: %v; want *LeaseHeldError", err)
	}
	e.claim(b, "beat/1", ownerB, until)
	if err := a.Heartbeat(e.ctx, c.Lease, until, until.Add(lease)); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("heartbeat of a lease taken over: %v; want ErrFenced", err)
	}
	if r := e.run(a, "beat/1").Run; r.LeaseOwner != ownerB || !sameTime(r.LeaseUntil, until.Add(lease)) {
		t.Errorf("run after the fenced heartbeat = %+v; want B's lease untouched", r)
	}
}

// claimExpiredLeaseRenewedPastLimit is the ClaimAndLease test ExpiredLeaseRenewedPastLimit.
func claimExpiredLeaseRenewedPastLimit(t *testing.T, h Harness) {
	// Limit 1. A's lease expires (A paused); B starts under the limit;
	// A wakes and renews: two runs now hold live leases under limit 1.
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	lim := checkpoint.Limit{Key: "settle:ledger=L", Max: 1}
	ra := claimReq("lim/a", ownerA, t0)
	ra.Limit = lim
	ca, err := a.Claim(e.ctx, ra)
	if err != nil {
		t.Fatal(err)
	}
	later := t0.Add(2 * lease)
	rb := claimReq("lim/b", ownerB, later)
	rb.Limit = lim
	if _, err := b.Claim(e.ctx, rb); err != nil {
		t.Fatalf("B under the limit after A's lease expired: %v", err)
	}
	herr := a.Heartbeat(e.ctx, ca.Lease, later, later.Add(lease))
	rc := claimReq("lim/c", ownerC, later.Add(time.Second))
	rc.Limit = lim
	_, cerr := b.Claim(e.ctx, rc)
	var reached *checkpoint.LimitReachedError
	if herr == nil && errors.As(cerr, &reached) && len(reached.Holders) > 1 {
		t.Errorf("A renewed its expired lease (heartbeat err %v) after B took the limit's only slot: holders now %v (limit %d)",
			herr, reached.Holders, lim.Max)
	}
	if !errors.Is(herr, checkpoint.ErrFenced) || !strings.Contains(herr.Error(), "expired") {
		t.Errorf("heartbeat of an expired lease = %v; want ErrFenced saying the lease expired", herr)
	}
}

// claimHeartbeatMustExtend is the ClaimAndLease test HeartbeatMustExtend.
func claimHeartbeatMustExtend(t *testing.T, h Harness) {
	// A heartbeat whose until is not after its now is a caller's bug:
	// refused on every store, and the lease stays as it was.
	e := newEnv(t, h)
	a := e.open()
	c := e.claim(a, "beat/2", ownerA, t0)
	before := e.run(a, "beat/2").Run
	for _, until := range []time.Time{t0.Add(time.Second), t0} {
		err := a.Heartbeat(e.ctx, c.Lease, t0.Add(time.Second), until)
		if err == nil || errors.Is(err, checkpoint.ErrFenced) || !strings.Contains(err.Error(), "not after") {
			t.Errorf("heartbeat until %s at %s: %v; want an error saying until is not after now", until, t0.Add(time.Second), err)
		}
	}
	if r := e.run(a, "beat/2").Run; !sameTime(r.LeaseUntil, before.LeaseUntil) || r.Fence != before.Fence {
		t.Errorf("run after refused heartbeats = %+v; want the lease as it was (%+v)", r, before)
	}
}

// claimFinish is the ClaimAndLease test Finish.
func claimFinish(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	for _, tc := range []struct {
		status   string
		finished bool
	}{{checkpoint.RunSucceeded, true}, {checkpoint.RunAbandoned, true}, {checkpoint.RunFailed, false}, {checkpoint.RunInterrupted, false}} {
		id := "finish/" + tc.status
		c := e.claim(a, id, ownerA, t0)
		at := t0.Add(time.Minute / 2)
		if err := a.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: tc.status, Error: "why " + tc.status, At: at}); err != nil {
			t.Fatalf("finish %s: %v", tc.status, err)
		}
		info := e.run(b, id)
		r := info.Run
		if r.Status != tc.status || r.Error != "why "+tc.status || r.LeaseOwner != "" || !r.LeaseUntil.IsZero() || !sameTime(r.UpdatedAt, at) {
			t.Errorf("run finished %s = %+v; want that status and error, no lease, updated %s", tc.status, r, at)
		}
		if tc.finished != !r.FinishedAt.IsZero() || (tc.finished && !sameTime(r.FinishedAt, at)) {
			t.Errorf("run finished %s has FinishedAt %s; want %v (set only for succeeded and abandoned)", tc.status, r.FinishedAt, tc.finished)
		}
		if att := info.Attempts[0]; att.Status != tc.status || att.Error != "why "+tc.status || !sameTime(att.FinishedAt, at) {
			t.Errorf("attempt finished %s = %+v; want that status, error and time", tc.status, att)
		}
		if err := a.Heartbeat(e.ctx, c.Lease, at, at.Add(lease)); !errors.Is(err, checkpoint.ErrFenced) {
			t.Errorf("heartbeat after finishing %s: %v; want ErrFenced (the lease is released)", tc.status, err)
		}
	}
	c := e.claim(a, "finish/late", ownerA, t0)
	e.claim(b, "finish/late", ownerB, t0.Add(lease))
	err := a.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: t0.Add(lease)})
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("finish of a lease taken over: %v; want ErrFenced", err)
	}
	info := e.run(b, "finish/late")
	if info.Run.Status != checkpoint.RunRunning || info.Run.LeaseOwner != ownerB || info.Attempts[0].Status != checkpoint.AttemptLost {
		t.Errorf("after the fenced finish: run %+v, first attempt %+v; want B still running and A's attempt lost", info.Run, info.Attempts[0])
	}
}

// claimUnknownRun is the ClaimAndLease test UnknownRun.
func claimUnknownRun(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	if _, err := st.Run(e.ctx, "none/1"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("Run of an unknown run: %v; want ErrNotFound", err)
	}
	if _, err := st.Fence(e.ctx, "none/1"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("Fence of an unknown run: %v; want ErrNotFound", err)
	}
	if got := e.steps(st, "none/1"); len(got) != 0 {
		t.Errorf("Steps of an unknown run = %v; want none", got)
	}
}

// claimRunsList is the ClaimAndLease test RunsList.
func claimRunsList(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	ids := []string{"alpha/1", "beta/1", "alpha/2", "alpha/3"}
	for i, id := range ids {
		c := e.claim(st, id, ownerA, t0.Add(time.Duration(i)*time.Minute))
		if id == "alpha/2" {
			if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: t0.Add(time.Hour)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	list := func(f checkpoint.RunFilter) []string {
		runs, err := st.Runs(e.ctx, f)
		if err != nil {
			t.Fatalf("Runs(%+v): %v", f, err)
		}
		var out []string
		for _, r := range runs {
			out = append(out, r.ID)
		}
		return out
	}
	for _, tc := range []struct {
		f    checkpoint.RunFilter
		want string
	}{
		{checkpoint.RunFilter{}, "alpha/3 alpha/2 beta/1 alpha/1"},
		{checkpoint.RunFilter{Job: "alpha"}, "alpha/3 alpha/2 alpha/1"},
		{checkpoint.RunFilter{Status: checkpoint.RunSucceeded}, "alpha/2"},
		{checkpoint.RunFilter{Job: "alpha", Status: checkpoint.RunRunning}, "alpha/3 alpha/1"},
		{checkpoint.RunFilter{Limit: 2}, "alpha/3 alpha/2"},
		{checkpoint.RunFilter{Job: "gamma"}, ""},
	} {
		if got := strings.Join(list(tc.f), " "); got != tc.want {
			t.Errorf("Runs(%+v) = %q; want %q (newest first)", tc.f, got, tc.want)
		}
	}
}

// claimStaleIsSeenFromTheLease is the ClaimAndLease test StaleIsSeenFromTheLease.
func claimStaleIsSeenFromTheLease(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	e.claim(st, "stale/1", ownerA, t0)
	r := e.run(st, "stale/1").Run
	if r.Stale(t0.Add(lease - time.Microsecond)) {
		t.Errorf("run is stale before its lease ends")
	}
	if !r.Stale(t0.Add(lease)) {
		t.Errorf("run is not stale once its lease ended")
	}
}
