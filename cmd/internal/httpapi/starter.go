package httpapi

import (
	"context"
	"sync"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
)

// Started says what a Starter did with a run.
type Started struct {
	RunID string
	// Created is true when this start created the run.
	Created bool
	// Status is the run's status once started (running, or queued by a
	// starter that queues).
	Status string
}

// Starter is where the API's accepted runs go: Start claims (or queues) a
// new run and Resume an existing one, each returning as soon as that is
// recorded, never waiting for the run to end. Local executes them in the
// serving process; a deployment with workers plugs in a Starter that
// queues them instead.
type Starter interface {
	// Start starts the run req names; req.CreateOnly is set, so an
	// existing run is a *checkpoint.RunExistsError.
	Start(ctx context.Context, req runner.Request) (Started, error)
	// Resume claims the recorded run runID for another attempt.
	Resume(ctx context.Context, runID string, req runner.Request) (Started, error)
}

// Local is the Starter that executes runs in the serving process, each on
// a goroutine of its own through the runner, as serve's scheduler does.
type Local struct {
	r *runner.Runner
	// OnDone, if set, is called with each run's result when it ends (for
	// logs; the runner logs it too).
	OnDone func(runner.Result, error)

	mu      sync.Mutex
	cancels map[*runner.Claimed]context.CancelCauseFunc
	wg      sync.WaitGroup
	closed  bool
}

// NewLocal returns a Local executing runs with r.
func NewLocal(r *runner.Runner) *Local {
	return &Local{r: r, cancels: map[*runner.Claimed]context.CancelCauseFunc{}}
}

var _ Starter = (*Local)(nil)

// errStopping refuses runs once Shutdown began.
type errStopping struct{}

func (errStopping) Error() string {
	return "httpapi: the server is stopping; start the run again once it is back"
}

// Start implements Starter.
func (l *Local) Start(ctx context.Context, req runner.Request) (Started, error) {
	c, err := l.r.Claim(ctx, req)
	if err != nil {
		return Started{}, err
	}
	return l.execute(c), nil
}

// Resume implements Starter.
func (l *Local) Resume(ctx context.Context, runID string, req runner.Request) (Started, error) {
	c, err := l.r.ClaimRun(ctx, runID, req)
	if err != nil {
		return Started{}, err
	}
	return l.execute(c), nil
}

func (l *Local) execute(c *runner.Claimed) Started {
	ctx, cancel := context.WithCancelCause(context.Background())
	l.mu.Lock()
	closed := l.closed
	if !closed {
		l.cancels[c] = cancel
		l.wg.Add(1)
	}
	l.mu.Unlock()
	if closed {
		// Claimed, not executed: interrupted at once, resumable.
		cancel(errStopping{})
		res, err := c.Execute(ctx)
		l.done(res, err)
		return Started{RunID: c.RunID(), Created: c.Created(), Status: c.Run().Status}
	}
	go func() {
		defer l.wg.Done()
		res, err := c.Execute(ctx)
		l.mu.Lock()
		delete(l.cancels, c)
		l.mu.Unlock()
		cancel(nil)
		l.done(res, err)
	}()
	return Started{RunID: c.RunID(), Created: c.Created(), Status: c.Run().Status}
}

func (l *Local) done(res runner.Result, err error) {
	if l.OnDone != nil {
		l.OnDone(res, err)
	}
}

// Shutdown stops taking runs and waits for those executing to end until
// ctx ends; then it interrupts them (they are recorded interrupted,
// resumable) and waits for that.
func (l *Local) Shutdown(ctx context.Context) {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	ended := make(chan struct{})
	go func() { l.wg.Wait(); close(ended) }()
	select {
	case <-ended:
		return
	case <-ctx.Done():
	}
	l.mu.Lock()
	for _, cancel := range l.cancels {
		cancel(context.Cause(ctx))
	}
	l.mu.Unlock()
	<-ended
}

// Queued is the Starter of a deployment with workers (`serve --enqueue`):
// Start queues the run for `stepwise worker` (runner.Enqueue) instead of
// executing it here, and answers once it is queued; Resume, an operator's
// decision on one run, is executed by Local in the serving process as
// before (a queued run is resumed by the workers on their own).
type Queued struct {
	// Runner enqueues the runs in its store's run queue.
	Runner *runner.Runner
	// Local executes operators' resumes.
	Local *Local
	// Queue is the queue new runs go to; empty means the default queue.
	Queue string
}

var _ Starter = (*Queued)(nil)

// Start implements Starter: the run is queued, or, when its key exists
// with the same parameters, left as it is (*checkpoint.RunExistsError);
// other parameters are refused as Run refuses them.
func (q *Queued) Start(ctx context.Context, req runner.Request) (Started, error) {
	res, err := q.Runner.Enqueue(ctx, runner.EnqueueRequest{Job: req.Job, Values: req.Values, ParamsFile: req.ParamsFile, Queue: q.Queue})
	if err != nil {
		return Started{}, err
	}
	if !res.Created {
		return Started{}, &checkpoint.RunExistsError{Run: res.Run}
	}
	return Started{RunID: res.Run.ID, Created: true, Status: res.Run.Status}, nil
}

// Resume implements Starter, through Local.
func (q *Queued) Resume(ctx context.Context, runID string, req runner.Request) (Started, error) {
	return q.Local.Resume(ctx, runID, req)
}
