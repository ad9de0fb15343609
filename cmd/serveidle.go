package cmd

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"

	"github.com/alecthomas/kong"

	"github.com/stepwise-run/stepwise/runner"
)

// firing is what serve needs of its scheduler: a runner.Scheduler, or,
// for a program without schedules, noSchedules.
type firing interface {
	Run(ctx context.Context) error
	Status() runner.SchedulerStatus
}

// newFiring builds serve's scheduler: none is needed without schedules,
// and serve then serves the API, the dashboard, metrics and the queue only.
func newFiring(cfg runner.SchedulerConfig) (firing, error) {
	if len(cfg.Schedules) == 0 {
		return &noSchedules{}, nil
	}
	s, err := runner.NewScheduler(cfg)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// noSchedules stands in for the scheduler of a serve with no schedules:
// it fires nothing and runs until its context ends.
type noSchedules struct{ stopping atomic.Bool }

func (n *noSchedules) Run(ctx context.Context) error {
	<-ctx.Done()
	n.stopping.Store(true)
	return nil
}

func (n *noSchedules) Status() runner.SchedulerStatus {
	return runner.SchedulerStatus{Stopping: n.stopping.Load()}
}

// errNothingToServe is serve's refusal when it has neither schedules to
// fire nor an address to serve on.
var errNothingToServe = errors.New("this program defines no schedules, so serve has nothing to do without --listen ADDR " +
	"(the API, the dashboard and /metrics) or --metrics-listen ADDR")

// firingText says what serve fires: "firing 2 schedules", or that it has none.
func firingText(n int) string {
	switch n {
	case 0:
		return "no schedules to fire; serving"
	case 1:
		return "firing 1 schedule"
	}
	return "firing " + strconv.Itoa(n) + " schedules"
}

// schedulesOption carries the Schedules option's schedules to Execute,
// which adds the serve command with them (or with none).
type schedulesOption struct {
	build func() ([]runner.Schedule, error)
}

func (schedulesOption) Apply(*kong.Kong) error { return nil }

// serveHelp is the serve command's one-line help with and without schedules.
const (
	serveHelpSchedules = "Run the scheduler: fire the schedules' runs, with catch-up after downtime, until SIGTERM; " +
		"with --listen also the dashboard, the API and /metrics."
	serveHelpNoSchedules = "Serve the dashboard, the HTTP API and /metrics on --listen (with --enqueue the API's runs go " +
		"to the queue for workers) until SIGTERM; this program defines no schedules."
)

// scheduling is the serve (every program has it) and schedules (a program
// with cmd.Schedules) commands the options ask for.
func scheduling(own []kong.Option) []kong.Option {
	var last *schedulesOption
	for _, o := range own {
		if s, ok := o.(schedulesOption); ok {
			last = &s
		}
	}
	if last == nil {
		none := func() ([]runner.Schedule, error) { return nil, nil }
		return []kong.Option{kong.DynamicCommand("serve", serveHelpNoSchedules, "Scheduling", &ServeCmd{schedules: none})}
	}
	return []kong.Option{
		kong.DynamicCommand("serve", serveHelpSchedules, "Scheduling", &ServeCmd{schedules: last.build}),
		kong.DynamicCommand("schedules", "List the schedules (zone, policies, pause, last, missed and next fires); 'schedules pause' and 'unpause' hold one.",
			"Scheduling", newSchedulesCmd(last.build)),
	}
}
