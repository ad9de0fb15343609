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

// TestSchedulesPauseAndUnpause: the commands pause and unpause a schedule
// with their audit records, refuse what does not apply with its exit
// code, and `schedules` shows who paused it, when and why.
func TestSchedulesPauseAndUnpause(t *testing.T) {
	db, side := testFiles(t)
	nightly := runner.Schedule{Name: "nightly", Job: "crashy", Spec: "0 2 * * *", Location: time.UTC,
		Values: map[string]string{"side": side, "steps": "1", "key": "k"}}
	ctx := context.Background()
	exec := func(args ...string) (int, string, string) {
		var out, errb syncBuffer
		code := Execute(ctx, testRegistry(), append([]string{"--db", db}, args...), &out, &errb, Schedules(nightly))
		return code, out.String(), errb.String()
	}
	if code, out, errs := exec("schedules", "pause", "nightly", "--operator", "alice", "--reason", "bank holiday"); code != ExitOK ||
		!strings.Contains(out, "schedule nightly paused by alice") {
		t.Fatalf("pause: exit %d: %s%s", code, out, errs)
	}
	if code, _, errs := exec("schedules", "pause", "nightly", "--operator", "alice", "--reason", "again"); code != ExitOperator ||
		!strings.Contains(errs, "paused by alice") {
		t.Errorf("second pause: exit %d, %s; want %d naming the pause in force", code, errs, ExitOperator)
	}
	if code, _, errs := exec("schedules", "pause", "weekly", "--reason", "x"); code != ExitUsage || !strings.Contains(errs, "its schedules are nightly") {
		t.Errorf("pause of an unknown schedule: exit %d, %s; want %d naming the schedules", code, errs, ExitUsage)
	}
	if code, _, errs := exec("schedules", "pause", "nightly", "--reason", "bad\x1b[2J"); code != ExitUsage || !strings.Contains(errs, "--reason") {
		t.Errorf("pause with a control character: exit %d, %s; want %d naming --reason", code, errs, ExitUsage)
	}
	code, out, errs := exec("schedules", "--next", "0")
	if code != ExitOK || !strings.Contains(out, "PAUSED by alice at ") || !strings.Contains(out, ": bank holiday") {
		t.Errorf("schedules: exit %d: %s%s; want the pause with who, when and why", code, out, errs)
	}
	code, out, _ = exec("schedules", "--json")
	var v struct {
		Schedules []struct {
			Paused *struct {
				By, Reason string
				At         time.Time
			} `json:"paused"`
		} `json:"schedules"`
	}
	if err := json.Unmarshal([]byte(out), &v); code != ExitOK || err != nil || len(v.Schedules) != 1 || v.Schedules[0].Paused == nil ||
		v.Schedules[0].Paused.By != "alice" || v.Schedules[0].Paused.Reason != "bank holiday" || v.Schedules[0].Paused.At.IsZero() {
		t.Errorf("schedules --json: exit %d, %v: %s; want paused by alice (bank holiday)", code, err, out)
	}
	if code, out, errs := exec("schedules", "unpause", "nightly", "--operator", "bob", "--reason", "holiday over"); code != ExitOK ||
		!strings.Contains(out, "the fires since the pause are skipped") {
		t.Errorf("unpause: exit %d: %s%s", code, out, errs)
	}
	if code, _, _ := exec("schedules", "unpause", "nightly", "--catch-up", "--reason", "x"); code != ExitOperator {
		t.Errorf("unpause of a schedule not paused: exit %d; want %d", code, ExitOperator)
	}
	st := openStore(t, db)
	as, err := st.Audits(ctx, checkpoint.ScheduleAuditID("nightly"))
	if err != nil || len(as) != 2 || as[0].Operator != "alice" || as[0].Command != "schedules pause" || as[1].Operator != "bob" {
		t.Errorf("audit = %+v, %v; want alice's pause and bob's unpause", as, err)
	}
}
