package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// ErrInterrupted is returned when a run stops because its context was
// cancelled (a signal, a deadline). The run is recorded as interrupted and
// resumes from its checkpoints on the next run or resume.
var ErrInterrupted = steps.ErrInterrupted

// Config configures a Runner.
type Config struct {
	// Store holds runs and checkpoints: one typed handle on a backend,
	// which the runner's steps, workers, scheduler and dispatches all
	// use. Required.
	Store checkpoint.Backend
	// Jobs is the registry jobs are looked up in. Required.
	Jobs *jobs.Registry
	// Logger receives the runner's logs. Defaults to zerolog.Nop().
	Logger zerolog.Logger
	// Clock is the time source. Defaults to SystemClock.
	Clock Clock
	// Owner names this runner in leases and attempts. Defaults to
	// DefaultOwner() ("HOST:PID" with the kernel boot and PID namespace).
	// A custom owner carries no identity, so its runs are never taken
	// over before their lease expires (see OwnerGone).
	Owner string
	// Lease is how long a claim lasts without a heartbeat; the runner
	// heartbeats every third of it. A crashed runner's run can be taken
	// over once it expires (at once if the runner was of this kernel boot
	// and PID namespace and its process is gone). An outside call
	// (steps.Call) must also end within it: its context ends a fifth of
	// the lease before the lease would, so give slow calls a longer lease.
	// Defaults to 30s.
	Lease time.Duration
	// Wait makes a claim of a run held by another runner wait for it
	// instead of failing with *checkpoint.LeaseHeldError (and one over its
	// job's concurrency limit wait for room instead of failing with
	// *checkpoint.LimitReachedError), and every write
	// of the run (its claim, its steps' checkpoints, its end) that finds
	// the database locked by another process wait for the lock, retrying
	// every WaitPoll until the run's context ends, instead of failing
	// with checkpoint.ErrLocked. Without it such a write fails the run
	// (with the write's error), and the next run or resume goes on from
	// the checkpoints.
	Wait bool
	// WaitForLimit makes a claim over its job's concurrency limit wait for
	// room, retrying every WaitPoll until the run's context ends, instead
	// of failing with *checkpoint.LimitReachedError (Wait implies it).
	WaitForLimit bool
	// WaitPoll is how often a waiting claim retries. Defaults to 500ms.
	WaitPoll time.Duration
	// OnProgress, if set, receives batch steps' progress after each chunk
	// (a progress bar, say).
	OnProgress func(steps.Progress)
	// ProgressLog is how often a batch step's progress is logged, at info
	// with the run's job, run_id and attempt: its first chunk, then at
	// most once per ProgressLog, and its last chunk. Defaults to
	// DefaultProgressLog (5s); negative logs no progress (when a bar shows
	// it instead).
	ProgressLog time.Duration
	// Deliver, if set, receives the outbox messages due after each run
	// (those of this run and any left undelivered before).
	Deliver Delivery
	// SelfFenceMargin is how long before its lease would expire a runner
	// that could not renew it stops: it heartbeats every third of Lease
	// and retries a failed renewal (the database unreachable, say) with a
	// jittered backoff; if none succeeded by the lease's known expiry less
	// this margin, it cancels the attempt's context with a
	// *LeaseLostError, so the job's steps and their outside calls stop
	// before another runner may take the run over. Defaults to a third of
	// Lease; at most half of it.
	SelfFenceMargin time.Duration
	// PartitionSlots is how many partitions of a partitioned batch step
	// (steps.Partitions) a run this runner drives works at once, on
	// goroutines of this process (steps.Config.PartitionSlots): the rest
	// are left to partition workers (WorkPartition, `stepwise worker`) or
	// to a goroutine once it is free. Zero means every partition at once.
	// A Worker sets 1 when it is zero: the run takes one of the worker's
	// slots, and the worker's other slots and other workers take the
	// other partitions.
	PartitionSlots int
	// TracerProvider makes the spans of the runs: one per attempt (the
	// parent of its steps' spans and, in a batch step, of a span per
	// chunk), with the run ID, attempt, step ID, item counts and outcome
	// as attributes (see steps.AttrRunID and the others). Steps' functions
	// run under their step's span, so an outside call can carry it
	// (steps.InjectTrace). Defaults to the global OpenTelemetry provider
	// (otel.GetTracerProvider), a no-op unless the program set one.
	TracerProvider trace.TracerProvider
	// Targets are the outside resources this process's operator
	// configured by name: the "target:NAME" parameters of the runs it
	// executes (those started over the API, in this process or queued for
	// a worker) resolve to their locations when the job function is
	// called (jobs.WithTargets). A run naming a target they do not
	// configure fails with a *jobs.UnknownTargetError. Nil configures
	// none.
	Targets *jobs.Targets
	// Metrics, if set, counts the runs this runner executes, however they
	// were started (Run, Resume, Claim, a Worker's queue or a Scheduler's
	// fire): each claim, each end by status, its steps and effects, and
	// the attempt's and its steps' durations. A Scheduler gives its own
	// SchedulerConfig.Metrics when this is nil.
	Metrics *Metrics
}

func (c *Config) validate() error {
	if c.Store == nil {
		return errors.New("runner: Config.Store is nil; open a checkpoint store")
	}
	if c.Jobs == nil {
		return errors.New("runner: Config.Jobs is nil; give the job registry")
	}
	if c.Lease < 0 || c.WaitPoll < 0 || c.PartitionSlots < 0 {
		return fmt.Errorf("runner: Config.Lease (%s), Config.WaitPoll (%s) and Config.PartitionSlots (%d) cannot be negative",
			c.Lease, c.WaitPoll, c.PartitionSlots)
	}
	if c.Lease > 0 && c.Lease < 100*time.Millisecond {
		return fmt.Errorf("runner: Config.Lease is %s; use at least 100ms", c.Lease)
	}
	if c.Clock == nil {
		c.Clock = SystemClock{}
	}
	if c.Owner == "" {
		c.Owner = DefaultOwner()
	}
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	switch {
	case c.SelfFenceMargin < 0:
		return fmt.Errorf("runner: Config.SelfFenceMargin (%s) cannot be negative", c.SelfFenceMargin)
	case c.SelfFenceMargin == 0:
		c.SelfFenceMargin = c.Lease / 3
	case c.SelfFenceMargin > c.Lease/2:
		return fmt.Errorf("runner: Config.SelfFenceMargin is %s; use at most half of the %s lease, leaving time to retry a failed renewal",
			c.SelfFenceMargin, c.Lease)
	}
	if c.WaitPoll == 0 {
		c.WaitPoll = 500 * time.Millisecond
	}
	return nil
}

// Runner executes runs of registered jobs.
type Runner struct {
	cfg    Config
	tracer trace.Tracer
	// skew caches the store's clock's offset for storeClock.
	skew storeSkew
}

// New returns a Runner for cfg.
func New(cfg Config) (*Runner, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	for _, j := range cfg.Jobs.Jobs() {
		cfg.Metrics.knownJob(j.Name())
	}
	return &Runner{cfg: cfg, tracer: tp.Tracer(steps.TracerName)}, nil
}

// Request asks for a run of a job.
type Request struct {
	// Job is the registered job's name.
	Job string
	// Values are name=value parameters (the CLI's -p flags); they win over
	// ParamsFile.
	Values map[string]string
	// ParamsFile is a JSON object of parameters, or nil.
	ParamsFile []byte
	// Force runs a succeeded or abandoned run again (completed steps are
	// still skipped).
	Force bool
	// DryRun executes the job without claiming the run or writing
	// anything: effects are planned against current values and returned in
	// Result.DryPlans.
	DryRun bool
	// RetrySkipped makes batch steps process again the items an earlier
	// attempt skipped under their skip policy.
	RetrySkipped bool
	// AcceptChanged, if set, lets batch steps go on past items whose
	// source changed since an earlier attempt, each acceptance audited
	// (steps.Config.AcceptChanged).
	AcceptChanged *steps.Acceptance
	// CreateOnly runs the run only if this request creates it: an existing
	// run is refused with a *checkpoint.RunExistsError (or a
	// *checkpoint.ParamsMismatchError) and is neither resumed nor changed.
	CreateOnly bool
	// Audits are the operator's records of this run or resume (who, why:
	// a rerun, a resume with a reason, an acceptance of changed items),
	// written in the claim's transaction (checkpoint.ClaimRequest.Audits):
	// if they cannot be written, nothing is claimed and no step runs.
	Audits []checkpoint.Audit
}

// Result says how a run ended.
type Result struct {
	RunID   string
	Status  string // a checkpoint.Run* status
	Attempt int
	Stats   steps.Stats
	// TookOverFrom names a dead or stale runner this attempt replaced.
	TookOverFrom string
	// DryPlans is what a dry run would have applied, step by step.
	DryPlans []steps.DryPlan
}

// Run starts or resumes the run that req's job and identifying parameters
// name.
func (r *Runner) Run(ctx context.Context, req Request) (Result, error) {
	job, err := r.cfg.Jobs.Lookup(req.Job)
	if err != nil {
		return Result{}, err
	}
	dec, err := job.Decode(req.Values, req.ParamsFile)
	if err != nil {
		return Result{}, err
	}
	if req.DryRun {
		return r.dryRun(ctx, job, dec)
	}
	return r.execute(ctx, job, dec, req)
}

// dryAttempt executes the job on a write-free steps.Run; dryRun wraps it
// in a span.
func (r *Runner) dryAttempt(ctx context.Context, job jobs.Job, dec jobs.Decoded) (Result, error) {
	runID := jobs.RunID(job.Name(), dec.RunKey)
	// Refused as the real run would be, by the same claim rule: a run key
	// always means the same parameters, and a pruned run cannot run again.
	// (A dry run claims nothing, so a lease or a finished run does not stop it.)
	switch info, err := r.cfg.Store.Run(ctx, runID); {
	case errors.Is(err, checkpoint.ErrNotFound):
	case err != nil:
		return Result{}, err
	default:
		req := checkpoint.ClaimRequest{RunID: runID, Params: dec.JSON, ParamsHash: dec.Hash, Force: true,
			OwnerGone: func(string) bool { return true }}
		if _, err := checkpoint.MayClaim(info.Run, req, r.cfg.Clock.Now()); err != nil {
			return Result{}, err
		}
	}
	log := r.cfg.Logger.With().Str(steps.FieldJob, job.Name()).Bool("dry_run", true).Logger()
	run, err := steps.Begin(ctx, r.dryConfig(job, runID, log))
	if err != nil {
		return Result{RunID: runID}, err
	}
	defer run.Close()
	jobErr := callJob(jobs.WithTargets(ctx, r.cfg.Targets), job, run, dec.JSON)
	res := Result{RunID: runID, Status: "dry-run", Stats: run.Stats(), DryPlans: run.DryPlans()}
	if jobErr != nil && !errors.Is(jobErr, steps.ErrDryRunStopped) { // stopped at a call: planned, not failed
		return res, fmt.Errorf("dry run of %s failed: %w", runID, jobErr)
	}
	return res, nil
}

// Resume runs runID again with its stored parameters; req.Job, Values and
// ParamsFile are ignored.
func (r *Runner) Resume(ctx context.Context, runID string, req Request) (Result, error) {
	job, dec, err := r.stored(ctx, runID)
	if err != nil {
		return Result{}, err
	}
	if req.DryRun {
		return r.dryRun(ctx, job, dec)
	}
	return r.execute(ctx, job, dec, req)
}

// stored looks up a recorded run's job and decodes its stored parameters.
func (r *Runner) stored(ctx context.Context, runID string) (jobs.Job, jobs.Decoded, error) {
	info, err := r.cfg.Store.Run(ctx, runID)
	if err != nil {
		return nil, jobs.Decoded{}, err
	}
	job, err := r.cfg.Jobs.Lookup(info.Run.Job)
	if err != nil {
		return nil, jobs.Decoded{}, fmt.Errorf("run %s: %w", runID, err)
	}
	dec, err := job.Decode(nil, info.Run.Params)
	if err != nil {
		return nil, jobs.Decoded{}, fmt.Errorf("run %s: stored parameters no longer decode: %w", runID, err)
	}
	return job, dec, nil
}

// NeedsOperator reports whether a job's error is a stop for an operator's
// decision rather than a failure: a step or batch item whose input changed
// since it ran, or an outside call of unknown outcome. The run is recorded
// failed (resumable) and reported as stopped for an operator decision.
func NeedsOperator(err error) bool {
	var (
		changed *steps.StepChangedError
		item    *steps.ItemChangedError
		unknown *steps.OutcomeUnknownError
		notRec  *steps.StepNotRecordedError
	)
	return errors.As(err, &changed) || errors.As(err, &item) || errors.As(err, &unknown) || errors.As(err, &notRec)
}

// dispatch delivers the outbox messages due, when a delivery is set.
// Failures are logged and retried on a later pass: the run's outcome does
// not depend on them.
func (r *Runner) dispatch(ctx context.Context, log zerolog.Logger) {
	if r.cfg.Deliver == nil {
		return
	}
	ctx, span := r.tracer.Start(context.WithoutCancel(ctx), "outbox delivery")
	defer span.End()
	d := Dispatcher{Store: r.cfg.Store, To: r.cfg.Deliver, Clock: r.cfg.Clock, Logger: log}
	res, err := d.Pass(ctx)
	traceDispatch(span, res, err)
	if err != nil {
		log.Warn().Err(err).Msg("outbox dispatch failed; messages stay queued")
	} else if res.Sent+res.Failed > 0 {
		log.Info().Int("sent", res.Sent).Int("failed", res.Failed).Msg("outbox dispatched")
	}
}
