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
// (MissedMore says more follow). A schedule never served has none.
func AddMissed(v *ScheduleView, s runner.Schedule, now time.Time, threshold time.Duration) error {
	if v.ServedSince == nil {
		return nil
	}
	from := *v.ServedSince
	if v.LastFire != nil {
		from = *v.LastFire
	}
	fires, err := s.Fires(from, MaxMissedListed+1)
	if err != nil {
		return err
	}
	for _, f := range fires {
		if !f.At.Before(now.Add(-threshold)) {
			break
		}
		if len(v.Missed) == MaxMissedListed {
			v.MissedMore = true
			break
		}
		v.Missed = append(v.Missed, f.At)
	}
	if len(v.Missed) > 0 {
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
