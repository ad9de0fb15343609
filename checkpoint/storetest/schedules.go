package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// schedReq is a claim of schedule name by owner at now with the suite's
// lease.
func schedReq(name, owner string, now time.Time) checkpoint.ScheduleClaimRequest {
	return checkpoint.ScheduleClaimRequest{Name: name, Owner: owner, Now: now, LeaseFor: lease}
}

// schedule returns the stored state of one schedule.
func (e *env) schedule(s schedules, name string) checkpoint.ScheduleState {
	e.t.Helper()
	all, err := s.Schedules(e.ctx)
	if err != nil {
		e.t.Fatalf("Schedules: %v", err)
	}
	for _, st := range all {
		if st.Name == name {
			return st
		}
	}
	e.t.Fatalf("schedule %s is not listed in %+v", name, all)
	return checkpoint.ScheduleState{}
}

func scheduleHosts(t *testing.T, h Harness) (*env, schedules, schedules) {
	e := newEnv(t, h)
	return e, capability[schedules](t, e.open(), "schedule store"), capability[schedules](t, e.open(), "schedule store")
}

func claimSchedule(t *testing.T, e *env, s schedules, req checkpoint.ScheduleClaimRequest) checkpoint.ScheduleClaim {
	t.Helper()
	c, err := s.ClaimSchedule(e.ctx, req)
	if err != nil {
		t.Fatalf("claim schedule %s for %s: %v", req.Name, req.Owner, err)
	}
	return c
}

func testSchedules(t *testing.T, h Harness) {
	callerClock(t, h, "CreatedWithSettleMarkNow", scheduleCreatedWithSettleMarkNow)
	callerClock(t, h, "LiveLeaseIsHeld", scheduleLiveLeaseIsHeld)
	callerClock(t, h, "TakeOver", scheduleTakeOver)
	callerClock(t, h, "WritesAreFenced", scheduleWritesAreFenced)
	t.Run("SettleMarkNeverMovesBack", func(t *testing.T) { scheduleSettleMarkNeverMovesBack(t, h) })
	t.Run("ReleasedIsClaimedAtOnce", func(t *testing.T) { scheduleReleasedIsClaimedAtOnce(t, h) })
	t.Run("RequestIsValidated", func(t *testing.T) { scheduleRequestIsValidated(t, h) })
	testSchedulePause(t, h)
}

// scheduleCreatedWithSettleMarkNow is the Schedules test CreatedWithSettleMarkNow.
func scheduleCreatedWithSettleMarkNow(t *testing.T, h Harness) {
	e, a, b := scheduleHosts(t, h)
	c := claimSchedule(t, e, a, schedReq("nightly", ownerA, t0))
	if !c.Created || c.Lease != (checkpoint.ScheduleLease{Name: "nightly", Owner: ownerA, Fence: 1}) || c.TookOverFrom != "" {
		t.Errorf("first claim = %+v; want created, fence 1, owner %s", c, ownerA)
	}
	s := e.schedule(b, "nightly")
	if !sameTime(s.LastFire, t0) || s.Fence != 1 || s.LeaseOwner != ownerA || !sameTime(s.LeaseUntil, t0.Add(lease)) ||
		!sameTime(s.CreatedAt, t0) || !sameTime(s.UpdatedAt, t0) {
		t.Errorf("stored schedule = %+v; want settle mark %s (the claim's time), fence 1, held by %s until %s", s, t0, ownerA, t0.Add(lease))
	}
	claimSchedule(t, e, a, schedReq("hourly", ownerA, t0))
	all, err := b.Schedules(e.ctx)
	if err != nil || len(all) != 2 || all[0].Name != "hourly" || all[1].Name != "nightly" {
		t.Errorf("Schedules = %+v, %v; want hourly, nightly (by name)", all, err)
	}
}

// scheduleLiveLeaseIsHeld is the Schedules test LiveLeaseIsHeld.
func scheduleLiveLeaseIsHeld(t *testing.T, h Harness) {
	e, a, b := scheduleHosts(t, h)
	claimSchedule(t, e, a, schedReq("nightly", ownerA, t0))
	_, err := b.ClaimSchedule(e.ctx, schedReq("nightly", ownerB, t0.Add(lease-time.Microsecond)))
	var held *checkpoint.ScheduleHeldError
	if !errors.As(err, &held) {
		t.Fatalf("claim of a held schedule: %v; want *ScheduleHeldError", err)
	}
	if held.Name != "nightly" || held.Owner != ownerA || !sameTime(held.Until, t0.Add(lease)) {
		t.Errorf("ScheduleHeldError = %+v; want nightly held by %s until %s", held, ownerA, t0.Add(lease))
	}
	// The owner itself claims again: a new fence, nothing taken over.
	c := claimSchedule(t, e, a, schedReq("nightly", ownerA, t0.Add(time.Second)))
	if c.Lease.Fence != 2 || c.TookOverFrom != "" || c.Created {
		t.Errorf("the owner's second claim = %+v; want fence 2 and nothing taken over", c)
	}
}

// scheduleTakeOver is the Schedules test TakeOver.
func scheduleTakeOver(t *testing.T, h Harness) {
	e, a, b := scheduleHosts(t, h)
	ca := claimSchedule(t, e, a, schedReq("nightly", ownerA, t0))
	fire := t0.Add(24 * time.Hour)
	if err := a.SettleSchedule(e.ctx, ca.Lease, fire, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	req := schedReq("nightly", ownerB, t0.Add(2*time.Second))
	req.OwnerGone = func(owner string) bool { return owner == ownerA }
	cb := claimSchedule(t, e, b, req)
	if cb.Lease.Fence != 2 || cb.TookOverFrom != ownerA || !sameTime(cb.State.LastFire, fire) {
		t.Errorf("takeover from a gone owner = %+v; want fence 2 from %s, settle mark %s kept", cb, ownerA, fire)
	}
	cc := claimSchedule(t, e, a, schedReq("nightly", ownerC, cb.State.LeaseUntil))
	if cc.Lease.Fence != 3 || cc.TookOverFrom != ownerB {
		t.Errorf("takeover of an expired lease = %+v; want fence 3 from %s", cc, ownerB)
	}
}

// scheduleWritesAreFenced is the Schedules test WritesAreFenced.
func scheduleWritesAreFenced(t *testing.T, h Harness) {
	e, a, b := scheduleHosts(t, h)
	ca := claimSchedule(t, e, a, schedReq("nightly", ownerA, t0))
	cb := claimSchedule(t, e, b, schedReq("nightly", ownerB, t0.Add(lease)))
	if err := a.RenewSchedule(e.ctx, ca.Lease, t0.Add(lease), t0.Add(10*lease)); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("renew of a lease taken over: %v; want ErrFenced", err)
	}
	if err := a.SettleSchedule(e.ctx, ca.Lease, t0.Add(time.Hour), t0.Add(lease)); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("settle under a lease taken over: %v; want ErrFenced", err)
	}
	if err := a.ReleaseSchedule(e.ctx, ca.Lease, t0.Add(lease)); err != nil {
		t.Errorf("release of a lease already lost: %v; want no error", err)
	}
	s := e.schedule(b, "nightly")
	if !sameTime(s.LastFire, t0) || s.LeaseOwner != ownerB || !sameTime(s.LeaseUntil, t0.Add(2*lease)) || s.Fence != cb.Lease.Fence {
		t.Errorf("schedule after the fenced writes = %+v; want B's lease and the settle mark untouched", s)
	}
	if err := b.RenewSchedule(e.ctx, cb.Lease, t0.Add(lease+time.Second), t0.Add(5*lease)); err != nil {
		t.Errorf("renew by the holder: %v", err)
	}
	if s := e.schedule(a, "nightly"); !sameTime(s.LeaseUntil, t0.Add(5*lease)) {
		t.Errorf("lease after renewal runs until %s; want %s", s.LeaseUntil, t0.Add(5*lease))
	}
}

// scheduleSettleMarkNeverMovesBack is the Schedules test SettleMarkNeverMovesBack.
func scheduleSettleMarkNeverMovesBack(t *testing.T, h Harness) {
	e, a, _ := scheduleHosts(t, h)
	c := claimSchedule(t, e, a, schedReq("nightly", ownerA, t0))
	later, earlier := t0.Add(48*time.Hour), t0.Add(24*time.Hour)
	for _, fire := range []time.Time{later, earlier} {
		if err := a.SettleSchedule(e.ctx, c.Lease, fire, t0.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if s := e.schedule(a, "nightly"); !sameTime(s.LastFire, later) {
		t.Errorf("settle mark = %s; want %s (it never moves back)", s.LastFire, later)
	}
	if err := a.SettleSchedule(e.ctx, c.Lease, time.Time{}, t0); err == nil {
		t.Errorf("settling a zero fire time succeeded; want an error")
	}
}

// scheduleReleasedIsClaimedAtOnce is the Schedules test ReleasedIsClaimedAtOnce.
func scheduleReleasedIsClaimedAtOnce(t *testing.T, h Harness) {
	e, a, b := scheduleHosts(t, h)
	ca := claimSchedule(t, e, a, schedReq("nightly", ownerA, t0))
	if err := a.ReleaseSchedule(e.ctx, ca.Lease, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if s := e.schedule(b, "nightly"); s.LeaseOwner != "" || !s.LeaseUntil.IsZero() {
		t.Errorf("released schedule = %+v; want no lease", s)
	}
	cb := claimSchedule(t, e, b, schedReq("nightly", ownerB, t0.Add(2*time.Second)))
	if cb.Lease.Fence != 2 || cb.TookOverFrom != "" {
		t.Errorf("claim of a released schedule = %+v; want fence 2 and nothing taken over", cb)
	}
}

// scheduleRequestIsValidated is the Schedules test RequestIsValidated.
func scheduleRequestIsValidated(t *testing.T, h Harness) {
	e, a, _ := scheduleHosts(t, h)
	for name, req := range map[string]checkpoint.ScheduleClaimRequest{
		"no name":  {Owner: ownerA, Now: t0, LeaseFor: lease},
		"no owner": {Name: "n", Now: t0, LeaseFor: lease},
		"no time":  {Name: "n", Owner: ownerA, LeaseFor: lease},
		"no lease": {Name: "n", Owner: ownerA, Now: t0},
	} {
		if _, err := a.ClaimSchedule(e.ctx, req); err == nil {
			t.Errorf("schedule claim with %s succeeded; want an error", name)
		}
	}
	if all, err := a.Schedules(e.ctx); err != nil || len(all) != 0 {
		t.Errorf("schedules after refused claims = %+v, %v; want none", all, err)
	}
}
