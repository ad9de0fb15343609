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
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// WaitClock is a Clock the scheduler can also sleep on. SystemClock is one;
// tests run the scheduler under testing/synctest, or give it a fake.
type WaitClock interface {
	Clock
	// After returns a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

// After returns time.After(d).
func (SystemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

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
	// unless Runner.Clock is set. Defaults to Runner.Clock if that is a
	// WaitClock, else SystemClock.
	Clock WaitClock
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
		switch clk := c.Runner.Clock.(type) {
		case WaitClock:
			c.Clock = clk
		case nil:
			c.Clock = SystemClock{}
		default:
			return fmt.Errorf("runner: SchedulerConfig.Clock is nil and Runner.Clock (%T) cannot wait; give a WaitClock", clk)
		}
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
	clock   WaitClock
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
	if cfg.Metrics != nil {
		// Each claimed run is counted as started the moment it is claimed.
		r.onClaim = cfg.Metrics.runStarted
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

// fireState is where a fire is in its life.
type fireState int

const (
	fireQueued   fireState = iota // waiting to start
	fireRunning                   // its run is going
	fireSettled                   // decided: its run ended, or it was skipped on purpose
	fireLeftOpen                  // interrupted or dropped by shutdown: the next scheduler fires it again
)

// pendingFire is a fire this scheduler has seen but whose schedule's settle
// mark has not passed it yet.
type pendingFire struct {
	Fire
	catchUp   bool // missed, run under the misfire policy
	state     fireState
	notBefore time.Time // a retry waits until then
}

// scheduled is one schedule and the loop's state for it; only the loop
// goroutine touches it.
type scheduled struct {
	*compiled
	held       bool
	gen        int // grows on every claim, so results of an older claim change nothing
	lease      checkpoint.ScheduleLease
	leaseUntil time.Time
	leaseAt    time.Time // held: when to renew; else: when to try to claim
	heldBy     string    // the other owner seen holding it, for logging changes only
	mark       time.Time // settle mark in memory
	saved      time.Time // settle mark last stored
	cursor     time.Time // latest fire seen
	next       Fire      // first fire after cursor
	pending    []*pendingFire
	running    int // runs of this schedule going in this process, of any claim
}

func (sc *scheduled) queued() int {
	n := 0
	for _, pf := range sc.pending {
		if pf.state == fireQueued {
			n++
		}
	}
	return n
}

// add appends a fire to pending; consecutive settled fires fold into the
// latest, so a long skipped backlog takes no memory.
func (sc *scheduled) add(pf *pendingFire) {
	if n := len(sc.pending); n > 0 && pf.state == fireSettled && sc.pending[n-1].state == fireSettled {
		sc.pending[n-1] = pf
		return
	}
	sc.pending = append(sc.pending, pf)
}

// ended is a run's result, sent back to the loop.
type ended struct {
	sc  *scheduled
	pf  *pendingFire
	gen int
	job string
	res Result
	err error
}

// loop is the state of one Run call.
type loop struct {
	s        *Scheduler
	ctx      context.Context // for store calls: never cancelled, they are short
	runsCtx  context.Context // the runs'; cancelled when the grace period ends
	done     chan ended
	wg       sync.WaitGroup
	draining bool
}

// Run fires the schedules until ctx ends, then stops firing, lets running
// runs finish within the grace period, interrupts the rest resumably,
// gives up its schedule leases and returns nil. It returns an error only if
// called twice.
func (s *Scheduler) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("runner: Scheduler.Run called twice; make a new Scheduler")
	}
	runsCtx, cancelRuns := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelRuns(nil)
	l := &loop{s: s, ctx: context.WithoutCancel(ctx), runsCtx: runsCtx, done: make(chan ended)}
	s.log.Info().Str("owner", s.owner).Int("schedules", len(s.scheds)).Msg("scheduler started")
	s.loadLastSuccess(ctx)

	for ctx.Err() == nil {
		now := s.clock.Now()
		for _, sc := range s.scheds {
			l.tend(sc, now)
		}
		l.publish(now)
		select {
		case <-ctx.Done():
		case <-s.clock.After(l.wait(now)):
		case e := <-l.done:
			l.ended(e, s.clock.Now())
		}
	}

	l.draining = true
	var graceOver <-chan time.Time
	if s.cfg.Grace > 0 {
		graceOver = s.clock.After(s.cfg.Grace)
	} else {
		cancelRuns(errors.New("scheduler stopped"))
	}
	if n := l.inFlight(); n > 0 {
		s.log.Info().Int("running", n).Float64(fieldGraceSeconds, s.cfg.Grace.Seconds()).Msg("scheduler stopping: no more fires; waiting for running runs")
	}
	for {
		now := s.clock.Now()
		for _, sc := range s.scheds {
			l.drain(sc, now)
		}
		l.publish(now)
		if l.inFlight() == 0 {
			break
		}
		select {
		case e := <-l.done:
			l.ended(e, s.clock.Now())
		case <-graceOver:
			graceOver = nil
			s.log.Warn().Int("running", l.inFlight()).Float64(fieldGraceSeconds, s.cfg.Grace.Seconds()).Msg("grace period over; interrupting running runs (resumable)")
			cancelRuns(fmt.Errorf("scheduler stopped; grace period of %s over", s.cfg.Grace))
		case <-s.clock.After(l.wait(now)):
		}
	}
	l.wg.Wait()
	s.log.Info().Msg("scheduler stopped")
	return nil
}

// tend does what is due for one schedule: keep or claim its lease, see its
// due fires, start what may start, and store its settle mark.
func (l *loop) tend(sc *scheduled, now time.Time) {
	l.keepLease(sc, now)
	if !sc.held || !now.Before(sc.leaseUntil) {
		return
	}
	l.collect(sc, now)
	l.startReady(sc, now)
	l.settle(sc, now)
}

// drain, once stopping, drops fires not yet started (they stay unsettled
// and fire again after a restart), keeps the lease while runs of the
// schedule may still settle, and gives it up when none are left.
func (l *loop) drain(sc *scheduled, now time.Time) {
	for _, pf := range sc.pending {
		if pf.state == fireQueued {
			pf.state = fireLeftOpen
		}
	}
	if !sc.held {
		return
	}
	l.settle(sc, now)
	if sc.running > 0 {
		l.keepLease(sc, now)
		return
	}
	if err := l.s.store.ReleaseSchedule(l.ctx, sc.lease, now); err != nil {
		l.s.log.Warn().Err(err).Str(fieldSchedule, sc.Name).Msg("could not give up the schedule's lease; another scheduler takes over when it expires")
	}
	sc.held = false
	l.s.m.setLeader(sc.Name, false)
}

// keepLease claims the schedule when it is time to try, or renews the lease
// it holds.
func (l *loop) keepLease(sc *scheduled, now time.Time) {
	if now.Before(sc.leaseAt) {
		return
	}
	s := l.s
	lease := s.cfg.Lease
	if !sc.held {
		if !l.draining {
			l.claim(sc, now)
		}
		return
	}
	until := now.Add(lease)
	err := s.store.RenewSchedule(l.ctx, sc.lease, now, until)
	switch {
	case err == nil:
		sc.leaseUntil, sc.leaseAt = until, now.Add(lease/3)
	case errors.Is(err, checkpoint.ErrFenced):
		l.lose(sc, now, err)
	default:
		s.log.Warn().Err(err).Str(fieldSchedule, sc.Name).Time("lease_until", sc.leaseUntil).Msg("could not renew the schedule's lease; retrying")
		sc.leaseAt = now.Add(lease / 10)
	}
}

// claim tries to become the schedule's firing scheduler.
func (l *loop) claim(sc *scheduled, now time.Time) {
	s := l.s
	lease := s.cfg.Lease
	c, err := s.store.ClaimSchedule(l.ctx, checkpoint.ScheduleClaimRequest{
		Name: sc.Name, Owner: s.owner, Now: now, LeaseFor: lease, OwnerGone: OwnerGone,
	})
	var held *checkpoint.ScheduleHeldError
	switch {
	case errors.As(err, &held):
		sc.leaseAt = now.Add(lease / 3)
		if held.Until.After(now) && held.Until.Before(sc.leaseAt) {
			sc.leaseAt = held.Until
		}
		if held.Owner != sc.heldBy {
			sc.heldBy = held.Owner
			s.log.Info().Str(fieldSchedule, sc.Name).Str("owner", held.Owner).Time("until", held.Until).
				Msg("schedule is fired by another scheduler; standing by")
		}
		return
	case err != nil:
		s.log.Warn().Err(err).Str(fieldSchedule, sc.Name).Msg("could not claim the schedule; retrying")
		sc.leaseAt = now.Add(lease / 3)
		return
	}
	sc.held, sc.gen, sc.lease, sc.heldBy = true, sc.gen+1, c.Lease, ""
	sc.leaseUntil, sc.leaseAt = now.Add(lease), now.Add(lease/3)
	sc.mark, sc.saved, sc.cursor = c.State.LastFire, c.State.LastFire, c.State.LastFire
	sc.next = sc.compiled.next(sc.cursor)
	sc.pending = nil
	s.m.setLeader(sc.Name, true)
	ev := s.log.Info()
	if c.TookOverFrom != "" {
		s.m.scheduleTakeover()
		ev = s.log.Warn().Str("previous_owner", c.TookOverFrom)
	}
	ev.Str(fieldSchedule, sc.Name).Time("settled", sc.mark).Time("next", sc.next.At).Bool("created", c.Created).
		Msg("firing schedule")
}

// lose stops firing a schedule whose lease another scheduler claimed. Runs
// already going finish; what they settle is the new holder's to decide.
func (l *loop) lose(sc *scheduled, now time.Time, err error) {
	l.s.log.Warn().Err(err).Str(fieldSchedule, sc.Name).Msg("lost the schedule's lease to another scheduler; standing by")
	sc.held = false
	sc.pending = nil
	sc.leaseAt = now.Add(l.s.cfg.Lease / 3)
	l.s.m.setLeader(sc.Name, false)
}

// collect takes the fires due by now and decides, by the misfire policy and
// the starting deadline, which of them run.
func (l *loop) collect(sc *scheduled, now time.Time) {
	var due []Fire
	for !sc.next.At.IsZero() && !sc.next.At.After(now) {
		due = append(due, sc.next)
		sc.cursor = sc.next.At
		sc.next = sc.compiled.next(sc.cursor)
	}
	if len(due) == 0 {
		return
	}
	onTime := now.Sub(due[len(due)-1].At) <= l.s.cfg.MisfireThreshold
	var byPolicy, byDeadline skipped
	for i, f := range due {
		latest := i == len(due)-1
		missed := !latest || !onTime
		switch {
		case sc.StartingDeadline > 0 && now.Sub(f.At) > sc.StartingDeadline:
			byDeadline.add(f.At)
		case missed && (sc.Misfire == MisfireSkip || sc.Misfire == MisfireRunOnce && !latest):
			byPolicy.add(f.At)
		default:
			l.arrive(sc, f, missed)
			continue
		}
		sc.add(&pendingFire{Fire: f, state: fireSettled})
	}
	byPolicy.report(l.s, sc, misfireReasonPolicy, "missed fires skipped by the misfire policy")
	byDeadline.report(l.s, sc, misfireReasonDeadline, "missed fires past the starting deadline; not run")
}

// skipped tallies skipped fires for one log line and one counter update.
type skipped struct {
	n           int
	first, last time.Time
}

func (k *skipped) add(t time.Time) {
	if k.n == 0 {
		k.first = t
	}
	k.n++
	k.last = t
}

func (k *skipped) report(s *Scheduler, sc *scheduled, reason, msg string) {
	if k.n == 0 {
		return
	}
	s.m.misfiresSkippedN(sc.Name, reason, k.n)
	s.log.Warn().Str(fieldSchedule, sc.Name).Str("misfire", string(sc.Misfire)).Int("count", k.n).
		Time("first", k.first).Time("last", k.last).Msg(msg)
}

// arrive queues a fire that may run, unless the overlap policy skips it.
func (l *loop) arrive(sc *scheduled, f Fire, catchUp bool) {
	if sc.Overlap == OverlapForbid && !catchUp && (sc.running > 0 || sc.queued() > 0) {
		l.s.m.overlapSkip(sc.Name)
		l.s.log.Warn().Str(fieldSchedule, sc.Name).Time(fieldFire, f.At).Int("running", sc.running).
			Msg("fire skipped: the schedule's previous run is unfinished (overlap forbid)")
		sc.add(&pendingFire{Fire: f, state: fireSettled})
		return
	}
	sc.add(&pendingFire{Fire: f, catchUp: catchUp, state: fireQueued})
}

// startReady starts the queued fires the overlap policy lets start, oldest
// first.
func (l *loop) startReady(sc *scheduled, now time.Time) {
	if l.draining || !sc.held {
		return
	}
	for _, pf := range sc.pending {
		if pf.state != fireQueued {
			continue
		}
		if now.Before(pf.notBefore) {
			if sc.Overlap == OverlapAllow {
				continue
			}
			return // later fires keep their order behind it
		}
		if sc.StartingDeadline > 0 && now.Sub(pf.At) > sc.StartingDeadline {
			pf.state = fireSettled
			l.s.m.misfiresSkippedN(sc.Name, misfireReasonDeadline, 1)
			l.s.log.Warn().Str(fieldSchedule, sc.Name).Time(fieldFire, pf.At).Float64(fieldDeadlineSeconds, sc.StartingDeadline.Seconds()).
				Msg("fire not started: past its starting deadline")
			continue
		}
		if sc.Overlap != OverlapAllow && sc.running > 0 {
			return
		}
		l.start(sc, pf, now)
	}
}

// start starts a fire's run in its own goroutine; its result comes back on
// l.done.
func (l *loop) start(sc *scheduled, pf *pendingFire, now time.Time) {
	s := l.s
	pf.state = fireRunning
	sc.running++
	lag := now.Sub(pf.At)
	s.m.fireLag(sc.Name, lag)
	params := sc.params(pf.Fire)
	s.log.Info().Str(fieldSchedule, sc.Name).Str(steps.FieldJob, sc.Job).Time(fieldFire, pf.At).Str("dst", string(pf.DST)).
		Float64(fieldLagSeconds, lag.Seconds()).Bool("catch_up", pf.catchUp).Interface("params", params).Msg("fire")
	e := ended{sc: sc, pf: pf, gen: sc.gen, job: sc.Job}
	l.wg.Go(func() {
		if s.cfg.Enqueue {
			e.res, e.err = s.enqueue(l.runsCtx, e.job, params)
		} else {
			e.res, e.err = s.runner.Run(l.runsCtx, Request{Job: e.job, Values: params})
		}
		l.done <- e
	})
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

// ended settles a fire by how its run ended.
func (l *loop) ended(e ended, now time.Time) {
	s, sc, pf := l.s, e.sc, e.pf
	sc.running--
	s.m.runEnded(e.job, e.res)
	log := s.log.With().Str(fieldSchedule, sc.Name).Time(fieldFire, pf.At).Str(steps.FieldRunID, e.res.RunID).Logger()
	var held *checkpoint.LeaseHeldError
	switch {
	case e.err == nil, e.res.Status == checkpoint.RunFailed:
		pf.state = fireSettled // the run logged how it ended
	case errors.Is(e.err, checkpoint.ErrAlreadySucceeded), errors.As(e.err, &held):
		s.m.duplicateFire(sc.Name)
		log.Info().Err(e.err).Msg("duplicate fire: its run key's run already succeeded or is running elsewhere; nothing to do")
		pf.state = fireSettled
	case errors.Is(e.err, ErrInterrupted) && l.runsCtx.Err() != nil:
		log.Info().Msg("run interrupted by shutdown; the fire is left unsettled and fires again (resuming the run) after a restart")
		pf.state = fireLeftOpen
	case e.res.Attempt == 0 && !permanent(e.err):
		if l.draining {
			pf.state = fireLeftOpen
			break
		}
		pf.state, pf.notBefore = fireQueued, now.Add(s.cfg.RetryDelay)
		log.Warn().Err(e.err).Float64(steps.FieldRetryInSeconds, s.cfg.RetryDelay.Seconds()).Msg("could not start the fire's run; will retry")
	default:
		s.m.fireError(sc.Name)
		log.Error().Err(e.err).Msg("fire's run could not start or be recorded; the fire is settled, rerun it by hand if needed")
		pf.state = fireSettled
	}
	if e.gen != sc.gen || !sc.held {
		return
	}
	l.startReady(sc, now)
	l.settle(sc, now)
}

// permanent reports whether a run that did not start never will, however
// often it is tried.
func permanent(err error) bool {
	var mismatch *checkpoint.ParamsMismatchError
	return errors.Is(err, checkpoint.ErrAbandoned) || errors.Is(err, checkpoint.ErrFenced) ||
		errors.As(err, &mismatch) || errors.Is(err, jobs.ErrBadParams) || errors.Is(err, jobs.ErrUnknownJob)
}

// settle moves the settle mark past the settled fires at the head of
// pending and stores it.
func (l *loop) settle(sc *scheduled, now time.Time) {
	for len(sc.pending) > 0 && sc.pending[0].state == fireSettled {
		if at := sc.pending[0].At; at.After(sc.mark) {
			sc.mark = at
		}
		sc.pending = sc.pending[1:]
	}
	if !sc.held || !sc.mark.After(sc.saved) {
		return
	}
	err := l.s.store.SettleSchedule(l.ctx, sc.lease, sc.mark, now)
	switch {
	case err == nil:
		sc.saved = sc.mark
	case errors.Is(err, checkpoint.ErrFenced):
		l.lose(sc, now, err)
	default:
		l.s.log.Warn().Err(err).Str(fieldSchedule, sc.Name).Msg("could not store the settle mark; retrying")
	}
}

// wait returns how long the loop may sleep: until the next fire, lease
// renewal or claim attempt, or retry.
func (l *loop) wait(now time.Time) time.Duration {
	wake := now.Add(time.Hour)
	earlier := func(t time.Time) {
		if !t.IsZero() && t.Before(wake) {
			wake = t
		}
	}
	for _, sc := range l.s.scheds {
		if sc.held || !l.draining {
			earlier(sc.leaseAt)
		}
		if !sc.held || l.draining {
			continue
		}
		earlier(sc.next.At)
		for _, pf := range sc.pending {
			if pf.state == fireQueued && pf.notBefore.After(now) {
				earlier(pf.notBefore)
			}
		}
	}
	return max(wake.Sub(now), 0)
}

func (l *loop) inFlight() int {
	n := 0
	for _, sc := range l.s.scheds {
		n += sc.running
	}
	return n
}

// publish updates the snapshot Status returns.
func (l *loop) publish(time.Time) {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status.Stopping = l.draining
	for i, sc := range s.scheds {
		st := &s.status.Schedules[i]
		st.Leader, st.Settled, st.Running, st.Queued = sc.held, sc.mark, sc.running, sc.queued()
		st.Next = time.Time{}
		if sc.held {
			st.Next = sc.next.At
		}
	}
}

// loadLastSuccess seeds the metrics' last success of every registered job
// from the store; a failure leaves the gauges to this process's runs.
func (s *Scheduler) loadLastSuccess(ctx context.Context) {
	if s.m == nil {
		return
	}
	var names []string
	for _, j := range s.runner.cfg.Jobs.Jobs() {
		names = append(names, j.Name())
	}
	if err := s.m.LoadLastSuccess(ctx, s.runner.cfg.Store, names); err != nil {
		s.log.Warn().Err(err).Msg("could not load the jobs' last successes; the gauge shows this process's runs only")
	}
}
