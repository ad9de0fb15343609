package ops_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
)

var nightly = runner.Schedule{Name: "nightly", Job: "daily", Spec: "0 2 * * *", Location: time.UTC}

// refuseAudits makes the database at loc refuse every audit record, as a
// full disk or a broken table would: a real fault in the real store.
func refuseAudits(t *testing.T, loc string) {
	t.Helper()
	stmts := []string{`CREATE TRIGGER refuse_audit BEFORE INSERT ON audit BEGIN SELECT RAISE(ABORT, 'audit refused'); END`}
	if checkpointtest.IsURL(loc) {
		stmts = []string{
			`CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'audit refused'; END$$`,
			`CREATE TRIGGER refuse_audit BEFORE INSERT ON audit FOR EACH ROW EXECUTE FUNCTION refuse_audit()`,
		}
	}
	db := checkpointtest.SQL(t, loc)
	for _, q := range stmts {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
}

func pauseState(t *testing.T, st checkpoint.ScheduleStore) checkpoint.ScheduleState {
	t.Helper()
	all, err := st.Schedules(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if s.Name == "nightly" {
			return s
		}
	}
	return checkpoint.ScheduleState{}
}

// A pause whose audit record cannot be written did not happen: the store
// keeps no pause, and no scheduler would be held by one.
func TestPauseWithoutItsAuditRecordPausesNothing(t *testing.T) {
	ctx := context.Background()
	loc := checkpointtest.NewLocation(t)
	st := checkpointtest.OpenLocation(t, loc)
	now := time.Date(2026, 12, 24, 12, 0, 0, 0, time.UTC)
	who := ops.Who{Operator: "alice", Reason: "bank holiday"}
	scheds := []runner.Schedule{nightly}
	if _, err := ops.PauseSchedule(ctx, st, who, scheds, "nightly", now); err != nil {
		t.Fatal(err)
	}
	refuseAudits(t, loc)
	if _, err := ops.UnpauseSchedule(ctx, st, who, scheds, "nightly", false, now.Add(time.Hour)); err == nil {
		t.Fatal("unpause with the audit table refusing records succeeded; want it refused")
	}
	if s := pauseState(t, st); !s.Pause.Paused() || !s.Skip.Until.IsZero() {
		t.Fatalf("after a refused unpause = %+v; want still paused, no skip window", s)
	}

	loc2 := checkpointtest.NewLocation(t)
	st2 := checkpointtest.OpenLocation(t, loc2)
	refuseAudits(t, loc2)
	if _, err := ops.PauseSchedule(ctx, st2, who, scheds, "nightly", now); err == nil {
		t.Fatal("pause with the audit table refusing records succeeded; want it refused")
	}
	if s := pauseState(t, st2); s.Pause.Paused() {
		t.Errorf("after a refused pause = %+v; want not paused", s)
	}
}

// PauseSchedule and UnpauseSchedule refuse what does not apply, naming
// it, and the view shows who paused it and the fires it holds, then the
// fires an unpause skipped.
func TestPauseScheduleRulesAndView(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	scheds := []runner.Schedule{nightly}
	now := time.Date(2026, 12, 24, 12, 0, 0, 0, time.UTC)
	alice := ops.Who{Operator: "alice", Reason: "bank holiday"}
	if _, err := ops.PauseSchedule(ctx, st, alice, scheds, "weekly", now); !errors.Is(err, ops.ErrUnknownSchedule) {
		t.Errorf("pause of an unknown schedule = %v; want ErrUnknownSchedule", err)
	}
	if _, err := ops.PauseSchedule(ctx, st, ops.Who{Operator: "alice"}, scheds, "nightly", now); !errors.Is(err, ops.ErrNeedsReason) {
		t.Errorf("pause without a reason = %v; want ErrNeedsReason", err)
	}
	if _, err := ops.UnpauseSchedule(ctx, st, alice, scheds, "nightly", false, now); !errors.Is(err, ops.ErrNeedsDecision) {
		t.Errorf("unpause of a schedule not paused = %v; want ErrNeedsDecision", err)
	}
	// A serve fired it (and stopped); then it is paused.
	if _, err := st.ClaimSchedule(ctx, checkpoint.ScheduleClaimRequest{Name: "nightly", Owner: "serve:1", Now: now.Add(-time.Hour), LeaseFor: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := ops.PauseSchedule(ctx, st, alice, scheds, "nightly", now); err != nil {
		t.Fatal(err)
	}
	if _, err := ops.PauseSchedule(ctx, st, alice, scheds, "nightly", now); !errors.Is(err, ops.ErrNeedsDecision) {
		t.Errorf("second pause = %v; want ErrNeedsDecision", err)
	}
	later := now.Add(3 * 24 * time.Hour) // fires on the 25th, 26th and 27th held
	v := view(t, st, later)
	if v.Paused == nil || v.Paused.By != "alice" || v.Paused.Reason != "bank holiday" || len(v.HeldByPause) != 3 || len(v.Missed) != 0 {
		t.Fatalf("paused view = %+v; want paused by alice, 3 fires held, none missed", v)
	}
	if _, err := ops.UnpauseSchedule(ctx, st, ops.Who{Operator: "bob", Reason: "holiday over"}, scheds, "nightly", false, later); err != nil {
		t.Fatal(err)
	}
	v = view(t, st, later)
	if v.Paused != nil || len(v.HeldByPause) != 0 || len(v.Missed) != 0 || v.SkippedForPause == nil || len(v.SkippedForPause.Fires) != 3 {
		t.Errorf("view after unpause = %+v; want not paused, the 3 fires skipped for the pause, none missed", v)
	}
	as, err := st.Audits(ctx, checkpoint.ScheduleAuditID("nightly"))
	if err != nil || len(as) != 2 || as[0].Operator != "alice" || as[1].Operator != "bob" || as[1].Command != "schedules unpause" {
		t.Errorf("audit = %+v, %v; want alice's pause and bob's unpause", as, err)
	}
}

func view(t *testing.T, st checkpoint.ScheduleStore, now time.Time) ops.ScheduleView {
	t.Helper()
	states, err := st.Schedules(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	v, err := ops.ViewSchedule(nightly, states, now, now, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := ops.AddMissed(&v, nightly, now, time.Minute); err != nil {
		t.Fatal(err)
	}
	return v
}
