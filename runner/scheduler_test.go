package runner_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// The scheduler tests run under testing/synctest: time is fake and moves
// only when every goroutine of the test is blocked, so hours of schedule
// pass in milliseconds, with real SQLite stores, and no test sleeps for
// real. The fake clock starts at 2000-01-01T00:00:00Z.

type tickParams struct {
	Key string `param:"key,key"`
}

// ticks is a registry with one job, "tick", whose single step records
// which run key it ran for and then takes hold of (fake) time.
type ticks struct {
	reg  *jobs.Registry
	hold time.Duration

	mu        sync.Mutex
	started   []string // run keys, in the order their step started
	active    int
	maxActive int
}

func newTicks(hold time.Duration) *ticks {
	k := &ticks{reg: &jobs.Registry{}, hold: hold}
	k.reg.MustRegister(jobs.Define("tick", func(ctx context.Context, run *steps.Run, p tickParams) error {
		_, err := steps.Do(ctx, run, "work", func(ctx context.Context) (string, error) {
			k.mu.Lock()
			k.started = append(k.started, p.Key)
			k.active++
			k.maxActive = max(k.maxActive, k.active)
			k.mu.Unlock()
			defer func() {
				k.mu.Lock()
				k.active--
				k.mu.Unlock()
			}()
			if k.hold > 0 {
				select {
				case <-ctx.Done():
					return "", ctx.Err()
				case <-time.After(k.hold):
				}
			}
			return p.Key, nil
		})
		return err
	}))
	return k
}

func (k *ticks) ran() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.started)
}

func (k *ticks) most() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.maxActive
}

// hourKey names each fire's run by its time: one run per fire.
func hourKey(f time.Time) map[string]string {
	return map[string]string{"key": f.UTC().Format("2006-01-02T15:04")}
}

// hours returns the run keys of the hourly fires at the given hours of the
// fake clock's first day.
func hours(hs ...int) []string {
	var keys []string
	for _, h := range hs {
		keys = append(keys, time.Date(2000, 1, 1, h, 0, 0, 0, time.UTC).Format("2006-01-02T15:04"))
	}
	return keys
}

func hourly(mod func(*runner.Schedule)) runner.Schedule {
	s := runner.Schedule{Name: "hourly", Job: "tick", Spec: "0 * * * *", Location: time.UTC, Key: hourKey}
	if mod != nil {
		mod(&s)
	}
	return s
}

// started is a scheduler running in its own goroutine.
type started struct {
	s      *runner.Scheduler
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

// startScheduler starts a scheduler on st for the tick job.
func startScheduler(t *testing.T, k *ticks, st checkpoint.Backend, owner string, scheds []runner.Schedule, mod func(*runner.SchedulerConfig)) *started {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := runner.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := runner.SchedulerConfig{
		// A long lease keeps heartbeats and renewals (each a durable
		// commit) few over hours of fake time.
		Runner: runner.Config{Store: st, Jobs: k.reg, Owner: owner, Lease: 15 * time.Minute,
			Logger: zerolog.New(zerolog.NewTestWriter(t))},
		Schedules: scheds,
		Metrics:   m,
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := runner.NewScheduler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &started{s: s, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Run(ctx) }()
	synctest.Wait()
	return r
}

// stop ends the scheduler as SIGTERM does and waits for Run to return.
func (r *started) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	if err := <-r.done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// value returns the current value of a counter or gauge series.
func (r *started) value(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// openStore opens a fresh store on the suite's store for a scheduler test.
func openStore(t *testing.T) checkpoint.Backend {
	t.Helper()
	return openStoreAt(t, checkpointtest.NewLocation(t))
}

// openStoreAt opens the store at loc (checkpointtest.NewLocation). A
// SQLite file is opened with synchronous=normal, which skips the fsync per
// commit: these tests crash no machine, and hours of fake time make many
// commits.
func openStoreAt(t *testing.T, loc string) checkpoint.Backend {
	t.Helper()
	if checkpointtest.IsURL(loc) {
		return checkpointtest.OpenLocation(t, loc)
	}
	st, err := sqlite.Open(context.Background(), sqlite.Config{Path: loc, Synchronous: sqlite.SyncNormal})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// sleep lets fake time pass and the scheduler catch up with it.
func sleep(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

func settled(t *testing.T, st checkpoint.ScheduleStore, name string) time.Time {
	t.Helper()
	all, err := st.Schedules(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if s.Name == name {
			return s.LastFire
		}
	}
	t.Fatalf("schedule %s not stored", name)
	return time.Time{}
}

func runOf(t *testing.T, st checkpoint.Store, key string) checkpoint.RunInfo {
	t.Helper()
	info, err := st.Run(context.Background(), jobs.RunID("tick", key))
	if err != nil {
		t.Fatal(err)
	}
	return info
}

var epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func TestSchedulerFiresOnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		if !time.Now().Equal(epoch) {
			t.Fatalf("fake clock starts at %s; the tests assume %s", time.Now(), epoch)
		}
		k, st := newTicks(0), openStore(t)
		r := startScheduler(t, k, st, "a:1", []runner.Schedule{hourly(nil)}, nil)
		sleep(3*time.Hour + time.Minute)
		if got, want := r.s.Status().Schedules[0], (runner.ScheduleStatus{Name: "hourly", Job: "tick", Leader: true,
			Settled: epoch.Add(3 * time.Hour), Next: epoch.Add(4 * time.Hour)}); got != want {
			t.Errorf("status = %+v; want %+v", got, want)
		}
		r.stop(t)
		if got, want := k.ran(), hours(1, 2, 3); !slices.Equal(got, want) {
			t.Errorf("ran %v; want %v", got, want)
		}
		for _, key := range hours(1, 2, 3) {
			info := runOf(t, st, key)
			if info.Run.Status != checkpoint.RunSucceeded || len(info.Attempts) != 1 {
				t.Errorf("run %s: %s with %d attempts; want succeeded with 1", key, info.Run.Status, len(info.Attempts))
			}
		}
		if got := settled(t, st, "hourly"); !got.Equal(epoch.Add(3 * time.Hour)) {
			t.Errorf("settle mark = %s; want 03:00", got)
		}
		if got := r.value(t, "stepwise_runs_started_total", "job", "tick"); got != 3 {
			t.Errorf("runs started = %v; want 3", got)
		}
		if got := r.value(t, "stepwise_runs_succeeded_total", "job", "tick"); got != 3 {
			t.Errorf("runs succeeded = %v; want 3", got)
		}
		if got := r.value(t, "stepwise_steps_executed_total", "job", "tick"); got != 3 {
			t.Errorf("steps executed = %v; want 3", got)
		}
		if got := r.value(t, "stepwise_schedule_lag_seconds", "schedule", "hourly"); got != 0 {
			t.Errorf("lag = %vs; want 0 on a fake clock", got)
		}
		if got := r.value(t, "stepwise_schedule_leader", "schedule", "hourly"); got != 0 {
			t.Errorf("leader gauge after stop = %v; want 0 (lease given up)", got)
		}
	})
}

// downtime fires the hourly schedule at 01:00, stops the scheduler at
// 01:30, and starts a new one at 06:30 (fires 02:00 to 06:00 missed) that
// runs until 07:01.
func downtime(t *testing.T, k *ticks, mod func(*runner.Schedule)) *started {
	st := openStore(t)
	s := []runner.Schedule{hourly(mod)}
	first := startScheduler(t, k, st, "a:1", s, nil)
	sleep(90 * time.Minute)
	first.stop(t)
	sleep(5 * time.Hour)
	second := startScheduler(t, k, st, "a:1", s, nil)
	sleep(31 * time.Minute)
	second.stop(t)
	if got := settled(t, st, "hourly"); !got.Equal(epoch.Add(7 * time.Hour)) {
		t.Errorf("settle mark = %s; want 07:00", got)
	}
	return second
}

func TestSchedulerCatchUpAfterDowntime(t *testing.T) {
	for _, tc := range []struct {
		policy  runner.MisfirePolicy
		ran     []string
		skipped float64
	}{
		{runner.MisfireSkip, hours(1, 7), 5},
		{runner.MisfireRunOnce, hours(1, 6, 7), 4},
		{runner.MisfireRunAll, hours(1, 2, 3, 4, 5, 6, 7), 0},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				k := newTicks(0)
				r := downtime(t, k, func(s *runner.Schedule) { s.Misfire = tc.policy })
				if got := k.ran(); !slices.Equal(got, tc.ran) {
					t.Errorf("ran %v; want %v", got, tc.ran)
				}
				if got := r.value(t, "stepwise_misfires_skipped_total", "schedule", "hourly", "reason", "policy"); got != tc.skipped {
					t.Errorf("misfires skipped = %v; want %v", got, tc.skipped)
				}
			})
		})
	}
}

func TestSchedulerStartingDeadline(t *testing.T) {
	t.Run("run-all runs only the missed fires within the deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			k := newTicks(0)
			// At 06:30, 02:00-04:00 are more than 2h old.
			r := downtime(t, k, func(s *runner.Schedule) { s.Misfire, s.StartingDeadline = runner.MisfireRunAll, 2*time.Hour })
			if got, want := k.ran(), hours(1, 5, 6, 7); !slices.Equal(got, want) {
				t.Errorf("ran %v; want %v", got, want)
			}
			if got := r.value(t, "stepwise_misfires_skipped_total", "schedule", "hourly", "reason", "deadline"); got != 3 {
				t.Errorf("deadline misfires = %v; want 3", got)
			}
		})
	})
	t.Run("run-once runs nothing when the latest is past the deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			k := newTicks(0)
			r := downtime(t, k, func(s *runner.Schedule) { s.Misfire, s.StartingDeadline = runner.MisfireRunOnce, 20*time.Minute })
			if got, want := k.ran(), hours(1, 7); !slices.Equal(got, want) {
				t.Errorf("ran %v; want %v", got, want)
			}
			if got := r.value(t, "stepwise_misfires_skipped_total", "schedule", "hourly", "reason", "deadline"); got != 5 {
				t.Errorf("deadline misfires = %v; want 5", got)
			}
		})
	})
	t.Run("a queued fire that waited past the deadline does not start", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// Each run takes 100 minutes: 02:00 waits for 01:00's run
			// until 02:40, 40 minutes past its time.
			k, st := newTicks(100*time.Minute), openStore(t)
			r := startScheduler(t, k, st, "a:1", []runner.Schedule{hourly(func(s *runner.Schedule) {
				s.Overlap, s.StartingDeadline = runner.OverlapQueue, 30*time.Minute
			})}, nil)
			sleep(4*time.Hour + 41*time.Minute)
			r.stop(t)
			if got, want := k.ran(), hours(1, 3); !slices.Equal(got, want) {
				t.Errorf("ran %v; want %v", got, want)
			}
			if got := r.value(t, "stepwise_misfires_skipped_total", "schedule", "hourly", "reason", "deadline"); got != 2 {
				t.Errorf("deadline misfires = %v; want 2", got)
			}
		})
	})
}

func TestSchedulerOverlap(t *testing.T) {
	for _, tc := range []struct {
		policy     runner.OverlapPolicy
		ran        []string
		concurrent int
		skipped    float64
		lag        time.Duration // of the latest run started
		settled    time.Time
	}{
		// Runs take 90 minutes; fires at 01:00 to 04:00; stopped at 04:45.
		{runner.OverlapForbid, hours(1, 3), 1, 2, 0, epoch.Add(4 * time.Hour)},
		// 02:00 starts at 02:30, 03:00 at 04:00; 04:00 is still queued at
		// the stop, so it stays unsettled and fires after a restart.
		{runner.OverlapQueue, hours(1, 2, 3), 1, 0, time.Hour, epoch.Add(3 * time.Hour)},
		{runner.OverlapAllow, hours(1, 2, 3, 4), 2, 0, 0, epoch.Add(4 * time.Hour)},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				k, st := newTicks(90*time.Minute), openStore(t)
				r := startScheduler(t, k, st, "a:1", []runner.Schedule{hourly(func(s *runner.Schedule) { s.Overlap = tc.policy })},
					func(c *runner.SchedulerConfig) { c.Grace = 2 * time.Hour })
				sleep(4*time.Hour + 45*time.Minute)
				r.stop(t) // the grace period lets the running runs finish
				if got := k.ran(); !slices.Equal(got, tc.ran) {
					t.Errorf("ran %v; want %v", got, tc.ran)
				}
				if got := k.most(); got != tc.concurrent {
					t.Errorf("at most %d runs at once; want %d", got, tc.concurrent)
				}
				if got := r.value(t, "stepwise_overlap_skipped_total", "schedule", "hourly"); got != tc.skipped {
					t.Errorf("overlap skipped = %v; want %v", got, tc.skipped)
				}
				if got := r.value(t, "stepwise_schedule_lag_seconds", "schedule", "hourly"); got != tc.lag.Seconds() {
					t.Errorf("lag = %vs; want %v", got, tc.lag)
				}
				if got := settled(t, st, "hourly"); !got.Equal(tc.settled) {
					t.Errorf("settle mark = %s; want %s", got, tc.settled)
				}
				for _, key := range tc.ran {
					if info := runOf(t, st, key); info.Run.Status != checkpoint.RunSucceeded {
						t.Errorf("run %s is %s; want succeeded (finished within the grace period)", key, info.Run.Status)
					}
				}
			})
		})
	}
}

func TestSchedulerDeduplicatesFires(t *testing.T) {
	dayKey := runner.FireDate("key")
	for _, tc := range []struct {
		name   string
		hold   time.Duration
		scheds []runner.Schedule
		dups   float64
	}{
		// Every hourly fire of a day names the same run: the first runs,
		// the rest find it succeeded.
		{"same key, run already succeeded", 0, []runner.Schedule{hourly(func(s *runner.Schedule) { s.Key = dayKey })}, 2},
		// The 02:00 fire finds 01:00's run still going (held), 03:00 finds
		// it succeeded.
		{"same key, run still going", 90 * time.Minute, []runner.Schedule{hourly(func(s *runner.Schedule) {
			s.Key, s.Overlap = dayKey, runner.OverlapAllow
		})}, 2},
		// Two schedules firing the same time for the same run.
		{"two schedules, one run", 0, []runner.Schedule{
			hourly(func(s *runner.Schedule) { s.Key = dayKey }),
			hourly(func(s *runner.Schedule) { s.Name, s.Key = "hourly-twin", dayKey }),
		}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				k, st := newTicks(tc.hold), openStore(t)
				r := startScheduler(t, k, st, "a:1", tc.scheds, func(c *runner.SchedulerConfig) { c.Grace = time.Hour })
				sleep(3*time.Hour + time.Minute)
				r.stop(t)
				if got, want := k.ran(), []string{"2000-01-01"}; !slices.Equal(got, want) {
					t.Errorf("ran %v; want the day's run once: %v", got, want)
				}
				info := runOf(t, st, "2000-01-01")
				if info.Run.Status != checkpoint.RunSucceeded || len(info.Attempts) != 1 {
					t.Errorf("run: %s with %d attempts; want succeeded with 1", info.Run.Status, len(info.Attempts))
				}
				dups := 0.0
				for _, s := range tc.scheds {
					dups += r.value(t, "stepwise_duplicate_fires_total", "schedule", s.Name)
				}
				if dups != tc.dups {
					t.Errorf("duplicate fires = %v; want %v", dups, tc.dups)
				}
				for _, s := range tc.scheds {
					if got := settled(t, st, s.Name); !got.Equal(epoch.Add(3 * time.Hour)) {
						t.Errorf("%s settle mark = %s; want 03:00 (a duplicate is settled)", s.Name, got)
					}
				}
			})
		})
	}
}

func TestTwoSchedulersOnOneDatabaseFireOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		loc := checkpointtest.NewLocation(t)
		k := newTicks(0)
		stA, stB := openStoreAt(t, loc), openStoreAt(t, loc)
		s := []runner.Schedule{hourly(nil)}
		a := startScheduler(t, k, stA, "a:1", s, nil)
		b := startScheduler(t, k, stB, "b:2", s, nil)
		sleep(3*time.Hour + time.Minute)
		if got, want := k.ran(), hours(1, 2, 3); !slices.Equal(got, want) {
			t.Fatalf("two schedulers ran %v; want each fire once: %v", got, want)
		}
		leaderA, leaderB := a.s.Status().Schedules[0].Leader, b.s.Status().Schedules[0].Leader
		if !leaderA || leaderB {
			t.Fatalf("leaders: a %v, b %v; want a (started first) only", leaderA, leaderB)
		}

		// The leader stops: it gives its lease up and the standby claims
		// it within a third of the lease, missing nothing.
		a.stop(t)
		sleep(2 * time.Hour)
		if got, want := k.ran(), hours(1, 2, 3, 4, 5); !slices.Equal(got, want) {
			t.Errorf("after the handover ran %v; want %v", got, want)
		}
		if !b.s.Status().Schedules[0].Leader {
			t.Error("standby did not take over")
		}
		if got := b.value(t, "stepwise_lease_takeovers_total", "kind", "schedule"); got != 0 {
			t.Errorf("takeovers = %v; want 0 after a clean handover", got)
		}
		b.stop(t)
		for _, key := range hours(1, 2, 3, 4, 5) {
			if info := runOf(t, stA, key); len(info.Attempts) != 1 {
				t.Errorf("run %s has %d attempts; want 1", key, len(info.Attempts))
			}
		}
	})
}

func TestSchedulerTakesOverFromDeadScheduler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, st := newTicks(0), openStore(t)
		ctx := context.Background()
		// A scheduler on another host claimed the schedule at 00:00 and
		// died without giving the lease up.
		if _, err := st.ClaimSchedule(ctx, checkpoint.ScheduleClaimRequest{Name: "hourly", Owner: "elsewhere:9",
			Now: time.Now(), LeaseFor: 30 * time.Second}); err != nil {
			t.Fatal(err)
		}
		sleep(150 * time.Minute)
		r := startScheduler(t, k, st, "a:1", []runner.Schedule{hourly(func(s *runner.Schedule) { s.Misfire = runner.MisfireRunAll })}, nil)
		sleep(time.Minute)
		r.stop(t)
		// Its lease had expired: taken over at once, and the fires it
		// missed caught up.
		if got, want := k.ran(), hours(1, 2); !slices.Equal(got, want) {
			t.Errorf("ran %v; want %v", got, want)
		}
		if got := r.value(t, "stepwise_lease_takeovers_total", "kind", "schedule"); got != 1 {
			t.Errorf("schedule takeovers = %v; want 1", got)
		}
	})
}

func TestSchedulerStandbyWaitsForLiveLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, st := newTicks(0), openStore(t)
		// A live scheduler elsewhere holds the schedule until 00:50 and
		// has settled nothing past 00:00.
		if _, err := st.ClaimSchedule(context.Background(), checkpoint.ScheduleClaimRequest{Name: "hourly", Owner: "elsewhere:9",
			Now: time.Now(), LeaseFor: 50 * time.Minute}); err != nil {
			t.Fatal(err)
		}
		r := startScheduler(t, k, st, "a:1", []runner.Schedule{hourly(nil)}, nil)
		sleep(40 * time.Minute)
		if r.s.Status().Schedules[0].Leader {
			t.Fatal("claimed a schedule whose lease is live")
		}
		sleep(80 * time.Minute)
		r.stop(t)
		if got, want := k.ran(), hours(1, 2); !slices.Equal(got, want) {
			t.Errorf("ran %v; want %v", got, want)
		}
		if got := r.value(t, "stepwise_lease_takeovers_total", "kind", "schedule"); got != 1 {
			t.Errorf("schedule takeovers = %v; want 1 (the lease expired unreleased)", got)
		}
	})
}

func TestSchedulerShutdown(t *testing.T) {
	t.Run("runs finish within the grace period", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			k, st := newTicks(30*time.Minute), openStore(t)
			r := startScheduler(t, k, st, "a:1", []runner.Schedule{hourly(nil)}, func(c *runner.SchedulerConfig) { c.Grace = time.Hour })
			sleep(70 * time.Minute)
			r.stop(t)
			if got := time.Since(epoch); got != 90*time.Minute {
				t.Errorf("Run returned at +%s; want +1h30m, when the run finished", got)
			}
			if info := runOf(t, st, hours(1)[0]); info.Run.Status != checkpoint.RunSucceeded {
				t.Errorf("run is %s; want succeeded", info.Run.Status)
			}
			if got := settled(t, st, "hourly"); !got.Equal(epoch.Add(time.Hour)) {
				t.Errorf("settle mark = %s; want 01:00", got)
			}
		})
	})
	t.Run("past the grace period runs are interrupted and resume after a restart", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			k, st := newTicks(30*time.Minute), openStore(t)
			s := []runner.Schedule{hourly(nil)}
			r := startScheduler(t, k, st, "a:1", s, func(c *runner.SchedulerConfig) { c.Grace = 5 * time.Minute })
			sleep(70 * time.Minute)
			r.stop(t)
			if got := time.Since(epoch); got != 75*time.Minute {
				t.Errorf("Run returned at +%s; want +1h15m, at the end of the grace period", got)
			}
			info := runOf(t, st, hours(1)[0])
			if info.Run.Status != checkpoint.RunInterrupted || !strings.Contains(info.Run.Error, "grace period") {
				t.Errorf("run is %s (%q); want interrupted by the end of the grace period", info.Run.Status, info.Run.Error)
			}
			if got := r.value(t, "stepwise_runs_interrupted_total", "job", "tick"); got != 1 {
				t.Errorf("runs interrupted = %v; want 1", got)
			}
			// The interrupted fire is not settled ...
			if got := settled(t, st, "hourly"); !got.Equal(epoch) {
				t.Errorf("settle mark = %s; want 00:00 (the interrupted fire left open)", got)
			}
			// ... so the next scheduler fires it again, resuming its run.
			sleep(5 * time.Minute)
			r = startScheduler(t, k, st, "a:1", s, nil)
			sleep(31 * time.Minute)
			r.stop(t)
			info = runOf(t, st, hours(1)[0])
			var statuses []string
			for _, a := range info.Attempts {
				statuses = append(statuses, a.Status)
			}
			if info.Run.Status != checkpoint.RunSucceeded || !slices.Equal(statuses, []string{"interrupted", "succeeded"}) {
				t.Errorf("run is %s with attempts %v; want succeeded after [interrupted succeeded]", info.Run.Status, statuses)
			}
			if got := settled(t, st, "hourly"); !got.Equal(epoch.Add(time.Hour)) {
				t.Errorf("settle mark = %s; want 01:00", got)
			}
		})
	})
}

func TestNewSchedulerChecksSchedules(t *testing.T) {
	k, st := newTicks(0), openStore(t)
	for _, tc := range []struct {
		name   string
		scheds []runner.Schedule
		want   string
	}{
		{"none", nil, "Schedules is empty"},
		{"unknown job", []runner.Schedule{hourly(func(s *runner.Schedule) { s.Job = "nope" })}, "nope"},
		{"duplicate names", []runner.Schedule{hourly(nil), hourly(nil)}, "unique"},
		{"never fires", []runner.Schedule{hourly(func(s *runner.Schedule) { s.Spec = "0 0 30 2 *" })}, "never fires"},
		{"key rule gives bad parameters", []runner.Schedule{hourly(func(s *runner.Schedule) {
			s.Key = func(time.Time) map[string]string { return map[string]string{"other": "x"} }
		})}, "bad parameters"},
	} {
		_, err := runner.NewScheduler(runner.SchedulerConfig{Runner: runner.Config{Store: st, Jobs: k.reg}, Schedules: tc.scheds})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v; want one containing %q", tc.name, err, tc.want)
		}
	}
	_, err := runner.NewScheduler(runner.SchedulerConfig{Runner: runner.Config{Store: st, Jobs: k.reg},
		Schedules: []runner.Schedule{hourly(func(s *runner.Schedule) { s.Key = nil })}})
	if err == nil || !errors.Is(err, jobs.ErrBadParams) {
		t.Errorf("default key rule on a job without a date parameter: err = %v; want jobs.ErrBadParams", err)
	}
}

// offsetClock is the synctest clock moved to another moment: fake time
// still passes only when the test's goroutines block.
type offsetClock struct{ offset time.Duration }

func (c offsetClock) Now() time.Time                         { return time.Now().Add(c.offset) }
func (c offsetClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// The loop fires on the times TestFiresAcrossDST computes: the skipped
// 02:30 once at the change, the repeated 01:30 once.
func TestSchedulerAcrossDST(t *testing.T) {
	ny := mustZone(t, "America/New_York")
	for _, tc := range []struct {
		name  string
		spec  string
		start string
		days  int
		want  []string // run keys: fire times in UTC
	}{
		{"spring forward", "30 2 * * *", "2026-03-07T00:00:00Z", 3,
			[]string{"2026-03-07T07:30", "2026-03-08T07:00", "2026-03-09T06:30"}},
		{"fall back", "30 1 * * *", "2026-10-31T00:00:00Z", 3,
			[]string{"2026-10-31T05:30", "2026-11-01T05:30", "2026-11-02T06:30"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clock := offsetClock{time.Until(utc(tc.start))}
				k, st := newTicks(0), openStore(t)
				r := startScheduler(t, k, st, "a:1", []runner.Schedule{{Name: "nightly", Job: "tick", Spec: tc.spec, Location: ny, Key: hourKey}},
					func(c *runner.SchedulerConfig) { c.Clock, c.Lease = clock, 3*time.Hour })
				sleep(time.Duration(tc.days) * 24 * time.Hour)
				r.stop(t)
				if got := k.ran(); !slices.Equal(got, tc.want) {
					t.Errorf("ran %v; want %v", got, tc.want)
				}
				if got := r.value(t, "stepwise_misfires_skipped_total", "schedule", "nightly", "reason", "policy"); got != 0 {
					t.Errorf("misfires = %v; want 0", got)
				}
			})
		})
	}
}

// A fire whose run was left running by a dead runner takes the run over
// once its lease has expired: an ordinary run, counted as a takeover.
func TestSchedulerTakesOverStaleRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, st := newTicks(0), openStore(t)
		key := hours(1)[0]
		dec, err := k.reg.Jobs()[0].Decode(map[string]string{"key": key}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Claim(context.Background(), checkpoint.ClaimRequest{RunID: jobs.RunID("tick", key), Job: "tick",
			RunKey: dec.RunKey, Params: dec.JSON, ParamsHash: dec.Hash, Owner: "elsewhere:9", Now: time.Now(), LeaseFor: time.Minute,
		}); err != nil {
			t.Fatal(err)
		}
		r := startScheduler(t, k, st, "a:1", []runner.Schedule{hourly(nil)}, nil)
		sleep(61 * time.Minute)
		r.stop(t)
		info := runOf(t, st, key)
		var statuses []string
		for _, a := range info.Attempts {
			statuses = append(statuses, a.Status)
		}
		if info.Run.Status != checkpoint.RunSucceeded || !slices.Equal(statuses, []string{checkpoint.AttemptLost, checkpoint.RunSucceeded}) {
			t.Errorf("run %s with attempts %v; want succeeded after [lost succeeded]", info.Run.Status, statuses)
		}
		if got := r.value(t, "stepwise_lease_takeovers_total", "kind", "run"); got != 1 {
			t.Errorf("run takeovers = %v; want 1", got)
		}
		if got := r.value(t, "stepwise_runs_started_total", "job", "tick"); got != 1 {
			t.Errorf("runs started = %v; want 1", got)
		}
	})
}

// Through the loop under fake time: in Nuuk and Scoresbysund the 23:30
// fire of the spring gap day fires at midnight with the gap day's key,
// and the next day still gets its own run (issue 11, point 12).
func TestSchedulerGapToMidnightKeepsItsDay(t *testing.T) {
	for _, tc := range []struct {
		zone string
		year int
	}{{"America/Nuuk", 2026}, {"America/Scoresbysund", 2027}} {
		t.Run(tc.zone, func(t *testing.T) {
			loc, gapDay := gapToMidnight(t, tc.zone, tc.year)
			gap, err := time.ParseInLocation("2006-01-02", gapDay, loc)
			if err != nil {
				t.Fatal(err)
			}
			synctest.Test(t, func(t *testing.T) {
				clock := offsetClock{time.Until(gap.Add(-12 * time.Hour))} // noon the day before
				k, st := newTicks(0), openStore(t)
				r := startScheduler(t, k, st, "a:1", []runner.Schedule{{Name: "late", Job: "tick", Spec: "30 23 * * *",
					Location: loc, Key: runner.FireDate("key")}},
					func(c *runner.SchedulerConfig) { c.Clock, c.Lease = clock, 3*time.Hour })
				sleep(3 * 24 * time.Hour)
				r.stop(t)
				want := []string{gap.AddDate(0, 0, -1).Format("2006-01-02"), gapDay, gap.AddDate(0, 0, 1).Format("2006-01-02")}
				if got := k.ran(); !slices.Equal(got, want) {
					t.Errorf("ran %v; want %v: one run per day, the gap day's included", got, want)
				}
				if got := r.value(t, "stepwise_duplicate_fires_total", "schedule", "late"); got != 0 {
					t.Errorf("duplicate fires = %v; want 0 (a day's fire found its run already there)", got)
				}
				for _, key := range want {
					if info := runOf(t, st, key); info.Run.Status != checkpoint.RunSucceeded {
						t.Errorf("run %s is %s; want succeeded", key, info.Run.Status)
					}
				}
			})
		})
	}
}

// After its 2096 fire, "0 2 29 2 *" is due next in 2104, past robfig's
// five-year search: the scheduler keeps it, instead of never firing again.
func TestSchedulerLooksPastRobfigsWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := offsetClock{time.Until(utc("2096-02-28T00:00:00Z"))}
		k, st := newTicks(0), openStore(t)
		r := startScheduler(t, k, st, "a:1", []runner.Schedule{{Name: "leap", Job: "tick", Spec: "0 2 29 2 *",
			Location: time.UTC, Key: runner.FireDate("key")}},
			func(c *runner.SchedulerConfig) { c.Clock, c.Lease = clock, 3*time.Hour })
		sleep(2 * 24 * time.Hour)
		st0 := r.s.Status().Schedules[0]
		r.stop(t)
		if got := k.ran(); !slices.Equal(got, []string{"2096-02-29"}) {
			t.Errorf("ran %v; want [2096-02-29]", got)
		}
		if !st0.Next.Equal(utc("2104-02-29T02:00:00Z")) {
			t.Errorf("next fire after 2096-02-29 = %s; want 2104-02-29T02:00Z", st0.Next)
		}
	})
}
