package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// DrainSlots are the worker slot counts the drain workload measures: one
// runner.Worker with that Concurrency on our side, that many claiming
// goroutines (one connection each on PostgreSQL) on the raw side.
var DrainSlots = []int{4, 16, 64}

// drainParams are the trivial queued job's parameters: its number.
type drainParams struct {
	N string `param:"n,key"`
}

// drainJob is the trivial job the drain workload queues: it does nothing,
// so the drain measures the queue (claim, attempt, lease, end).
var drainJob = jobs.Define("drain", func(context.Context, *steps.Run, drainParams) error { return nil })

// drain: a fresh queue of n trivial runs (enqueued through the runner, as
// `stepwise enqueue` does, and never analysed) drained by a runner.Worker
// with s slots, against s goroutines claiming a fresh raw queue table with
// one SKIP LOCKED UPDATE and completing each job with another. Each side
// drains two fresh queues of n/2, alternating, so drift in the machine's
// load hits both alike.
func (b *bench) drain(n int) error {
	slots := b.cfg.Slots
	if len(slots) == 0 {
		slots = DrainSlots
	}
	for _, s := range slots {
		b.say("queue drain with %d slots: %d queued runs, %d raw queue rows, fresh queues, no ANALYZE", s, n, n)
		var tOurs, tRaw time.Duration
		for round, part := range []int{n / 2, n - n/2} {
			name := fmt.Sprintf("drain%d_%d", s, round)
			// One connection a slot, and a few for the worker's own claims
			// (the listener has its own): a stock server allows 100.
			ours, raw, err := b.be.claimSides(b.ctx, name, s+4, part, false)
			if err != nil {
				return err
			}
			d, err := b.drainOurs(ours, s, part)
			b.be.release(ours, nil)
			if err == nil {
				tOurs += d
				d, err = drainRaw(b.ctx, raw, s, part)
				tRaw += d
			}
			b.be.release(nil, raw)
			if err != nil {
				return err
			}
		}
		b.rate(fmt.Sprintf("queue drain, %d slots (runner.Worker)", s), "runs/s", n, tOurs, tRaw, b.goals.drain,
			"raw: per job one UPDATE … WHERE id = (SELECT … FOR UPDATE SKIP LOCKED LIMIT 1) and one UPDATE marking it done, from as many goroutines as slots")
	}
	return nil
}

// drainOurs enqueues n trivial runs and times a worker with s slots
// draining them: from its start to the n-th run's recorded end. Every run
// must end succeeded, in its first attempt, once.
func (b *bench) drainOurs(st *store, s, n int) (time.Duration, error) {
	var reg jobs.Registry
	reg.MustRegister(drainJob)
	rcfg := runner.Config{Store: st, Jobs: &reg, Owner: runner.DefaultOwner(), Lease: time.Minute}
	r, err := runner.New(rcfg)
	if err != nil {
		return 0, err
	}
	if err := enqueueDrain(b.ctx, r, n); err != nil {
		return 0, fmt.Errorf("enqueue: %w", err)
	}
	var (
		mu    sync.Mutex
		seen  = make(map[string]bool, n)
		bad   error
		ended = make(chan struct{})
	)
	w, err := runner.NewWorker(runner.WorkerConfig{Runner: rcfg, Concurrency: s, NoPartitions: true,
		OnDone: func(res runner.Result, err error) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil || res.Status != "succeeded" || res.Attempt != 1:
				bad = errors.Join(bad, fmt.Errorf("run %s: %s in attempt %d (%v)", res.RunID, res.Status, res.Attempt, err))
			case seen[res.RunID]:
				bad = errors.Join(bad, fmt.Errorf("run %s driven twice", res.RunID))
			}
			seen[res.RunID] = true
			if len(seen) == n {
				close(ended)
			}
		}})
	if err != nil {
		return 0, err
	}
	ctx, stop := context.WithCancel(b.ctx)
	defer stop()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- w.Run(ctx) }()
	select {
	case <-ended:
	case err := <-done:
		return 0, fmt.Errorf("the worker stopped with %d of %d runs ended: %v", len(seen), n, err)
	case <-b.ctx.Done():
		return 0, b.ctx.Err()
	}
	d := time.Since(start)
	stop()
	if err := <-done; err != nil {
		return 0, err
	}
	mu.Lock()
	defer mu.Unlock()
	return d, bad
}

// enqueueDrain queues n runs of drainJob through r, from 8 goroutines.
func enqueueDrain(ctx context.Context, r *runner.Runner, n int) error {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		errs = make(chan error, 8)
	)
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				res, err := r.Enqueue(ctx, runner.EnqueueRequest{Job: drainJob.Name(), Values: map[string]string{"n": fmt.Sprintf("%06d", i)}})
				if err == nil && !res.Created {
					err = fmt.Errorf("run %s existed", res.Run.ID)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// drainRaw times s goroutines draining the raw queue of n jobs: each
// claims and completes jobs until it finds none left.
func drainRaw(ctx context.Context, raw rawClaims, s, n int) (time.Duration, error) {
	var (
		wg   sync.WaitGroup
		errs = make(chan error, s)
	)
	start := time.Now()
	for i := range s {
		owner := fmt.Sprintf("%s drainer-%d", runner.DefaultOwner(), i)
		wg.Go(func() {
			for {
				id, ok, err := raw.claim(ctx, owner)
				if err == nil && ok {
					err = raw.finish(ctx, id)
				}
				if err != nil {
					errs <- err
					return
				}
				if !ok {
					return
				}
			}
		})
	}
	wg.Wait()
	d := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	if got, err := raw.done(ctx); err != nil || got != n {
		return 0, fmt.Errorf("raw: %d jobs done, want %d (%v)", got, n, err)
	}
	return d, nil
}
