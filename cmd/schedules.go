package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
)

// Schedules adds the serve and schedules commands for the given schedules
// (defined in Go beside the program's jobs):
//
//	cmd.Main(registry, cmd.Schedules(nightly))
func Schedules(s ...runner.Schedule) Option {
	return SchedulesFrom(func() ([]runner.Schedule, error) { return s, nil })
}

// SchedulesFrom is Schedules with the schedules built by build when serve
// or schedules runs, after the command line is parsed, so they may depend
// on a flag the program adds (a time zone, say).
func SchedulesFrom(build func() ([]runner.Schedule, error)) Option {
	return func(o *[]kong.Option) {
		*o = append(*o,
			kong.DynamicCommand("serve", "Run the scheduler: fire the schedules' runs, with catch-up after downtime, until SIGTERM.",
				"Scheduling", &ServeCmd{schedules: build}),
			kong.DynamicCommand("schedules", "List the schedules: zone, policies, last fire and the next fire times.",
				"Scheduling", &SchedulesCmd{schedules: build}))
	}
}

// SchedulesCmd lists the schedules.
type SchedulesCmd struct {
	Next int    `default:"3" placeholder:"N" help:"How many next fire times to list per schedule."`
	From string `placeholder:"TIME" help:"List the fires after this time (RFC 3339, e.g. 2026-03-07T12:00:00-05:00) instead of after now: what fires around a DST change?"`
	JSON bool   `name:"json" help:"Print JSON instead of text."`

	schedules func() ([]runner.Schedule, error)
}

// scheduleView is the JSON shape of a schedule in `schedules --json`.
type scheduleView struct {
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
	Next             []fireView `json:"next"`
}

// fireView is one upcoming fire.
type fireView struct {
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

// Run implements the schedules command.
func (c *SchedulesCmd) Run(env *Env) error {
	if c.Next < 0 || c.Next > 1000 {
		return usageError{fmt.Errorf("--next is %d; use 0 to 1000", c.Next)}
	}
	scheds, err := c.schedules()
	if err != nil {
		return usageError{err}
	}
	// It only reads: a missing database is not created, and means no
	// schedule has fired yet.
	var states []checkpoint.ScheduleState
	st, err := env.ExistingStore()
	switch {
	case errors.Is(err, checkpoint.ErrNoDatabase):
	case err != nil:
		return err
	default:
		if states, err = st.Schedules(env.Ctx); err != nil {
			return err
		}
	}
	now := env.now()
	after := now
	if c.From != "" {
		if after, err = time.Parse(time.RFC3339, c.From); err != nil {
			return usageError{fmt.Errorf("--from %q is not an RFC 3339 time such as 2026-03-07T12:00:00-05:00", c.From)}
		}
	}
	views := make([]scheduleView, 0, len(scheds))
	for _, s := range scheds {
		v, err := viewSchedule(s, states, now, after, c.Next)
		if err != nil {
			return usageError{err}
		}
		views = append(views, v)
	}
	if c.JSON {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"schedules": views})
	}
	if len(views) == 0 {
		fmt.Fprintln(env.Stdout, "no schedules")
	}
	for i, v := range views {
		if i > 0 {
			fmt.Fprintln(env.Stdout)
		}
		printSchedule(env, v)
	}
	return nil
}

// viewSchedule describes a schedule with its stored state (a lease is shown
// while live at now) and its next n fires after after.
func viewSchedule(s runner.Schedule, states []checkpoint.ScheduleState, now, after time.Time, n int) (scheduleView, error) {
	fires, err := s.Fires(after, n)
	if err != nil {
		return scheduleView{}, err
	}
	v := scheduleView{Name: s.Name, Job: s.Job, Spec: s.Spec, Zone: s.Location.String(),
		Misfire: string(orDefault(s.Misfire, runner.MisfireRunOnce)), Overlap: string(orDefault(s.Overlap, runner.OverlapForbid)),
		Next: []fireView{}}
	if s.StartingDeadline > 0 {
		v.StartingDeadline = s.StartingDeadline.String()
	}
	for _, st := range states {
		if st.Name == s.Name {
			v.ServedSince = optTime(st.CreatedAt)
			if st.LastFire.After(st.CreatedAt) {
				v.LastFire = optTime(st.LastFire)
			}
			if st.LeaseUntil.After(now) {
				v.LeaseOwner, v.LeaseUntil = st.LeaseOwner, optTime(st.LeaseUntil)
			}
		}
	}
	prev := after.In(s.Location)
	for _, f := range fires {
		params, err := s.Params(f.At)
		if err != nil {
			return scheduleView{}, err
		}
		fv := fireView{At: f.At, Wall: f.Wall, DST: string(f.DST), Params: params}
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

const fireLayout = "Mon 2006-01-02 15:04:05 MST"

func printSchedule(env *Env, v scheduleView) {
	w := env.Stdout
	fmt.Fprintf(w, "%s  job %s  spec %q  zone %s\n", v.Name, v.Job, v.Spec, v.Zone)
	deadline := "none"
	if v.StartingDeadline != "" {
		deadline = v.StartingDeadline
	}
	fmt.Fprintf(w, "  misfire %s, starting deadline %s, overlap %s\n", v.Misfire, deadline, v.Overlap)
	loc, err := time.LoadLocation(v.Zone)
	if err != nil {
		loc = time.UTC
	}
	switch {
	case v.ServedSince == nil:
		fmt.Fprint(w, "  last fire: none yet (never served)")
	case v.LastFire == nil:
		fmt.Fprintf(w, "  last fire: none yet (served since %s)", v.ServedSince.In(loc).Format(fireLayout))
	default:
		fmt.Fprintf(w, "  last fire: %s (every fire up to it is settled)", v.LastFire.In(loc).Format(fireLayout))
	}
	if v.LeaseOwner != "" {
		fmt.Fprintf(w, "; fired by %s, lease until %s", v.LeaseOwner, v.LeaseUntil.In(loc).Format("15:04:05"))
	}
	fmt.Fprintln(w)
	if len(v.Next) == 0 {
		return
	}
	fmt.Fprintln(w, "  next:")
	for _, f := range v.Next {
		keys := slices.Sorted(maps.Keys(f.Params))
		var ps []string
		for _, k := range keys {
			ps = append(ps, k+"="+f.Params[k])
		}
		line := fmt.Sprintf("    %s  %s", f.At.Format(fireLayout), strings.Join(ps, " "))
		clock := f.Wall[strings.IndexByte(f.Wall, ' ')+1:]
		switch runner.DST(f.DST) {
		case runner.DSTSkipped:
			line += fmt.Sprintf("  [DST: %s does not exist that day (clocks spring forward); fires at the change]", clock)
		case runner.DSTRepeated:
			line += fmt.Sprintf("  [DST: %s happens twice that day (clocks fall back); fires at the first only]", clock)
		}
		if f.Offset != "" {
			line += "  [clocks change: " + f.Offset + "]"
		}
		fmt.Fprintln(w, line)
	}
}
