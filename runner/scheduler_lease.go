package runner

import (
	"errors"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

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
