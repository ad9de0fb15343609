package sqlite_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
)

var schedNow = time.Date(2026, 3, 8, 6, 0, 0, 0, time.UTC)

func schedReq(owner string, now time.Time) checkpoint.ScheduleClaimRequest {
	return checkpoint.ScheduleClaimRequest{Name: "nightly", Owner: owner, Now: now, LeaseFor: time.Minute}
}

func mustClaimSchedule(t *testing.T, st checkpoint.ScheduleStore, req checkpoint.ScheduleClaimRequest) checkpoint.ScheduleClaim {
	t.Helper()
	c, err := st.ClaimSchedule(context.Background(), req)
	if err != nil {
		t.Fatalf("claim schedule %s as %s: %v", req.Name, req.Owner, err)
	}
	return c
}

func scheduleState(t *testing.T, st checkpoint.ScheduleStore, name string) checkpoint.ScheduleState {
	t.Helper()
	all, err := st.Schedules(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("schedule %s not stored (have %+v)", name, all)
	return checkpoint.ScheduleState{}
}

func TestClaimScheduleCreatesWithSettleMarkNow(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	c := mustClaimSchedule(t, st, schedReq("a:1", schedNow))
	if !c.Created || c.TookOverFrom != "" {
		t.Errorf("first claim: Created %v TookOverFrom %q; want created, no takeover", c.Created, c.TookOverFrom)
	}
	if want := (checkpoint.ScheduleLease{Name: "nightly", Owner: "a:1", Fence: 1}); c.Lease != want {
		t.Errorf("lease = %+v; want %+v", c.Lease, want)
	}
	// A new schedule starts from now: it has missed nothing.
	s := c.State
	if !s.LastFire.Equal(schedNow) || s.LeaseOwner != "a:1" || !s.LeaseUntil.Equal(schedNow.Add(time.Minute)) || s.Fence != 1 {
		t.Errorf("state = %+v; want last fire %s, leased by a:1 until %s, fence 1", s, schedNow, schedNow.Add(time.Minute))
	}
	if got := scheduleState(t, st, "nightly"); got != s {
		t.Errorf("stored state = %+v; claim returned %+v", got, s)
	}
}

func TestClaimScheduleLiveLeaseIsHeld(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	mustClaimSchedule(t, st, schedReq("a:1", schedNow))
	req := schedReq("b:2", schedNow.Add(59*time.Second))
	var asked string
	req.OwnerGone = func(owner string) bool { asked = owner; return false }
	_, err := st.ClaimSchedule(context.Background(), req)
	var held *checkpoint.ScheduleHeldError
	if !errors.As(err, &held) {
		t.Fatalf("claim of a held schedule: err = %v; want *ScheduleHeldError", err)
	}
	if held.Owner != "a:1" || !held.Until.Equal(schedNow.Add(time.Minute)) || held.Name != "nightly" {
		t.Errorf("held = %+v; want nightly, a:1 until %s", held, schedNow.Add(time.Minute))
	}
	if !strings.Contains(err.Error(), "a:1") || !strings.Contains(err.Error(), "2026-03-08T06:01:00Z") {
		t.Errorf("error %q does not name the owner and the lease end", err)
	}
	if asked != "a:1" {
		t.Errorf("OwnerGone asked about %q; want a:1", asked)
	}
	if s := scheduleState(t, st, "nightly"); s.Fence != 1 || s.LeaseOwner != "a:1" {
		t.Errorf("refused claim changed the schedule: %+v", s)
	}
}

func TestClaimScheduleTakesOver(t *testing.T) {
	for _, tc := range []struct {
		name      string
		at        time.Time
		ownerGone bool
	}{
		{"lease expired", schedNow.Add(time.Minute), false},
		{"owner gone", schedNow.Add(time.Second), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := checkpointtest.OpenSQLite(t)
			mustClaimSchedule(t, st, schedReq("host:111", schedNow))
			req := schedReq("host:222", tc.at)
			req.OwnerGone = func(owner string) bool { return tc.ownerGone && owner == "host:111" }
			c := mustClaimSchedule(t, st, req)
			if c.TookOverFrom != "host:111" || c.Lease.Fence != 2 || c.Created {
				t.Errorf("claim = %+v; want a takeover from host:111 with fence 2", c)
			}
			// The settle mark is kept: the new owner resumes where the
			// old one stopped.
			if !c.State.LastFire.Equal(schedNow) || c.State.LeaseOwner != "host:222" {
				t.Errorf("state = %+v; want last fire %s kept, leased by host:222", c.State, schedNow)
			}
		})
	}
}

func TestScheduleWritesAreFenced(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	ctx := context.Background()
	old := mustClaimSchedule(t, st, schedReq("a:1", schedNow)).Lease
	cur := mustClaimSchedule(t, st, schedReq("b:2", schedNow.Add(2*time.Minute))).Lease

	if err := st.RenewSchedule(ctx, old, schedNow.Add(3*time.Minute), schedNow.Add(time.Hour)); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("RenewSchedule with the old lease: err = %v; want ErrFenced", err)
	}
	if err := st.SettleSchedule(ctx, old, schedNow.Add(time.Hour), schedNow.Add(3*time.Minute)); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("SettleSchedule with the old lease: err = %v; want ErrFenced", err)
	}
	if err := st.ReleaseSchedule(ctx, old, schedNow.Add(3*time.Minute)); err != nil {
		t.Errorf("ReleaseSchedule with a lost lease: %v; want no error (nothing to give up)", err)
	}
	s := scheduleState(t, st, "nightly")
	if !s.LastFire.Equal(schedNow) || s.LeaseOwner != "b:2" || !s.LeaseUntil.Equal(schedNow.Add(3*time.Minute)) {
		t.Errorf("fenced writes changed the schedule: %+v", s)
	}

	// The current lease writes; the settle mark only moves forward.
	if err := st.RenewSchedule(ctx, cur, schedNow.Add(3*time.Minute), schedNow.Add(time.Hour)); err != nil {
		t.Fatalf("RenewSchedule: %v", err)
	}
	if err := st.SettleSchedule(ctx, cur, schedNow.Add(2*time.Hour), schedNow.Add(3*time.Minute)); err != nil {
		t.Fatalf("SettleSchedule: %v", err)
	}
	if err := st.SettleSchedule(ctx, cur, schedNow.Add(time.Hour), schedNow.Add(4*time.Minute)); err != nil {
		t.Fatalf("SettleSchedule back in time: %v", err)
	}
	s = scheduleState(t, st, "nightly")
	if !s.LastFire.Equal(schedNow.Add(2*time.Hour)) || !s.LeaseUntil.Equal(schedNow.Add(time.Hour)) {
		t.Errorf("after renew and settles: %+v; want last fire %s (never moved back), lease until %s",
			s, schedNow.Add(2*time.Hour), schedNow.Add(time.Hour))
	}
	if err := st.SettleSchedule(ctx, cur, time.Time{}, schedNow); err == nil {
		t.Error("SettleSchedule with a zero fire time: want an error")
	}
}

func TestReleasedScheduleIsClaimedAtOnce(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	ctx := context.Background()
	l := mustClaimSchedule(t, st, schedReq("a:1", schedNow)).Lease
	if err := st.ReleaseSchedule(ctx, l, schedNow.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if s := scheduleState(t, st, "nightly"); s.LeaseOwner != "" || !s.LeaseUntil.IsZero() {
		t.Errorf("released schedule = %+v; want no lease", s)
	}
	if err := st.RenewSchedule(ctx, l, schedNow.Add(2*time.Second), schedNow.Add(time.Hour)); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("RenewSchedule after release: err = %v; want ErrFenced", err)
	}
	c := mustClaimSchedule(t, st, schedReq("b:2", schedNow.Add(2*time.Second)))
	if c.TookOverFrom != "" || c.Lease.Fence != 2 {
		t.Errorf("claim after release = %+v; want fence 2 and no takeover (it was handed over cleanly)", c)
	}
}

func TestClaimScheduleValidatesRequest(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	for name, mutate := range map[string]func(*checkpoint.ScheduleClaimRequest){
		"no name":  func(r *checkpoint.ScheduleClaimRequest) { r.Name = "" },
		"no owner": func(r *checkpoint.ScheduleClaimRequest) { r.Owner = "" },
		"no now":   func(r *checkpoint.ScheduleClaimRequest) { r.Now = time.Time{} },
		"no lease": func(r *checkpoint.ScheduleClaimRequest) { r.LeaseFor = 0 },
	} {
		req := schedReq("a:1", schedNow)
		mutate(&req)
		if _, err := st.ClaimSchedule(context.Background(), req); err == nil {
			t.Errorf("claim with %s: want an error", name)
		}
	}
	if all, err := st.Schedules(context.Background()); err != nil || len(all) != 0 {
		t.Errorf("invalid claims stored %+v (err %v)", all, err)
	}
}
