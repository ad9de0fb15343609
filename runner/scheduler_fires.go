package runner

import (
	"errors"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

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
	pc         pauseCheck
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
	var byPolicy, byDeadline, byPause skipped
	for i, f := range due {
		latest := i == len(due)-1
		missed := !latest || !onTime
		switch {
		case sc.pc.skip.Skips(f.At):
			byPause.add(f.At)
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
	byPause.report(l.s, sc, misfireReasonPause, "fires skipped for the schedule's pause (unpaused without catch-up); not run")
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

// ended settles a fire by how its run ended.
func (l *loop) ended(e ended, now time.Time) {
	s, sc, pf := l.s, e.sc, e.pf
	sc.running--
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
	if !sc.pc.paused {
		l.startReady(sc, now)
	}
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
