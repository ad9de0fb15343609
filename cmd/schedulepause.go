package cmd

import (
	"errors"
	"fmt"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
)

func newSchedulesCmd(build func() ([]runner.Schedule, error)) *SchedulesCmd {
	c := &SchedulesCmd{}
	c.List.schedules, c.Pause.schedules, c.Unpause.schedules = build, build, build
	return c
}

// SchedulesPauseCmd pauses a schedule.
type SchedulesPauseCmd struct {
	operatorFlags
	Name   string `arg:"" placeholder:"NAME" help:"The schedule, as '${name} schedules' lists it."`
	Reason string `required:"" help:"Why it is paused (a bank holiday, an incident), for the audit log and the schedules listing."`
	JSON   bool   `name:"json" help:"Print the outcome as one JSON object (schedule, operation, operator, reason, at) instead of a line."`

	schedules func() ([]runner.Schedule, error)
}

// Help implements kong.HelpProvider: the longer help of schedules pause.
func (c *SchedulesPauseCmd) Help() string {
	return `The pause is stored in the database, so every serve sharing it honours it: the
serve firing the schedule reads it before each fire, and a standby that takes
over reads it too. Runs already going are not touched. The fires that come due
while it is paused are held; 'schedules unpause' skips them (recorded as
skipped for the pause), 'schedules unpause --catch-up' runs them under the
schedule's misfire policy. The pause commits with its audit record (who, when,
why): if the record cannot be written, nothing is paused.

  schedules pause settle-nightly --reason "bank holiday: no settlement on 2026-12-25"`
}

// SchedulesUnpauseCmd ends a schedule's pause.
type SchedulesUnpauseCmd struct {
	operatorFlags
	Name    string `arg:"" placeholder:"NAME" help:"The paused schedule, as '${name} schedules' lists it."`
	Reason  string `required:"" help:"Why it fires again, for the audit log."`
	CatchUp bool   `name:"catch-up" help:"Run the fires the pause held under the schedule's misfire policy and starting deadline, as fires missed in downtime are; without it they are skipped."`
	JSON    bool   `name:"json" help:"Print the outcome as one JSON object (schedule, operation, operator, reason, at) instead of a line."`

	schedules func() ([]runner.Schedule, error)
}

// Help implements kong.HelpProvider: the longer help of schedules unpause.
func (c *SchedulesUnpauseCmd) Help() string {
	return `The next fire after the unpause fires as usual. The fires that came due while it
was paused are skipped (settled without running, listed by 'schedules' as
skipped for the pause) unless --catch-up: then the misfire policy decides
(run-once runs the latest, run-all each in order, skip none), within the
starting deadline. The unpause commits with its audit record.

  schedules unpause settle-nightly --reason "holiday over"
  schedules unpause settle-nightly --catch-up --reason "incident fixed; settle the held night"`
}

// pauseView is what schedules pause and unpause print with --json.
type pauseView struct {
	Schedule  string    `json:"schedule"`
	Operation string    `json:"operation"`
	Operator  string    `json:"operator"`
	Reason    string    `json:"reason"`
	At        time.Time `json:"at"`
	Details   string    `json:"details,omitempty"`
}

// Run implements schedules pause.
func (c *SchedulesPauseCmd) Run(env *Env) error {
	scheds, st, err := pauseSetup(env, c.schedules)
	if err != nil {
		return err
	}
	a, err := ops.PauseSchedule(env.Ctx, st, c.who(c.Reason), scheds, c.Name, env.now())
	if err != nil {
		return pauseError(err)
	}
	if c.JSON {
		return writeJSON(env.Stdout, pauseView{c.Name, "pause", a.Operator, a.Reason, a.At, a.Details})
	}
	fmt.Fprintf(env.Stdout, "schedule %s paused by %s: no serve fires it until `%s schedules unpause %s --reason R`\n",
		c.Name, a.Operator, env.Name, c.Name)
	return nil
}

// Run implements schedules unpause.
func (c *SchedulesUnpauseCmd) Run(env *Env) error {
	scheds, st, err := pauseSetup(env, c.schedules)
	if err != nil {
		return err
	}
	a, err := ops.UnpauseSchedule(env.Ctx, st, c.who(c.Reason), scheds, c.Name, c.CatchUp, env.now())
	if err != nil {
		return pauseError(err)
	}
	if c.JSON {
		return writeJSON(env.Stdout, pauseView{c.Name, "unpause", a.Operator, a.Reason, a.At, a.Details})
	}
	fmt.Fprintf(env.Stdout, "schedule %s unpaused by %s: %s\n", c.Name, a.Operator, a.Details)
	return nil
}

func pauseSetup(env *Env, build func() ([]runner.Schedule, error)) ([]runner.Schedule, checkpoint.Backend, error) {
	scheds, err := build()
	if err != nil {
		return nil, nil, usageError{err}
	}
	st, err := env.Store()
	return scheds, st, err
}

// pauseError gives a refused pause or unpause its exit code: a schedule
// the program lacks or a missing reason is a usage error (2); one paused
// already, or not paused, needs a decision (5).
func pauseError(err error) error {
	var text *ops.TextError
	if errors.Is(err, ops.ErrUnknownSchedule) || errors.Is(err, ops.ErrNeedsReason) || errors.As(err, &text) {
		return usageError{err}
	}
	return err
}

// printPause prints who paused a schedule and the fires its pause holds,
// or the fires its last unpause skipped.
func printPause(env *Env, v ops.ScheduleView, loc *time.Location) {
	w := env.Stdout
	if p := v.Paused; p != nil {
		fmt.Fprintf(w, "  PAUSED by %s at %s: %s\n", p.By, p.At.In(loc).Format(fireLayout), reasonLine(p.Reason))
		if len(v.HeldByPause) == 0 {
			fmt.Fprintf(w, "  no fire held yet; `%s schedules unpause %s --reason R` fires it again\n", env.Name, v.Name)
		} else {
			more := ""
			if v.HeldMore {
				more = " and more"
			}
			fmt.Fprintf(w, "  held by the pause: %s%s; unpause skips them, unpause --catch-up runs them under misfire %s (%s):\n",
				plural(len(v.HeldByPause), "fire"), more, v.Misfire, v.CatchUp)
			for _, f := range v.HeldByPause {
				fmt.Fprintf(w, "    %s\n", f.In(loc).Format(fireLayout))
			}
		}
	}
	if k := v.SkippedForPause; k != nil && len(k.Fires) > 0 {
		more := ""
		if k.More {
			more = " and more"
		}
		fmt.Fprintf(w, "  skipped for the pause from %s to %s: %s%s, not run:\n",
			k.From.In(loc).Format(fireLayout), k.Until.In(loc).Format(fireLayout), plural(len(k.Fires), "fire"), more)
		for _, f := range k.Fires {
			fmt.Fprintf(w, "    %s\n", f.In(loc).Format(fireLayout))
		}
	}
}
