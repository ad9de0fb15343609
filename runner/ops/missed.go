package ops

import (
	"time"

	"github.com/stepwise-run/stepwise/runner"
)

// MaxMissedListed bounds the missed fires a schedule's view lists.
const MaxMissedListed = 10

// AddMissed fills in v's missed fires: those after the schedule's settle
// mark (or, never settled, after it was first served) that are later than
// threshold allows at now, waiting for the next serve to catch them up
// under the misfire policy; oldest first, at most MaxMissedListed
// (MissedMore says more follow). A schedule never served has none. Of a
// paused schedule, the fires due since the pause are listed apart
// (HeldByPause), and those the last unpause skipped are not missed.
func AddMissed(v *ScheduleView, s runner.Schedule, now time.Time, threshold time.Duration) error {
	if v.ServedSince == nil {
		return nil
	}
	from := *v.ServedSince
	if v.LastFire != nil {
		from = *v.LastFire
	}
	if w := v.SkippedForPause; w != nil && !w.From.After(from) && w.Until.After(from) {
		from = w.Until // settled as skipped, or soon: not waiting for anything
	}
	fires, err := s.Fires(from, 2*MaxMissedListed+1)
	if err != nil {
		return err
	}
fires:
	for _, f := range fires {
		switch {
		case f.At.After(now):
			break fires
		case v.SkippedForPause != nil && f.At.After(v.SkippedForPause.From) && !f.At.After(v.SkippedForPause.Until):
			continue
		case v.Paused != nil && f.At.After(v.Paused.At):
			if len(v.HeldByPause) == MaxMissedListed {
				v.HeldMore = true
				continue
			}
			v.HeldByPause = append(v.HeldByPause, f.At)
			continue
		case f.At.Before(now.Add(-threshold)):
			if len(v.Missed) == MaxMissedListed {
				v.MissedMore = true
				continue
			}
			v.Missed = append(v.Missed, f.At)
			continue
		}
		break // due within the threshold: on time, not missed
	}
	if len(v.Missed) > 0 || len(v.HeldByPause) > 0 {
		v.CatchUp = MisfireNote(v.Misfire)
	}
	return nil
}

// MisfireNote says what a misfire policy does with missed fires.
func MisfireNote(policy string) string {
	switch runner.MisfirePolicy(policy) {
	case runner.MisfireSkip:
		return "missed fires are skipped; firing resumes with the next one"
	case runner.MisfireRunOnce:
		return "of the missed fires, only the latest runs"
	case runner.MisfireRunAll:
		return "every missed fire runs, oldest first"
	}
	return ""
}
