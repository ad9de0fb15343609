package web_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/cmd/internal/web"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// The schedules page shows who paused a schedule, when and why, the fires
// the pause holds and an Unpause button; after the unpause, the fires it
// skipped and a Pause button.
func TestSchedulesPageShowsThePause(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	s := runner.Schedule{Name: "settle-nightly", Job: "settle", Spec: "0 2 * * *", Location: time.UTC,
		Key: runner.PreviousBusinessDate("date", runner.Weekdays)}
	scheds := []runner.Schedule{s}
	paused := time.Date(2026, 12, 24, 12, 0, 0, 0, time.UTC)
	now := paused.Add(3 * 24 * time.Hour)
	srv := serve(t, web.Config{Store: st, Logger: zerolog.New(zerolog.NewTestWriter(t)),
		Schedules: func() ([]runner.Schedule, error) { return scheds, nil }, Now: func() time.Time { return now }})
	page := func() string {
		t.Helper()
		res, body := get(t, srv, "/schedules")
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET /schedules: %s\n%s", res.Status, body)
		}
		return body
	}
	body := page()
	if !strings.Contains(body, `data-pause-op="pause" data-schedule="settle-nightly"`) || strings.Contains(body, `data-pause-op="unpause"`) {
		t.Errorf("schedules page of a schedule not paused lacks its Pause button (only):\n%s", body)
	}
	// A serve fired it (and stopped); then it is paused.
	if _, err := st.ClaimSchedule(ctx, checkpoint.ScheduleClaimRequest{Name: s.Name, Owner: "serve:1", Now: paused.Add(-time.Hour), LeaseFor: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := ops.PauseSchedule(ctx, st, ops.Who{Operator: "alice", Reason: "bank holiday"}, scheds, s.Name, paused); err != nil {
		t.Fatal(err)
	}
	body = page()
	wantIn(t, "paused schedules page", text(body), "Paused by alice at Thu 2026-12-24 12:00:00 UTC : bank holiday",
		"Held by the pause: 3 fires (Fri 2026-12-25 02:00:00 UTC, Sat 2026-12-26 02:00:00 UTC, Sun 2026-12-27 02:00:00 UTC)",
		"paused: its fires are held")
	if !strings.Contains(body, `data-pause-op="unpause" data-schedule="settle-nightly"`) || !strings.Contains(body, `id="pause-dialog"`) {
		t.Errorf("paused schedules page lacks its Unpause button or the dialog:\n%s", body)
	}
	if _, err := ops.UnpauseSchedule(ctx, st, ops.Who{Operator: "bob", Reason: "holiday over"}, scheds, s.Name, false, now); err != nil {
		t.Fatal(err)
	}
	body = page()
	wantIn(t, "unpaused schedules page", text(body), "3 fires skipped for the pause from Thu 2026-12-24 12:00:00 UTC to Sun 2026-12-27 12:00:00 UTC, not run")
	if strings.Contains(text(body), "Paused by") || strings.Contains(text(body), "not yet settled") {
		t.Errorf("unpaused schedules page still shows the pause, or the skipped fires as missed:\n%s", text(body))
	}
}
