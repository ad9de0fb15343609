package runner_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// startWorker runs a worker on h's store until the test stops it; stop
// cancels its context and waits for Run to return.
func startWorker(t *testing.T, h *harness, mod func(*runner.WorkerConfig)) (stop func()) {
	t.Helper()
	cfg := runner.WorkerConfig{Runner: runner.Config{Store: h.st, Jobs: h.reg, Owner: "worker:1", Lease: 5 * time.Second},
		Poll: 20 * time.Millisecond, Debounce: time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	w, err := runner.NewWorker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-ran:
				if err != nil {
					t.Errorf("worker: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the worker did not return within 30s of its context ending")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// enqueueDates queues one run of the test job per date, with note.
func enqueueDates(t *testing.T, h *harness, note func(date string) string, dates ...string) {
	t.Helper()
	r := h.runner(nil)
	for _, d := range dates {
		res, err := r.Enqueue(context.Background(), runner.EnqueueRequest{Job: "job", Values: map[string]string{"date": d, "note": note(d)}})
		if err != nil || !res.Created {
			t.Fatalf("enqueue %s: %+v, %v", d, res, err)
		}
	}
}

// A worker driving several runs at once keeps a panic in one run's job
// code to that run's attempt: the others, in flight at the same moment,
// succeed, and the worker goes on.
func TestWorkerPanicFailsOnlyItsAttempt(t *testing.T) {
	h := newHarness(t)
	const n = 4
	var (
		mu       sync.Mutex
		inFlight int
		all      = make(chan struct{}) // closed once n runs are in flight together
		ended    = make(chan runner.Result, 2*n)
	)
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
		mu.Lock()
		if inFlight++; inFlight == n {
			close(all)
		}
		mu.Unlock()
		select {
		case <-all:
		case <-time.After(20 * time.Second):
			return fmt.Errorf("only %d runs in flight together", inFlight)
		}
		if err := h.step(ctx, run, "load/"+p.Date); err != nil {
			return err
		}
		if p.Note == "panic" {
			panic("boom in " + p.Date)
		}
		return h.step(ctx, run, "summary/"+p.Date)
	}
	dates := []string{"2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04", "2026-11-05"}
	enqueueDates(t, h, func(d string) string {
		if d == "2026-11-02" {
			return "panic"
		}
		return ""
	}, dates[:n]...)
	stop := startWorker(t, h, func(c *runner.WorkerConfig) {
		c.Concurrency = n
		c.OnDone = func(res runner.Result, _ error) { ended <- res }
	})
	for range n {
		select {
		case <-ended:
		case <-time.After(30 * time.Second):
			t.Fatal("the worker did not end every run within 30s")
		}
	}
	// The worker goes on after the panic: a run enqueued now is driven too.
	enqueueDates(t, h, func(string) string { return "" }, dates[n])
	select {
	case res := <-ended:
		if res.Status != checkpoint.RunSucceeded {
			t.Errorf("the run after the panic: %+v; want succeeded", res)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the worker drove nothing after the panic")
	}
	stop()
	for _, d := range dates {
		info, err := h.st.Run(context.Background(), "job/"+d)
		if err != nil {
			t.Fatal(err)
		}
		want := checkpoint.RunSucceeded
		if d == "2026-11-02" {
			want = checkpoint.RunFailed
		}
		if info.Run.Status != want || len(info.Attempts) != 1 {
			t.Errorf("%s: %s with %d attempts; want %s with 1", d, info.Run.Status, len(info.Attempts), want)
		}
		if want == checkpoint.RunFailed && (!strings.Contains(info.Attempts[0].Error, "panic in job code") ||
			!strings.Contains(info.Attempts[0].Error, "worker_test.go")) {
			t.Errorf("the panicking attempt recorded %q; want the panic and its stack", info.Attempts[0].Error)
		}
		if h.called("load/"+d) != 1 {
			t.Errorf("%s: load ran %d times; want 1", d, h.called("load/"+d))
		}
	}
}

// On shutdown a worker claims nothing more, lets the runs in flight run
// for its grace period, then interrupts them: recorded interrupted with
// their leases released, due again for the next worker, which finishes
// them without running their completed steps again.
func TestWorkerShutdownInterruptsAfterGrace(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	started := make(chan string, 4)
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
		if err := h.step(ctx, run, "load/"+p.Date); err != nil {
			return err
		}
		started <- p.Date
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return h.step(ctx, run, "summary/"+p.Date)
	}
	enqueueDates(t, h, func(string) string { return "" }, "2026-11-01", "2026-11-02", "2026-11-03")
	stop := startWorker(t, h, func(c *runner.WorkerConfig) {
		c.Concurrency = 2
		c.Grace = 50 * time.Millisecond
	})
	for range 2 {
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("two runs did not start within 30s")
		}
	}
	stop()
	statuses := map[string]int{}
	for _, d := range []string{"2026-11-01", "2026-11-02", "2026-11-03"} {
		info, err := h.st.Run(context.Background(), "job/"+d)
		if err != nil {
			t.Fatal(err)
		}
		statuses[info.Run.Status]++
		if info.Run.LeaseOwner != "" || !info.Run.LeaseUntil.IsZero() {
			t.Errorf("%s: still leased to %q until %s after the worker stopped", d, info.Run.LeaseOwner, info.Run.LeaseUntil)
		}
	}
	if statuses[checkpoint.RunInterrupted] != 2 || statuses[checkpoint.RunQueued] != 1 {
		t.Fatalf("statuses after shutdown: %v; want 2 interrupted (in flight past the grace) and 1 still queued", statuses)
	}
	// The next worker takes all three and finishes them.
	close(release)
	ended := make(chan runner.Result, 3)
	startWorker(t, h, func(c *runner.WorkerConfig) {
		c.Runner.Owner = "worker:2"
		c.Concurrency = 3
		c.OnDone = func(res runner.Result, _ error) { ended <- res }
	})
	for range 3 {
		select {
		case res := <-ended:
			if res.Status != checkpoint.RunSucceeded {
				t.Errorf("run %s after the restart: %s; want succeeded", res.RunID, res.Status)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the second worker did not finish the runs within 30s")
		}
	}
	for _, d := range []string{"2026-11-01", "2026-11-02", "2026-11-03"} {
		if n := h.called("load/" + d); n != 1 {
			t.Errorf("%s: load ran %d times; want 1 (checkpointed before the interruption)", d, n)
		}
	}
}

// A scheduler with Enqueue queues each fire's run for the workers instead
// of running it: the fire is settled once queued, the job does not run in
// the scheduler, and a worker then drives the queued runs.
func TestSchedulerEnqueuesFires(t *testing.T) {
	var st checkpoint.Backend
	k := newTicks(0)
	synctest.Test(t, func(t *testing.T) {
		st = openStore(t)
		r := startScheduler(t, k, st, "a:1", []runner.Schedule{hourly(nil)}, func(c *runner.SchedulerConfig) { c.Enqueue = true })
		sleep(2*time.Hour + time.Minute)
		r.stop(t)
		if got := k.ran(); len(got) != 0 {
			t.Errorf("the scheduler ran %v itself; want every fire enqueued", got)
		}
		for _, key := range hours(1, 2) {
			if info := runOf(t, st, key); info.Run.Status != checkpoint.RunQueued || info.Run.Queue != checkpoint.DefaultQueue {
				t.Errorf("run %s: %s in queue %q; want queued in %q", key, info.Run.Status, info.Run.Queue, checkpoint.DefaultQueue)
			}
		}
		if got := settled(t, st, "hourly"); !got.Equal(epoch.Add(2 * time.Hour)) {
			t.Errorf("settle mark = %s; want 02:00 (fires settled once enqueued)", got)
		}
		// The store without its QueueWaker: a LISTEN connection's read
		// would never let the bubble's fake time pass. The worker polls.
		polled := struct{ checkpoint.Backend }{st}
		w, err := runner.NewWorker(runner.WorkerConfig{Runner: runner.Config{Store: polled, Jobs: k.reg, Owner: "w:1", Lease: 15 * time.Minute},
			Poll: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		sleep(10 * time.Second)
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got, want := k.ran(), hours(1, 2); !slices.Equal(got, want) {
			t.Errorf("the worker ran %v; want %v", got, want)
		}
	})
}
