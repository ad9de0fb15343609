package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/steps"
)

// errNeverFires is wrapped when a spec has no fire time within the
// hundred years Schedule.Fires and the Scheduler look ahead (say
// 0 0 30 2 *, which never fires).
var errNeverFires = errors.New("the spec never fires")

// Log field names of the scheduler's logs (the run's are steps.Field*).
const (
	fieldSchedule        = "schedule"
	fieldFire            = "fire"
	fieldLagSeconds      = "lag_seconds"      // how late a fire started
	fieldGraceSeconds    = "grace_seconds"    // SchedulerConfig.Grace
	fieldDeadlineSeconds = "deadline_seconds" // Schedule.StartingDeadline
)

// SchedulerConfig configures a Scheduler.
type SchedulerConfig struct {
	// Runner configures the runs the scheduler starts, as for New: they
	// are ordinary runs, with the same leases, fences and logs. Its Store
	// and Jobs are required; its Owner also names the scheduler in
	// schedule leases.
	Runner Config
	// Schedules are the schedules to fire; their names must be unique.
	// Required.
	Schedules []Schedule
	// Store keeps each schedule's settle mark and lease. Defaults to
	// Runner.Store.
	Store checkpoint.ScheduleStore
	// Clock is what the scheduler reads and sleeps on; runs use it too
	// unless Runner.Clock is set. Defaults to Runner.Clock, else
	// SystemClock.
	Clock Clock
	// Lease is how long this scheduler's claim on a schedule lasts without
	// renewal. It renews every third of it; a standby scheduler tries to
	// claim every third of it and takes over once the lease expires (at
	// once if its owner was on this host and is gone). Defaults to
	// Runner.Lease, itself 30s by default.
	Lease time.Duration
	// MisfireThreshold is how late a fire may be noticed and still count
	// as on time; a later one is missed and handled by its schedule's
	// misfire policy. Defaults to 1m.
	MisfireThreshold time.Duration
	// Grace is how long Run, once its context ends, lets running runs
	// finish before it interrupts them (resumably: the next scheduler, or
	// an operator's resume, continues them). Zero interrupts them at once.
	Grace time.Duration
	// RetryDelay is how long a fire whose run could not be started for a
	// passing reason (a locked database) waits before it is tried again,
	// within its starting deadline. Defaults to 10s.
	RetryDelay time.Duration
	// Metrics, if set, receives the scheduler's and its runs' series.
	Metrics *Metrics
	// Enqueue makes each fire queue its run (Runner.Enqueue, in queue
	// Queue) for a pool of workers instead of running it in this process:
	// the fire is settled once the run is queued, or found to exist. The
	// overlap policy then orders the enqueues only; the run key still
	// makes a fire's run the same run however often it fires.
	Enqueue bool
	// Queue is the queue Enqueue puts runs in; empty means
	// checkpoint.DefaultQueue.
	Queue string
}

func (c *SchedulerConfig) validate() error {
	if len(c.Schedules) == 0 {
		return errors.New("runner: SchedulerConfig.Schedules is empty; give at least one schedule")
	}
	if c.Runner.Store == nil {
		return errors.New("runner: SchedulerConfig.Runner.Store is nil; open a checkpoint store")
	}
	if c.Store == nil {
		c.Store = c.Runner.Store
	}
	if c.Clock == nil {
		c.Clock = c.Runner.Clock
	}
	if c.Clock == nil {
		c.Clock = SystemClock{}
	}
	if c.Runner.Clock == nil {
		c.Runner.Clock = c.Clock
	}
	if c.Lease == 0 {
		c.Lease = c.Runner.Lease
	}
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.Lease < 100*time.Millisecond {
		return fmt.Errorf("runner: SchedulerConfig.Lease is %s; use at least 100ms", c.Lease)
	}
	if c.MisfireThreshold < 0 || c.Grace < 0 || c.RetryDelay < 0 {
		return fmt.Errorf("runner: SchedulerConfig.MisfireThreshold (%s), Grace (%s) and RetryDelay (%s) cannot be negative",
			c.MisfireThreshold, c.Grace, c.RetryDelay)
	}
	if c.MisfireThreshold == 0 {
		c.MisfireThreshold = time.Minute
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = 10 * time.Second
	}
	return nil
}

// Scheduler fires schedules: it starts a run of each schedule's job at each
// fire time, keeping the state robfig/cron does not (see the package's
// Scheduling notes in Schedule, MisfirePolicy and OverlapPolicy).
//
// Each schedule is fired by one scheduler at a time: the one holding its
// lease in the store. The schedule's settle mark, the latest fire up to
// which every fire has been decided, is stored with the lease; after
// downtime or a takeover the next holder sees the fires after the mark as
// missed and applies the misfire policy. A fire whose run was interrupted
// by shutdown stays unsettled, so it is fired again (and resumes its run)
// after the restart. Should two schedulers ever fire the same time, the run
// key makes the second a harmless duplicate.
type Scheduler struct {
	cfg     SchedulerConfig
	runner  *Runner
	store   checkpoint.ScheduleStore
	clock   Clock
	log     zerolog.Logger
	m       *Metrics
	owner   string
	scheds  []*scheduled
	started atomic.Bool

	mu     sync.Mutex
	status SchedulerStatus
}

// NewScheduler checks cfg (every schedule against the job registry, with
// the parameters of its next fire) and returns a Scheduler; Run starts it.
func NewScheduler(cfg SchedulerConfig) (*Scheduler, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rc := cfg.Runner
	if cfg.Metrics != nil && rc.Metrics == nil {
		rc.Metrics = cfg.Metrics
	}
	r, err := New(rc)
	if err != nil {
		return nil, err
	}
	s := &Scheduler{cfg: cfg, runner: r, store: cfg.Store, clock: cfg.Clock, m: cfg.Metrics, owner: r.cfg.Owner,
		log: r.cfg.Logger.With().Str("component", "scheduler").Logger()}
	now := s.clock.Now()
	seen := map[string]bool{}
	for _, sch := range cfg.Schedules {
		c, err := sch.compile()
		if err != nil {
			return nil, err
		}
		if seen[c.Name] {
			return nil, fmt.Errorf("runner: two schedules are named %q; names must be unique", c.Name)
		}
		seen[c.Name] = true
		job, err := r.cfg.Jobs.Lookup(c.Job)
		if err != nil {
			return nil, fmt.Errorf("runner: schedule %s: %w", c.Name, err)
		}
		next := c.next(now)
		if next.At.IsZero() {
			return nil, c.neverFires(now)
		}
		if _, err := job.Decode(c.params(next), nil); err != nil {
			return nil, fmt.Errorf("runner: schedule %s: its fire at %s gives job %s bad parameters: %w",
				c.Name, next.At.Format(time.RFC3339), c.Job, err)
		}
		s.m.known(c.Name, c.Job)
		s.scheds = append(s.scheds, &scheduled{compiled: c})
	}
	s.status.Schedules = make([]ScheduleStatus, len(s.scheds))
	for i, sc := range s.scheds {
		s.status.Schedules[i] = ScheduleStatus{Name: sc.Name, Job: sc.Job}
	}
	return s, nil
}

// SchedulerStatus is a snapshot of what a Scheduler is doing.
type SchedulerStatus struct {
	// Stopping is true once Run's context has ended: no more fires, the
	// running runs are finishing.
	Stopping  bool
	Schedules []ScheduleStatus
}

// ScheduleStatus is one schedule's part of a SchedulerStatus.
type ScheduleStatus struct {
	Name string
	Job  string
	// Leader is true while this scheduler holds the schedule's lease.
	Leader bool
	// Settled is the settle mark: every fire up to it has been decided.
	Settled time.Time
	// Next is the next fire time, zero unless Leader.
	Next time.Time
	// Running and Queued count this scheduler's runs of the schedule.
	Running, Queued int
}

// Status returns a snapshot of the scheduler's state; safe to call from any
// goroutine (an HTTP health check, say).
func (s *Scheduler) Status() SchedulerStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	st.Schedules = slices.Clone(st.Schedules)
	return st
}

// enqueue queues a fire's run for the workers. A run that exists already
// is a duplicate fire, reported as Run reports one.
func (s *Scheduler) enqueue(ctx context.Context, job string, params map[string]string) (Result, error) {
	res, err := s.runner.Enqueue(ctx, EnqueueRequest{Job: job, Values: params, Queue: s.cfg.Queue})
	out := Result{RunID: res.Run.ID, Status: res.Run.Status}
	switch {
	case err != nil:
		return out, err
	case !res.Created:
		s.log.Info().Str(steps.FieldRunID, res.Run.ID).Str("status", res.Run.Status).Msg("fire's run exists already; nothing enqueued")
	default:
		s.log.Info().Str(steps.FieldRunID, res.Run.ID).Str("queue", res.Run.Queue).Msg("fire's run enqueued for the workers")
	}
	return out, nil
}
