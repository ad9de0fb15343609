package cmd

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
)

// TestSchedulesListsMissedFires: `schedules` lists the fires past their
// time that wait for serve to catch them up, with the misfire policy
// that will run them, in text and JSON.
func TestSchedulesListsMissedFires(t *testing.T) {
	db, side := testFiles(t)
	everyMinute := runner.Schedule{
		Name: "every-minute", Job: "crashy", Spec: "0 * * * * *", Location: time.UTC,
		Key:     func(f time.Time) map[string]string { return map[string]string{"key": f.UTC().Format(secondKey)} },
		Values:  map[string]string{"side": side, "steps": "1"},
		Misfire: runner.MisfireRunAll,
	}
	// A serve fired it up to 10 minutes ago, and stopped.
	st := openStore(t, db)
	ctx := context.Background()
	past := time.Now().Add(-10 * time.Minute).Truncate(time.Minute)
	claim, err := st.ClaimSchedule(ctx, checkpoint.ScheduleClaimRequest{Name: "every-minute", Owner: "gone:1", Now: past, LeaseFor: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.ReleaseSchedule(ctx, claim.Lease, past); err != nil {
		t.Fatal(err)
	}
	var out, errb syncBuffer
	if code := Execute(ctx, testRegistry(), []string{"--db", db, "schedules", "--next", "1"}, &out, &errb, Schedules(everyMinute)); code != ExitOK {
		t.Fatalf("schedules: exit %d: %s", code, errb.String())
	}
	text := out.String()
	want := "not yet settled, waiting to catch up when serve fires it next; under misfire run-all, every missed fire runs, oldest first:"
	if !strings.Contains(text, "  missed: ") || !strings.Contains(text, want) ||
		!strings.Contains(text, past.Add(time.Minute).UTC().Format(fireLayout)) {
		t.Errorf("schedules does not list the missed fires from %s:\n%s", past.Add(time.Minute).Format(fireLayout), text)
	}
	out = syncBuffer{}
	if code := Execute(ctx, testRegistry(), []string{"--db", db, "schedules", "--json"}, &out, &errb, Schedules(everyMinute)); code != ExitOK {
		t.Fatalf("schedules --json: exit %d: %s", code, errb.String())
	}
	var v struct {
		Schedules []struct {
			Missed  []time.Time `json:"missed"`
			CatchUp string      `json:"catch_up"`
		} `json:"schedules"`
	}
	if err := json.Unmarshal([]byte(out.String()), &v); err != nil || len(v.Schedules) != 1 {
		t.Fatalf("schedules --json: %v\n%s", err, out.String())
	}
	s := v.Schedules[0]
	// Fires at past+1m ... up to now-1m: 8 or 9 of them, the first one
	// minute after the settle mark.
	if len(s.Missed) < 8 || len(s.Missed) > 9 || !s.Missed[0].Equal(past.Add(time.Minute)) || s.CatchUp != "every missed fire runs, oldest first" {
		t.Errorf("missed %v, catch_up %q; want the fires from %s on, all to run", s.Missed, s.CatchUp, past.Add(time.Minute))
	}
}
