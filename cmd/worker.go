package cmd

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
)

// EnqueueCmd queues a run of a job for the workers.
type EnqueueCmd struct {
	Job        string            `arg:"" help:"Registered job name (see '${name} jobs')."`
	Params     map[string]string `short:"p" mapsep:"none" placeholder:"NAME=VALUE" help:"A job parameter; repeat for several. Identifying parameters name the run: enqueueing a run key that exists changes nothing and says so (a failed one exits 5 naming the resume command)."`
	ParamsFile string            `type:"existingfile" placeholder:"FILE" help:"JSON object of job parameters; -p values override it."`
	Queue      string            `default:"default" help:"Queue to put the run in; a worker takes runs from the queues its --queues names (all when omitted)."`
	Priority   int               `default:"0" help:"Among a queue's due runs, higher priorities start first; equal ones oldest first."`
	NotBefore  string            `name:"not-before" placeholder:"TIME" help:"Earliest start: an RFC 3339 time (2026-11-28T06:00:00Z) or a duration from now (90m)."`
	JSON       bool              `name:"json" help:"Print the outcome as JSON on stdout."`
}

// enqueueView is enqueue's --json output.
type enqueueView struct {
	RunID       string    `json:"run_id"`
	Created     bool      `json:"created"`
	Status      string    `json:"status"`
	Queue       string    `json:"queue,omitempty"`
	Priority    int       `json:"priority"`
	AvailableAt time.Time `json:"available_at,omitzero"`
}

// Run implements the enqueue command.
func (c *EnqueueCmd) Run(env *Env) error {
	file, err := readParamsFile(c.ParamsFile)
	if err != nil {
		return err
	}
	var notBefore time.Time
	if c.NotBefore != "" {
		if d, err := time.ParseDuration(c.NotBefore); err == nil {
			notBefore = env.now().Add(d)
		} else if notBefore, err = time.Parse(time.RFC3339, c.NotBefore); err != nil {
			return usageError{fmt.Errorf("--not-before %q is neither an RFC 3339 time (2026-11-28T06:00:00Z) nor a duration (90m)", c.NotBefore)}
		}
	}
	st, err := env.Store()
	if err != nil {
		return err
	}
	r, err := runner.New(runner.Config{Store: st, Jobs: env.Registry, Logger: env.Logger()})
	if err != nil {
		return err
	}
	res, err := r.Enqueue(env.Ctx, runner.EnqueueRequest{Job: c.Job, Values: c.Params, ParamsFile: file,
		Queue: c.Queue, Priority: c.Priority, NotBefore: notBefore})
	if err != nil {
		return err
	}
	run := res.Run
	if c.JSON {
		return writeJSON(env.Stdout, enqueueView{RunID: run.ID, Created: res.Created, Status: run.Status,
			Queue: run.Queue, Priority: run.Priority, AvailableAt: run.AvailableAt})
	}
	if !res.Created && run.Status == checkpoint.RunFailed {
		// Left as it is, no worker takes it: say what does.
		return fmt.Errorf("%w: run %s exists already and failed (%s); nothing enqueued: resume it with `%s resume %s` "+
			"(it goes on from its checkpoints), or enqueue another run key", ErrNeedsDecision, run.ID, run.Error, env.Name, run.ID)
	}
	if !res.Created {
		fmt.Fprintf(env.Stdout, "run %s exists already (%s); nothing enqueued\n", run.ID, run.Status)
		return nil
	}
	when := "a worker starts it when one is free"
	if run.AvailableAt.After(env.now()) {
		when = "a worker starts it at " + run.AvailableAt.Format(time.RFC3339) + " or later"
	}
	fmt.Fprintf(env.Stdout, "run %s enqueued in queue %s (priority %d): %s\n", run.ID, run.Queue, run.Priority, when)
	return nil
}

// WorkerCmd claims queued runs, and partitions of batch steps, and works
// them until SIGTERM or SIGINT.
type WorkerCmd struct {
	Queues       []string      `sep:"," placeholder:"QUEUE" help:"Queues to take runs from, comma-separated, and partitions of batch steps of those queues' runs only (runs started directly with run are in no queue: their partitions are left to workers without --queues); all queues and every run's partitions when omitted."`
	Concurrency  int           `default:"1" nonzero:"" help:"Runs and partitions worked at once by this worker (at least 1); a panic in one run's job code fails that run's attempt only. A partitioned batch step of a run this worker drives works one partition in the run's slot; the worker's other slots, and other workers, take the rest."`
	NoPartitions bool          `name:"no-partitions" help:"Take queued runs only, leaving the partitions of batch steps (steps.Partitions, settle -p partitions=N) to other runners."`
	Lease        time.Duration `default:"30s" nonzero:"" help:"Lease length of the runs and partitions claimed; the worker heartbeats every third of it, and stops working one it could not renew by a third of the lease before it expires. A run or partition whose worker died is taken by another worker once its lease expires, or at once by a worker on the same host, where the dead worker's process is surely gone."`
	Poll         time.Duration `default:"1s" nonzero:"" help:"How often an idle worker looks for due runs and claimable partitions, jittered by a fifth: the only wake-up on SQLite; on PostgreSQL the fallback to LISTEN/NOTIFY, which wakes workers at each enqueue and when partitions are recorded or released."`
	targetFlags
	Grace time.Duration `default:"20s" help:"After SIGTERM or SIGINT: claim nothing more, let the runs in flight finish for this long, then interrupt them (recorded interrupted, leases released: due again for any worker). Keep it under STEPWISE_GRACE, after which the process exits anyway."`
	workerListenFlags
}

// Run implements the worker command.
func (c *WorkerCmd) Run(env *Env) error {
	if c.Concurrency < 1 {
		return usageError{fmt.Errorf("--concurrency %d: give at least 1", c.Concurrency)}
	}
	if err := checkGrace(c.Grace); err != nil {
		return usageError{err}
	}
	tokens, err := c.workerListenFlags.check()
	if err != nil {
		return usageError{err}
	}
	wm, err := c.newWorkerMetrics()
	if err != nil {
		return err
	}
	// Each run in flight may hold a connection for a write and another
	// for its heartbeat, and a partition of it two more (its chunk's
	// transaction and its heartbeat); claims need one more.
	env.maxConns = int32(max(4, 2*c.Concurrency+3))
	targets, err := c.targets()
	if err != nil {
		return usageError{err}
	}
	env.ownTargetCredentials = true // only the targets carry credentials
	env.lease = c.Lease
	st, err := env.DaemonStore()
	if err != nil {
		return err
	}
	warnMaintenance(env, st)
	w, err := runner.NewWorker(runner.WorkerConfig{
		Runner: runner.Config{Store: st, Jobs: env.Registry, Logger: env.Logger(), Lease: c.Lease,
			TracerProvider: env.tracing(false), Targets: targets, Metrics: wm.metrics},
		Queues:       c.Queues,
		Concurrency:  c.Concurrency,
		Poll:         c.Poll,
		Grace:        c.Grace,
		NoPartitions: c.NoPartitions,
	})
	if err != nil {
		return usageError{err}
	}
	queues := "every queue"
	if len(c.Queues) > 0 {
		queues = "queues " + strings.Join(c.Queues, ", ")
	}
	wake := "polling every " + c.Poll.String()
	if _, ok := checkpoint.Waker(st); ok {
		wake = "woken by LISTEN/NOTIFY, polling every " + c.Poll.String()
	}
	what := "runs of " + queues + " and partitions of batch steps"
	if c.NoPartitions {
		what = "runs of " + queues
	}
	where, stopListen, err := c.workerListenFlags.serve(env, st, tokens, wm)
	if err != nil {
		return err
	}
	defer stopListen()
	fmt.Fprintf(env.Stdout, "%s worker: taking %s from %s, %d at a time (%s)%s\n", env.Name, what, env.storeName(), c.Concurrency, wake, where)
	if err := w.Run(env.Ctx); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s worker: stopped\n", env.Name)
	return nil
}

// warnMaintenance logs, as warnings, what the store finds off in its
// database's housekeeping that a pool of workers suffers from (autovacuum
// on PostgreSQL; SQLite finds nothing). A check that fails says nothing:
// the worker runs either way.
func warnMaintenance(env *Env, st checkpoint.Backend) {
	ctx, cancel := context.WithTimeout(env.Ctx, 5*time.Second)
	defer cancel()
	log := env.Logger()
	warns, err := st.MaintenanceWarnings(ctx)
	if err != nil {
		log.Debug().Err(err).Msg("could not check the database's autovacuum settings")
		return
	}
	for _, w := range warns {
		log.Warn().Msg(w)
	}
}
