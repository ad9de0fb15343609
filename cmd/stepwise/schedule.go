package main

import (
	"fmt"
	"time"
	_ "time/tzdata" // --tz works on hosts without a zone database

	"github.com/alecthomas/kong"

	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/runner"
)

// zoneFlag is the stock binary's --tz flag: the zone of its nightly
// settlement schedule.
type zoneFlag struct {
	TZ string `name:"tz" env:"STEPWISE_TZ" default:"UTC" help:"Time zone of the settle-nightly schedule (serve, schedules), an IANA name such as America/New_York."`
}

// scheduleCommands adds the --tz flag, and the serve and schedules commands
// with the nightly settlement schedule in that zone.
func scheduleCommands() cmd.Option {
	z := &zoneFlag{}
	schedules := cmd.SchedulesFrom(func() ([]runner.Schedule, error) {
		loc, err := time.LoadLocation(z.TZ)
		if err != nil {
			return nil, fmt.Errorf("--tz (STEPWISE_TZ) %q is not a time zone: %w", z.TZ, err)
		}
		return []runner.Schedule{nightlySettlement(loc)}, nil
	})
	return func(o *[]kong.Option) {
		*o = append(*o, kong.Embed(z))
		schedules(o)
	}
}

// nightlySettlement settles the previous business day at 02:00 in loc,
// Tuesday to Saturday: Tuesday's fire settles Monday, Saturday's Friday. A
// restart within twelve hours of a missed night still settles it (the
// latest missed night only); a settlement still running at the next fire is
// not started twice.
func nightlySettlement(loc *time.Location) runner.Schedule {
	return runner.Schedule{
		Name:             "settle-nightly",
		Job:              settlement.Job.Name(),
		Spec:             "0 2 * * TUE-SAT",
		Location:         loc,
		Key:              runner.PreviousBusinessDate("date", runner.Weekdays),
		Misfire:          runner.MisfireRunOnce,
		StartingDeadline: 12 * time.Hour,
		Overlap:          runner.OverlapForbid,
	}
}
