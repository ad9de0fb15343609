package ops

import (
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
)

// ScheduleView is a schedule with its stored state and next fires.
type ScheduleView struct {
	Name             string     `json:"name"`
	Job              string     `json:"job"`
	Spec             string     `json:"spec"`
	Zone             string     `json:"zone"`
	Misfire          string     `json:"misfire"`
	StartingDeadline string     `json:"starting_deadline,omitempty"`
	Overlap          string     `json:"overlap"`
	LastFire         *time.Time `json:"last_fire,omitempty"`    // the settle mark: every fire up to it is decided
	ServedSince      *time.Time `json:"served_since,omitempty"` // when a scheduler first fired the schedule
	LeaseOwner       string     `json:"lease_owner,omitempty"`
	LeaseUntil       *time.Time `json:"lease_until,omitempty"`
	Next             []FireView `json:"next"`
	// Missed, MissedMore and CatchUp are filled in by AddMissed: the fires
	// past their time waiting to catch up, whether more follow, and what
	// the misfire policy will do with them.
	Missed     []time.Time `json:"missed,omitempty"`
	MissedMore bool        `json:"missed_more,omitempty"`
	CatchUp    string      `json:"catch_up,omitempty"`
	// Paused is who paused the schedule, when and why; nil when it is
	// not paused. HeldByPause (filled in by AddMissed) is the fires due
	// since, held: an unpause skips them, an unpause with catch-up leaves
	// them to the misfire policy.
	Paused      *PauseView  `json:"paused,omitempty"`
	HeldByPause []time.Time `json:"held_by_pause,omitempty"`
	HeldMore    bool        `json:"held_more,omitempty"`
	// SkippedForPause is the fires the last unpause without catch-up
	// skipped.
	SkippedForPause *PauseSkipView `json:"skipped_for_pause,omitempty"`
}

// FireView is one upcoming fire.
type FireView struct {
	At   time.Time `json:"at"`
	Wall string    `json:"wall"` // the spec's wall-clock time in the zone
	// DST is "skipped" (the wall time does not exist that day; fires at
	// the change) or "repeated" (it happens twice; fires at the first).
	DST string `json:"dst,omitempty"`
	// Offset is "EST -> EDT" when the zone's offset differs from the
	// previous listed fire's (or now's, for the first).
	Offset string            `json:"offset_change,omitempty"`
	Params map[string]string `json:"params"`
}

// ViewSchedule describes a schedule with its stored state (a lease is
// shown while live at now) and its next n fires after after.
func ViewSchedule(s runner.Schedule, states []checkpoint.ScheduleState, now, after time.Time, n int) (ScheduleView, error) {
	fires, err := s.Fires(after, n)
	if err != nil {
		return ScheduleView{}, err
	}
	v := ScheduleView{Name: s.Name, Job: s.Job, Spec: s.Spec, Zone: s.Location.String(),
		Misfire: string(orDefault(s.Misfire, runner.MisfireRunOnce)), Overlap: string(orDefault(s.Overlap, runner.OverlapForbid)),
		Next: []FireView{}}
	if s.StartingDeadline > 0 {
		v.StartingDeadline = s.StartingDeadline.String()
	}
	for _, st := range states {
		if st.Name == s.Name {
			if st.Fence > 0 { // a row a pause made (fence 0) was never served
				v.ServedSince = OptTime(st.CreatedAt)
			}
			if st.LastFire.After(st.CreatedAt) {
				v.LastFire = OptTime(st.LastFire)
			}
			if st.LeaseUntil.After(now) {
				v.LeaseOwner, v.LeaseUntil = st.LeaseOwner, OptTime(st.LeaseUntil)
			}
			if err := viewPause(&v, s, st); err != nil {
				return ScheduleView{}, err
			}
		}
	}
	prev := after.In(s.Location)
	for _, f := range fires {
		params, err := s.Params(f.At)
		if err != nil {
			return ScheduleView{}, err
		}
		fv := FireView{At: f.At, Wall: f.Wall, DST: string(f.DST), Params: params}
		_, was := prev.Zone()
		if _, is := f.At.Zone(); is != was {
			fv.Offset = prev.Format("MST") + " -> " + f.At.Format("MST")
		}
		prev = f.At
		v.Next = append(v.Next, fv)
	}
	return v, nil
}

func orDefault[T ~string](v, def T) T {
	if v == "" {
		return def
	}
	return v
}
