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
	"github.com/stepwise-run/stepwise/runner/ops"
)

// Schedules gives the serve command the given schedules (defined in Go
// beside the program's jobs) to fire, and adds the schedules command that
// lists them:
//
//	cmd.Main(registry, cmd.Schedules(nightly))
//
// Every program has serve (the API, the dashboard, metrics and the queue);
// without this option it fires nothing.
func Schedules(s ...runner.Schedule) Option {
	return SchedulesFrom(func() ([]runner.Schedule, error) { return s, nil })
}

// SchedulesFrom is Schedules with the schedules built by build when serve
// or schedules runs, after the command line is parsed, so they may depend
// on a flag the program adds (a time zone, say). The last Schedules or
// SchedulesFrom option wins.
func SchedulesFrom(build func() ([]runner.Schedule, error)) Option {
	return func(o *[]kong.Option) { *o = append(*o, schedulesOption{build: build}) }
}

// SchedulesCmd groups the schedules' commands: listing them (the
// default), and pausing and unpausing one.
type SchedulesCmd struct {
	List    SchedulesListCmd    `cmd:"" default:"withargs" help:"List the schedules: zone, policies, pause, last fire, missed and next fires (what '${name} schedules' alone does)."`
	Pause   SchedulesPauseCmd   `cmd:"" help:"Pause a schedule: no serve sharing the database fires it until it is unpaused; audited with --reason."`
	Unpause SchedulesUnpauseCmd `cmd:"" help:"Unpause a schedule: the fires the pause held are skipped, or run under its misfire policy with --catch-up; audited."`
}

// SchedulesListCmd lists the schedules.
type SchedulesListCmd struct {
	Next int    `default:"3" placeholder:"N" help:"How many next fire times to list per schedule."`
	From string `placeholder:"TIME" help:"List the fires after this time (RFC 3339, e.g. 2026-03-07T12:00:00-05:00) instead of after now: what fires around a DST change?"`
	JSON bool   `name:"json" help:"Print JSON instead of text."`
	// MisfireThreshold is serve's: a fire later than it is missed.
	MisfireThreshold time.Duration `name:"misfire-threshold" default:"1m" help:"How late a fire may be and still count as on time, as serve's --misfire-threshold: later unsettled fires are listed as missed, waiting to catch up."`

	schedules func() ([]runner.Schedule, error)
}

// Run implements the schedules command.
func (c *SchedulesListCmd) Run(env *Env) error {
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
	st, err := env.ReadStore()
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
	views := make([]ops.ScheduleView, 0, len(scheds))
	for _, s := range scheds {
		v, err := ops.ViewSchedule(s, states, now, after, c.Next)
		if err != nil {
			return usageError{err}
		}
		if err := ops.AddMissed(&v, s, now, c.MisfireThreshold); err != nil {
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

const fireLayout = "Mon 2006-01-02 15:04:05 MST"

func printSchedule(env *Env, v ops.ScheduleView) {
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
	printPause(env, v, loc)
	if len(v.Missed) > 0 {
		more := ""
		if v.MissedMore {
			more = " and more"
		}
		fmt.Fprintf(w, "  missed: %s%s not yet settled, waiting to catch up when serve fires it next; under misfire %s, %s:\n",
			plural(len(v.Missed), "fire"), more, v.Misfire, v.CatchUp)
		for _, m := range v.Missed {
			fmt.Fprintf(w, "    %s\n", m.In(loc).Format(fireLayout))
		}
	}
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
