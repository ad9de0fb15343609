package runner_test

import (
	"context"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// skewedClock is the real clock moved by skew: a host whose clock is off.
type skewedClock struct {
	runner.SystemClock // waits in real time
	skew               time.Duration
}

func (c skewedClock) Now() time.Time { return time.Now().Add(c.skew) }

// issue 23.4: a runner whose clock is an hour ahead records its step
// checkpoints on the clock of the attempt beside them, so `show` never
// mixes the host's step times with the server's attempt times. On
// PostgreSQL (opened as in production, on the server's clock) the
// attempt's times are the server's; on SQLite they are the caller's.
func TestStepTimesFollowTheAttemptsClock(t *testing.T) {
	st := checkpointtest.Open(t)
	if checkpointtest.IsPostgres(t) {
		pg, err := postgres.Open(context.Background(), postgres.Config{URL: pgtest.Schema(t)}) // not CallerClock
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pg.Close() })
		st = pg
	}
	h := newHarnessOn(t, st)
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
		if err := h.step(ctx, run, "load"); err != nil {
			return err
		}
		time.Sleep(300 * time.Millisecond)
		return h.step(ctx, run, "summary")
	}
	r := h.runner(func(c *runner.Config) { c.Clock = skewedClock{skew: time.Hour} })
	if _, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues}); err != nil {
		t.Fatal(err)
	}
	a := h.info().Attempts[0]
	const bound = 2 * time.Second
	near := func(x, y time.Time) bool { d := x.Sub(y); return d < bound && d > -bound }
	n := 0
	err := st.Steps(context.Background(), testRunID, func(s checkpoint.Step) error {
		n++
		if !near(s.StartedAt, a.StartedAt) || !near(s.FinishedAt, a.FinishedAt) ||
			s.StartedAt.Before(a.StartedAt.Add(-bound)) || s.FinishedAt.After(a.FinishedAt.Add(bound)) {
			t.Errorf("step %s ran %s..%s, its attempt %s..%s: want them within %s of each other, on one clock",
				s.ID, s.StartedAt.Format(time.RFC3339Nano), s.FinishedAt.Format(time.RFC3339Nano),
				a.StartedAt.Format(time.RFC3339Nano), a.FinishedAt.Format(time.RFC3339Nano), bound)
		}
		return nil
	})
	if err != nil || n != 2 {
		t.Fatalf("steps: %d, %v; want 2", n, err)
	}
}
