package runner_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// delivered records the outbox messages a Delivery got, by topic.
type delivered struct {
	mu     sync.Mutex
	topics []string
}

func (d *delivered) Deliver(_ context.Context, m checkpoint.Message) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.topics = append(d.topics, m.Topic+" "+m.RunID)
	return nil
}

func (d *delivered) got() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.topics)
}

// TestScheduledRunsDeliverTheirOutboxInline: a scheduler with metrics (as
// serve always has) counts each run started and still delivers the
// outbox messages its runs queued right after each run, as a lone runner
// with Config.Deliver does. The claim counting is a hook of the runner's
// claim, not a wrapper of the store that would hide its outbox.
func TestScheduledRunsDeliverTheirOutboxInline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, st := newTicks(0), openStore(t)
		k.reg.MustRegister(jobs.Define("notify", func(ctx context.Context, run *steps.Run, p tickParams) error {
			return steps.Notify(ctx, run, "notify", "settled", map[string]string{"key": p.Key})
		}))
		d := &delivered{}
		sched := hourly(func(s *runner.Schedule) { s.Name, s.Job = "notify-hourly", "notify" })
		r := startScheduler(t, k, st, "a:1", []runner.Schedule{sched}, func(c *runner.SchedulerConfig) { c.Runner.Deliver = d })
		sleep(2*time.Hour + time.Minute)
		r.stop(t)
		var want []string
		for _, key := range hours(1, 2) {
			want = append(want, "settled "+jobs.RunID("notify", key))
		}
		if got := d.got(); !slices.Equal(got, want) {
			t.Errorf("delivered %q; want %q, each right after its run", got, want)
		}
		if got := r.value(t, "stepwise_runs_started_total", "job", "notify"); got != 2 {
			t.Errorf("runs started = %v; want 2", got)
		}
	})
}
