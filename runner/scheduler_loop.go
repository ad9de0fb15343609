package runner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

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
	if l.held(sc, now) {
		l.settle(sc, now)
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
		if sc.pc.paused {
			earlier(sc.pc.checkAt)
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
