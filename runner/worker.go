package runner

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// EnqueueRequest asks for a run of a job to be queued for a worker.
type EnqueueRequest struct {
	// Job is the registered job's name.
	Job string
	// Values and ParamsFile are the parameters, as for Request.
	Values     map[string]string
	ParamsFile []byte
	// Queue is the queue's name; empty means checkpoint.DefaultQueue.
	Queue string
	// Priority orders the queue: higher first, then older first.
	Priority int
	// NotBefore is the earliest time a worker may start the run; zero
	// means at once.
	NotBefore time.Time
}

// Enqueue queues a run of req's job for the workers (Worker), validating
// its parameters as Run does. An existing run key with the same
// parameters is left as it is (Created false, and the run's status); with
// other parameters it is refused with a *checkpoint.ParamsMismatchError.
func (r *Runner) Enqueue(ctx context.Context, req EnqueueRequest) (checkpoint.EnqueueResult, error) {
	job, err := r.cfg.Jobs.Lookup(req.Job)
	if err != nil {
		return checkpoint.EnqueueResult{}, err
	}
	dec, err := job.Decode(req.Values, req.ParamsFile)
	if err != nil {
		return checkpoint.EnqueueResult{}, err
	}
	return r.cfg.Store.Enqueue(ctx, checkpoint.EnqueueRequest{
		RunID: jobs.RunID(job.Name(), dec.RunKey), Job: job.Name(), RunKey: dec.RunKey, Params: dec.JSON, ParamsHash: dec.Hash,
		Queue: req.Queue, Priority: req.Priority, NotBefore: req.NotBefore, Now: r.cfg.Clock.Now(), Limit: dec.Limit,
	})
}

// Task is one piece of work a Worker runs in one of its slots. ctx ends
// when the worker's grace period after shutdown is over; a task must then
// stop and record that it was interrupted (resumably).
type Task func(ctx context.Context)

// WorkSource finds one piece of work for a free slot of a Worker and
// claims it: a queued run, a partition of a batch step. It returns nil
// when it has none now. A worker tries its sources in order for each free
// slot; an error is logged and the source tried again at the next poll.
type WorkSource func(ctx context.Context) (Task, error)

// WorkerConfig configures a Worker.
type WorkerConfig struct {
	// Runner configures the runs the worker drives, as for New; its Lease
	// is each claim's lease and its Owner names the worker. Its Store must
	// be a checkpoint.QueueStore.
	Runner Config
	// Queues are the queues the worker takes runs from, and partitions of
	// the runs of (runs started directly, in no queue, are then left to
	// others); empty means all.
	Queues []string
	// Concurrency is how many runs (tasks) the worker drives at once.
	// Defaults to 1.
	Concurrency int
	// Poll is how often an idle worker looks for work anyway, jittered by
	// up to a fifth either way: the only wake-up on a store without
	// checkpoint.QueueWaker (SQLite), the fallback on one with it.
	// Defaults to 1s.
	Poll time.Duration
	// Debounce is how long the worker lets enqueue notifications gather
	// before it claims, so a burst of enqueues costs one pass. Defaults
	// to 100ms.
	Debounce time.Duration
	// Grace is how long Run, once its context ends, lets the runs in
	// flight finish before it interrupts them (recorded interrupted,
	// their leases released; a queued run interrupted so is due again for
	// any worker). Zero interrupts them at once.
	Grace time.Duration
	// Sources are more kinds of work, tried after the run queue and the
	// partitions for each free slot.
	Sources []WorkSource
	// NoPartitions leaves partitions of batch steps (steps.Partitions) to
	// other runners: by default a free slot that finds no queued run
	// claims a pending or lease-expired partition of any running run of a
	// registered job and works it (Runner.WorkPartition).
	NoPartitions bool
	// OnDone, if set, is called after each run the worker drove ended,
	// with its result (tests, metrics).
	OnDone func(Result, error)
	// OnPartitionDone, if set, is called after each partition the worker
	// worked (not the runs it drove), with its error: nil once the
	// partition is done (tests, metrics).
	OnPartitionDone func(checkpoint.PartitionLease, error)
}

// Worker claims queued runs, and runs whose runner's lease expired (or,
// on this host, whose runner's process is surely gone: OwnerGone), and
// drives them, up to Concurrency at once, until its context ends. Many
// workers on many hosts may share one store: each claim (ClaimBatch, or
// FinishAndClaim with the ends of its slots' runs) gives each run to
// one of them, and the fence stops any stale one.
type Worker struct {
	cfg     WorkerConfig
	runner  *Runner
	queue   checkpoint.QueueStore
	clock   Clock
	log     zerolog.Logger
	started atomic.Bool
	ends    *ender // set by Run
	// gone, set by Run (nil off a host whose identity is unknown), takes
	// over a gone runner's work on this host: tried before the queue, so
	// a backlog does not hold it until the lease expires.
	gone WorkSource
}

// NewWorker returns a Worker for cfg.
func NewWorker(cfg WorkerConfig) (*Worker, error) {
	if cfg.Runner.PartitionSlots == 0 {
		// A run the worker drives takes one slot; its other partitions
		// go to the worker's other slots and to other workers.
		cfg.Runner.PartitionSlots = 1
	}
	r, err := New(cfg.Runner)
	if err != nil {
		return nil, err
	}
	cfg.Runner = r.cfg
	q := cfg.Runner.Store
	switch {
	case cfg.Concurrency < 0 || cfg.Poll < 0 || cfg.Debounce < 0 || cfg.Grace < 0:
		return nil, fmt.Errorf("runner: WorkerConfig.Concurrency (%d), Poll (%s), Debounce (%s) and Grace (%s) cannot be negative",
			cfg.Concurrency, cfg.Poll, cfg.Debounce, cfg.Grace)
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	if cfg.Poll == 0 {
		cfg.Poll = time.Second
	}
	if cfg.Debounce == 0 {
		cfg.Debounce = 100 * time.Millisecond
	}
	var clock Clock = SystemClock{}
	if cfg.Runner.Clock != nil {
		clock = cfg.Runner.Clock
	}
	return &Worker{cfg: cfg, runner: r, queue: q, clock: clock, log: cfg.Runner.Logger}, nil
}

// claimRuns is the worker's first source of work: the run queue. It
// claims up to n runs in one ClaimBatch, one task each.
func (w *Worker) claimRuns(ctx context.Context, jobNames []string, n int) ([]Task, error) {
	claimedAt := w.cfg.Runner.Clock.Now()
	cs, err := w.queue.ClaimBatch(ctx, w.claimRequest(jobNames, claimedAt, n))
	if err != nil {
		return nil, err
	}
	tasks := make([]Task, len(cs))
	for i, c := range cs {
		tasks[i] = w.runTask(ctx, c, claimedAt)
	}
	return tasks, nil
}

// claimRequest is the worker's claim of up to n queued runs at now.
func (w *Worker) claimRequest(jobNames []string, now time.Time, n int) checkpoint.ClaimNextRequest {
	return checkpoint.ClaimNextRequest{Queues: w.cfg.Queues, Jobs: jobNames, Owner: w.cfg.Runner.Owner, Now: now,
		LeaseFor: w.cfg.Runner.Lease, Max: n}
}

// runTask drives claim c in a slot, and then, while the worker still
// claims (claimCtx), the next queued run the slot took with its run's
// end (the ender: one commit for the ends of the slots ready together and
// their next runs), until none is due.
func (w *Worker) runTask(claimCtx context.Context, c checkpoint.Claim, claimedAt time.Time) Task {
	return func(ctx context.Context) {
		for {
			var (
				next   *checkpoint.Claim
				nextAt time.Time
			)
			finish := func(fctx context.Context, l checkpoint.Lease, e checkpoint.Ending) error {
				next = nil
				if claimCtx.Err() != nil || ctx.Err() != nil {
					return w.cfg.Runner.Store.Finish(fctx, l, e)
				}
				reply := make(chan endReply, 1)
				w.ends.reqs <- endReq{fin: checkpoint.Finished{Lease: l, Ending: e}, reply: reply}
				rep := <-reply
				if rep.unknown != nil {
					// The end is unknown: record it alone, as Finish
					// would have (it is idempotent for the lease).
					w.log.Debug().Err(rep.unknown).Str(steps.FieldRunID, l.RunID).Msg("finish and claim failed; finishing alone")
					return w.cfg.Runner.Store.Finish(fctx, l, e)
				}
				next, nextAt = rep.next, rep.claimedAt
				return rep.err
			}
			res, err := w.runner.driveClaim(ctx, c, claimedAt, finish)
			if w.cfg.OnDone != nil {
				w.cfg.OnDone(res, err)
			}
			if next == nil {
				return
			}
			c, claimedAt = *next, nextAt
		}
	}
}

// claimPartitions is the worker's second source of work: partitions of
// batch steps of running runs.
func (w *Worker) claimPartitions() WorkSource {
	ps := w.cfg.Runner.Store
	return func(ctx context.Context) (Task, error) {
		claimedAt := w.cfg.Runner.Clock.Now()
		// Not cut short by ctx (the worker stopping): a claim the server
		// made but whose answer was lost would leave the partition held
		// until its lease passed; claimed, the task hands it back at once.
		cctx, done := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.Runner.Lease)
		defer done()
		_, pl, ok, err := ps.ClaimPartition(cctx, checkpoint.PartitionClaim{Owner: w.cfg.Runner.Owner, Jobs: w.jobNames(),
			Queues: w.cfg.Queues, Now: claimedAt, LeaseFor: w.cfg.Runner.Lease})
		if err != nil || !ok {
			return nil, err
		}
		return w.partitionTask(pl, claimedAt), nil
	}
}

// partitionTask works the partition claimed as pl at claimedAt.
func (w *Worker) partitionTask(pl checkpoint.PartitionLease, claimedAt time.Time) Task {
	return func(ctx context.Context) {
		err := w.runner.workPartition(ctx, pl, claimedAt)
		log := w.log.With().Str(steps.FieldRunID, pl.RunID).Str(steps.FieldStepID, pl.Step).Int("partition", pl.Index).Logger()
		switch {
		case err == nil:
		case errors.Is(err, checkpoint.ErrFenced), errors.Is(err, steps.ErrPartitionLeaseLost), errors.Is(err, ErrInterrupted),
			errors.Is(err, checkpoint.ErrTransient):
			log.Warn().Err(err).Msg("stopped working a partition; it is left to the runner holding it, or to the next claim")
		default:
			log.Error().Err(err).Msg("partition not worked")
		}
		if w.cfg.OnPartitionDone != nil {
			w.cfg.OnPartitionDone(pl, err)
		}
	}
}

// jobNames are the names of the worker's registered jobs.
func (w *Worker) jobNames() []string {
	var names []string
	for _, j := range w.cfg.Runner.Jobs.Jobs() {
		names = append(names, j.Name())
	}
	return names
}

// Run claims and drives work until ctx ends, then stops claiming, lets
// the work in flight finish within Grace, interrupts what is left and
// returns once every task has returned. It returns an error only when it
// cannot start.
func (w *Worker) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("runner: Worker.Run called twice; make a new Worker")
	}
	names := w.jobNames()
	if len(names) == 0 {
		return errors.New("runner: the worker's job registry is empty; it could run nothing")
	}
	var sources []WorkSource
	w.gone = w.takeOverGone(names)
	if !w.cfg.NoPartitions {
		sources = append(sources, w.claimPartitions())
	}
	sources = append(sources, w.cfg.Sources...)
	w.ends = &ender{queue: w.queue, clock: w.cfg.Runner.Clock, reqs: make(chan endReq), max: min(w.cfg.Concurrency, checkpoint.MaxClaimBatch),
		claim: func(now time.Time, n int) checkpoint.ClaimNextRequest { return w.claimRequest(names, now, n) }}
	// Several recorders, so a batch in flight does not hold up the ends
	// that arrive meanwhile: each takes what is waiting when it is free.
	var recorders sync.WaitGroup
	for range enderRecorders(w.cfg.Concurrency) {
		recorders.Go(func() { w.ends.loop(context.WithoutCancel(ctx)) })
	}
	wake, stopListening := w.listen(ctx)
	defer stopListening()
	tasksCtx, cancelTasks := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelTasks(nil)
	s := &slots{ctx: tasksCtx, done: make(chan struct{}, w.cfg.Concurrency)}
	w.log.Info().Str("owner", w.cfg.Runner.Owner).Strs("queues", w.cfg.Queues).Int("concurrency", w.cfg.Concurrency).
		Strs("jobs", names).Msg("worker started")
	w.claimUntilDone(ctx, names, sources, wake, s)
	w.drain(s, cancelTasks)
	s.wg.Wait()
	close(w.ends.reqs)
	recorders.Wait()
	w.log.Info().Msg("worker stopped")
	return nil
}

// slots are the worker's tasks in flight: each sends on done when it
// returns.
type slots struct {
	ctx      context.Context // the tasks' context, cancelled by drain
	wg       sync.WaitGroup
	done     chan struct{}
	inFlight int
}

// listen returns the channel that wakes the worker when a run is enqueued
// (nil: the store cannot wake it, or listening failed; the worker polls),
// and the function that stops listening.
func (w *Worker) listen(ctx context.Context) (<-chan struct{}, func()) {
	qw, ok := checkpoint.Waker(w.cfg.Runner.Store)
	if !ok {
		return nil, func() {}
	}
	listenCtx, stop := context.WithCancel(ctx)
	ch, err := qw.WakeOnEnqueue(listenCtx)
	if err != nil {
		w.log.Warn().Err(err).Msg("cannot listen for enqueued runs; polling only")
		return nil, stop
	}
	return ch, stop
}

// claimUntilDone fills the free slots, then waits for a slot to free, the
// poll (jittered), or a wake-up (debounced), until ctx ends.
func (w *Worker) claimUntilDone(ctx context.Context, names []string, sources []WorkSource, wake <-chan struct{}, s *slots) {
	for ctx.Err() == nil {
		w.fill(ctx, names, sources, s)
		poll := w.cfg.Poll*4/5 + rand.N(w.cfg.Poll*2/5+1)
		select {
		case <-ctx.Done():
		case <-s.done:
			s.inFlight--
		case <-w.clock.After(poll):
		case _, ok := <-wake:
			if !ok {
				wake = nil
				continue
			}
			select { // debounce: let a burst of enqueues gather
			case <-ctx.Done():
			case <-w.clock.After(w.cfg.Debounce):
			}
		}
	}
}

// fill claims work for the free slots: a gone runner's work on this host
// first (one task a pass), then queued runs, as many as there are free
// slots in one ClaimBatch, then the other sources one task at a time,
// until every slot is busy or no source has any; after a source's error
// the next pass waits for the poll.
func (w *Worker) fill(ctx context.Context, names []string, sources []WorkSource, s *slots) {
	for s.inFlight < w.cfg.Concurrency && ctx.Err() == nil {
		if w.gone != nil {
			if t, _ := w.gone(ctx); t != nil { // its errors are logged as it meets them
				s.start(t)
				continue
			}
		}
		tasks, err := w.claimRuns(ctx, names, min(w.cfg.Concurrency-s.inFlight, checkpoint.MaxClaimBatch))
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn().Err(err).Msg("could not claim work; trying again at the next poll")
			}
			return
		}
		for _, src := range sources {
			if len(tasks) > 0 {
				break
			}
			t, err := src(ctx)
			if err != nil {
				if ctx.Err() == nil {
					w.log.Warn().Err(err).Msg("could not claim work; trying again at the next poll")
				}
				return
			}
			if t != nil {
				tasks = append(tasks, t)
			}
		}
		if len(tasks) == 0 {
			return
		}
		for _, task := range tasks {
			s.start(task)
		}
	}
}

// start runs task in a slot of its own.
func (s *slots) start(task Task) {
	s.inFlight++
	s.wg.Go(func() {
		defer func() { s.done <- struct{}{} }()
		task(s.ctx)
	})
}

// drain waits for the tasks in flight: within Grace, then interrupting
// what is left (at once without a grace period).
func (w *Worker) drain(s *slots, cancelTasks context.CancelCauseFunc) {
	var graceOver <-chan time.Time
	if w.cfg.Grace > 0 && s.inFlight > 0 {
		w.log.Info().Int("running", s.inFlight).Float64(fieldGraceSeconds, w.cfg.Grace.Seconds()).
			Msg("worker stopping: claiming no more; waiting for the runs in flight")
		graceOver = w.clock.After(w.cfg.Grace)
	} else if s.inFlight > 0 {
		cancelTasks(errors.New("worker stopped"))
	}
	for s.inFlight > 0 {
		select {
		case <-s.done:
			s.inFlight--
		case <-graceOver:
			graceOver = nil
			w.log.Warn().Int("running", s.inFlight).Float64(fieldGraceSeconds, w.cfg.Grace.Seconds()).
				Msg("grace period over; interrupting the runs in flight (resumable: they are due again for any worker)")
			cancelTasks(fmt.Errorf("worker stopped; grace period of %s over", w.cfg.Grace))
		}
	}
}
