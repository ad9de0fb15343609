package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

func testSchedulePause(t *testing.T, h Harness) {
	callerClock(t, h, "PauseIsRecordedWithItsAudit", schedulePauseIsRecordedWithItsAudit)
	callerClock(t, h, "UnpauseSkipsThePausedFires", scheduleUnpauseSkipsThePausedFires)
	callerClock(t, h, "BadAuditPausesNothing", scheduleBadAuditPausesNothing)
}

// pauseAudit is the audit record of a pause or unpause of name at at.
func pauseAudit(name, command string, at time.Time) checkpoint.Audit {
	return checkpoint.Audit{RunID: checkpoint.ScheduleAuditID(name), At: at, Operator: "alice", Command: command, Reason: "bank holiday"}
}

// scheduleAudits reads the audit trail of schedule name.
func scheduleAudits(e *env, st checkpoint.Store, name string) []checkpoint.Audit {
	e.t.Helper()
	as, err := capability[operator](e.t, st, "operator").Audits(e.ctx, checkpoint.ScheduleAuditID(name))
	if err != nil {
		e.t.Fatalf("audits of schedule %s: %v", name, err)
	}
	return as
}

// schedulePauseIsRecordedWithItsAudit is the Schedules test PauseIsRecordedWithItsAudit.
func schedulePauseIsRecordedWithItsAudit(t *testing.T, h Harness) {
	e, a, b := scheduleHosts(t, h)
	// A schedule never served gets its row, settled at the pause.
	if err := a.PauseSchedule(e.ctx, "nightly", pauseAudit("nightly", "schedules pause", t0)); err != nil {
		t.Fatalf("pause: %v", err)
	}
	s := e.schedule(b, "nightly")
	if !sameTime(s.Pause.At, t0) || s.Pause.By != "alice" || s.Pause.Reason != "bank holiday" || !sameTime(s.LastFire, t0) || s.LeaseOwner != "" {
		t.Errorf("paused schedule seen by another handle = %+v; want paused by alice at %s (bank holiday), settled at the pause, no lease", s, t0)
	}
	err := b.PauseSchedule(e.ctx, "nightly", pauseAudit("nightly", "schedules pause", t0.Add(time.Second)))
	if !errors.Is(err, checkpoint.ErrSchedulePaused) {
		t.Errorf("second pause = %v; want ErrSchedulePaused", err)
	}
	if as := scheduleAudits(e, e.open(), "nightly"); len(as) != 1 || as[0].Command != "schedules pause" || as[0].Operator != "alice" {
		t.Errorf("audit = %+v; want the one pause (the refused one records nothing)", as)
	}
	// A claim keeps the pause: it is the store's, not the scheduler's.
	// The first claim of the row starts its settle mark then, as
	// creating the row would: no fire before it was ever missed.
	t1 := t0.Add(time.Hour)
	c := claimSchedule(t, e, b, schedReq("nightly", ownerB, t1))
	if !c.Created || !c.State.Pause.Paused() || !sameTime(c.State.LastFire, t1) || !sameTime(c.State.CreatedAt, t1) || c.Lease.Fence != 1 {
		t.Errorf("first claim of a schedule paused before it was served = %+v; want it counted created, still paused, settled at %s, fence 1", c, t1)
	}
	c = claimSchedule(t, e, a, schedReq("nightly", ownerA, t1.Add(2*lease)))
	if c.Created || !sameTime(c.State.LastFire, t1) || c.TookOverFrom != ownerB {
		t.Errorf("next claim = %+v; want the row as it was (settled at %s), taken over from %s", c, t1, ownerB)
	}
}

// scheduleUnpauseSkipsThePausedFires is the Schedules test UnpauseSkipsThePausedFires.
func scheduleUnpauseSkipsThePausedFires(t *testing.T, h Harness) {
	e, a, b := scheduleHosts(t, h)
	claimSchedule(t, e, a, schedReq("nightly", ownerA, t0))
	t1, t2 := t0.Add(time.Hour), t0.Add(3*time.Hour)
	if err := b.UnpauseSchedule(e.ctx, "nightly", pauseAudit("nightly", "schedules unpause", t1), false); !errors.Is(err, checkpoint.ErrScheduleNotPaused) {
		t.Errorf("unpause of a schedule not paused = %v; want ErrScheduleNotPaused", err)
	}
	if err := b.UnpauseSchedule(e.ctx, "other", pauseAudit("other", "schedules unpause", t1), false); !errors.Is(err, checkpoint.ErrScheduleNotPaused) {
		t.Errorf("unpause of a schedule with no row = %v; want ErrScheduleNotPaused", err)
	}
	if err := b.PauseSchedule(e.ctx, "nightly", pauseAudit("nightly", "schedules pause", t1)); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if err := b.UnpauseSchedule(e.ctx, "nightly", pauseAudit("nightly", "schedules unpause", t2), false); err != nil {
		t.Fatalf("unpause: %v", err)
	}
	s := e.schedule(a, "nightly")
	if s.Pause.Paused() || !sameTime(s.Skip.From, t1) || !sameTime(s.Skip.Until, t2) || s.LeaseOwner != ownerA {
		t.Errorf("after unpause without catch-up = %+v; want not paused, fires after %s up to %s skipped, lease kept", s, t1, t2)
	}
	if !s.Skip.Skips(t1.Add(time.Minute)) || s.Skip.Skips(t1) || s.Skip.Skips(t2.Add(time.Minute)) {
		t.Errorf("skip window %+v; want it to hold the fires after %s up to %s only", s.Skip, t1, t2)
	}
	// With catch-up the window is left as it was: the fires go to the
	// misfire policy.
	t3, t4 := t2.Add(time.Hour), t2.Add(2*time.Hour)
	if err := a.PauseSchedule(e.ctx, "nightly", pauseAudit("nightly", "schedules pause", t3)); err != nil {
		t.Fatalf("pause again: %v", err)
	}
	if err := a.UnpauseSchedule(e.ctx, "nightly", pauseAudit("nightly", "schedules unpause --catch-up", t4), true); err != nil {
		t.Fatalf("unpause with catch-up: %v", err)
	}
	if s := e.schedule(b, "nightly"); s.Pause.Paused() || !sameTime(s.Skip.Until, t2) {
		t.Errorf("after unpause with catch-up = %+v; want not paused, the earlier window (until %s) unchanged", s, t2)
	}
	if as := scheduleAudits(e, e.open(), "nightly"); len(as) != 4 {
		t.Errorf("audit = %+v; want 4 records (pause, unpause, pause, unpause --catch-up)", as)
	}
}

// scheduleBadAuditPausesNothing is the Schedules test BadAuditPausesNothing.
func scheduleBadAuditPausesNothing(t *testing.T, h Harness) {
	e, a, b := scheduleHosts(t, h)
	claimSchedule(t, e, a, schedReq("nightly", ownerA, t0))
	bad := pauseAudit("nightly", "schedules pause", t0)
	bad.Operator = "al\xe9ice"
	if err := b.PauseSchedule(e.ctx, "nightly", bad); !errors.Is(err, checkpoint.ErrBadAudit) {
		t.Errorf("pause with an audit record no store keeps = %v; want ErrBadAudit", err)
	}
	if s := e.schedule(a, "nightly"); s.Pause.Paused() {
		t.Errorf("schedule after a refused pause = %+v; want not paused", s)
	}
	wrong := pauseAudit("other", "schedules pause", t0)
	if err := b.PauseSchedule(e.ctx, "nightly", wrong); err == nil {
		t.Errorf("pause recorded under another schedule's audit key succeeded; want it refused")
	}
	if err := b.PauseSchedule(e.ctx, "nightly", pauseAudit("nightly", "schedules pause", t0)); err != nil {
		t.Fatalf("pause: %v", err)
	}
	bad.Command = "schedules unpause"
	if err := b.UnpauseSchedule(e.ctx, "nightly", bad, false); !errors.Is(err, checkpoint.ErrBadAudit) {
		t.Errorf("unpause with an audit record no store keeps = %v; want ErrBadAudit", err)
	}
	if s := e.schedule(a, "nightly"); !s.Pause.Paused() {
		t.Errorf("schedule after a refused unpause = %+v; want still paused", s)
	}
	if as := scheduleAudits(e, e.open(), "nightly"); len(as) != 1 {
		t.Errorf("audit = %+v; want the one pause that happened", as)
	}
}
