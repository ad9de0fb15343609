package runner_test

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/runner"
)

// pauseOp is the audit record of an operator's pause or unpause of the
// hourly schedule now.
func pauseOp(command string) checkpoint.Audit {
	return checkpoint.Audit{RunID: checkpoint.ScheduleAuditID("hourly"), At: time.Now(), Operator: "alice", Command: command, Reason: "bank holiday"}
}

// A pause written through one handle holds the fires of every scheduler
// on the store, the one firing and the one that takes over; an unpause
// without catch-up runs none of the fires the pause held.
func TestPauseHoldsEverySchedulerAndUnpauseSkipsItsFires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		loc := checkpointtest.NewLocation(t)
		k := newTicks(0)
		stA, stB, stOp := openStoreAt(t, loc), openStoreAt(t, loc), openStoreAt(t, loc)
		s := []runner.Schedule{hourly(nil)}
		a := startScheduler(t, k, stA, "a:1", s, nil)
		b := startScheduler(t, k, stB, "b:2", s, nil)
		sleep(70 * time.Minute) // 01:00 fires
		ctx := context.Background()
		if err := stOp.PauseSchedule(ctx, "hourly", pauseOp("schedules pause")); err != nil {
			t.Fatal(err)
		}
		sleep(2 * time.Hour) // 02:00 and 03:00 are held
		if got, want := k.ran(), hours(1); !slices.Equal(got, want) {
			t.Fatalf("while paused ran %v; want only the fire before the pause: %v", got, want)
		}
		// The leader stops; the standby takes over and honours the pause.
		a.stop(t)
		sleep(time.Hour) // 04:00 held too
		if !b.s.Status().Schedules[0].Leader {
			t.Fatal("standby did not take over")
		}
		if got, want := k.ran(), hours(1); !slices.Equal(got, want) {
			t.Fatalf("after the takeover, paused, ran %v; want %v", got, want)
		}
		if err := stOp.UnpauseSchedule(ctx, "hourly", pauseOp("schedules unpause"), false); err != nil { // 04:10
			t.Fatal(err)
		}
		sleep(time.Hour) // 05:00 fires
		b.stop(t)
		if got, want := k.ran(), hours(1, 5); !slices.Equal(got, want) {
			t.Errorf("after an unpause without catch-up ran %v; want the paused fires skipped: %v", got, want)
		}
		if got := b.value(t, "stepwise_misfires_skipped_total", "reason", "paused"); got != 3 {
			t.Errorf("fires skipped for the pause = %v; want 3 (02:00 to 04:00)", got)
		}
		if got := settled(t, stOp, "hourly"); !got.Equal(epoch.Add(5 * time.Hour)) {
			t.Errorf("settle mark = %s; want 05:00: the skipped fires are settled", got)
		}
	})
}

// An unpause with catch-up leaves the fires the pause held to the misfire
// policy: run-all runs each of them.
func TestUnpauseWithCatchUpRunsThePausedFires(t *testing.T) {
	for _, tc := range []struct {
		policy runner.MisfirePolicy
		want   []string
	}{
		{runner.MisfireRunAll, hours(1, 2, 3)},
		{runner.MisfireRunOnce, hours(3)},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				k, st := newTicks(0), openStore(t)
				r := startScheduler(t, k, st, "a:1", []runner.Schedule{hourly(func(s *runner.Schedule) { s.Misfire = tc.policy })}, nil)
				ctx := context.Background()
				sleep(30 * time.Minute)
				if err := st.PauseSchedule(ctx, "hourly", pauseOp("schedules pause")); err != nil {
					t.Fatal(err)
				}
				sleep(3 * time.Hour) // 01:00 to 03:00 held
				if got := k.ran(); len(got) != 0 {
					t.Fatalf("while paused ran %v; want nothing", got)
				}
				if err := st.UnpauseSchedule(ctx, "hourly", pauseOp("schedules unpause --catch-up"), true); err != nil {
					t.Fatal(err)
				}
				sleep(10 * time.Minute)
				r.stop(t)
				if got := k.ran(); !slices.Equal(got, tc.want) {
					t.Errorf("after an unpause with catch-up ran %v; want %v (misfire %s)", got, tc.want, tc.policy)
				}
			})
		})
	}
}

// A schedule paused before any serve fired it is not thereby served: the
// first scheduler starts it afresh, as it does a schedule with no row,
// and the fires before it are not caught up.
func TestPauseBeforeAnyServeLeavesNothingToCatchUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, st := newTicks(0), openStore(t)
		ctx := context.Background()
		if err := st.PauseSchedule(ctx, "hourly", pauseOp("schedules pause")); err != nil {
			t.Fatal(err)
		}
		sleep(10 * time.Minute)
		if err := st.UnpauseSchedule(ctx, "hourly", pauseOp("schedules unpause --catch-up"), true); err != nil {
			t.Fatal(err)
		}
		sleep(200 * time.Minute) // 03:30: no serve fired 01:00 to 03:00
		r := startScheduler(t, k, st, "a:1", []runner.Schedule{hourly(func(s *runner.Schedule) { s.Misfire = runner.MisfireRunAll })}, nil)
		sleep(time.Hour)
		r.stop(t)
		if got, want := k.ran(), hours(4); !slices.Equal(got, want) {
			t.Errorf("ran %v; want only the fire after the first serve started, %v", got, want)
		}
	})
}
