package runner

import (
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// misfireReasonPause labels, in stepwise_misfires_skipped_total, the fires
// an operator's pause skipped (unpaused without catch-up).
const misfireReasonPause = "paused"

// pauseCheck is the loop's view of a schedule's pause, read from the
// store before each fire: a pause made through any serve sharing the
// store holds the fires of every scheduler.
type pauseCheck struct {
	paused  bool
	pause   checkpoint.SchedulePause // the pause last logged
	skip    checkpoint.PauseSkip     // fires an unpause without catch-up skipped
	checkAt time.Time                // paused: when to read again
}

// held reports whether the schedule's due fires must wait: it reads the
// schedule's row when a fire is due (or, paused, when it is time to look
// again). While paused, due fires stay uncollected and unsettled: an
// unpause either skips them (its window, applied by collect) or, with
// catch-up, leaves them to the misfire policy as missed fires.
func (l *loop) held(sc *scheduled, now time.Time) bool {
	due := !sc.next.At.IsZero() && !sc.next.At.After(now) || sc.queued() > 0
	if !due || sc.pc.paused && now.Before(sc.pc.checkAt) {
		return sc.pc.paused && due
	}
	s := l.s
	st, found, err := l.state(sc.Name)
	if err != nil {
		s.log.Warn().Err(err).Str(fieldSchedule, sc.Name).Msg("could not read whether the schedule is paused; its fires wait")
		sc.pc.paused, sc.pc.checkAt = true, now.Add(s.cfg.RetryDelay)
		return true
	}
	was := sc.pc.paused
	sc.pc.paused, sc.pc.skip = found && st.Pause.Paused(), st.Skip
	if sc.pc.paused {
		sc.pc.checkAt = now.Add(s.cfg.Lease / 3)
		if st.Pause != sc.pc.pause {
			sc.pc.pause = st.Pause
			s.log.Warn().Str(fieldSchedule, sc.Name).Str("paused_by", st.Pause.By).Time("paused_at", st.Pause.At).
				Str("reason", st.Pause.Reason).Msg("schedule is paused; its fires wait for an unpause")
		}
		return true
	}
	if was {
		sc.pc.pause = checkpoint.SchedulePause{}
		s.log.Info().Str(fieldSchedule, sc.Name).Msg("schedule unpaused; firing again")
	}
	return false
}

// state reads one schedule's row.
func (l *loop) state(name string) (checkpoint.ScheduleState, bool, error) {
	all, err := l.s.store.Schedules(l.ctx)
	if err != nil {
		return checkpoint.ScheduleState{}, false, err
	}
	for _, st := range all {
		if st.Name == name {
			return st, true, nil
		}
	}
	return checkpoint.ScheduleState{}, false, nil
}
