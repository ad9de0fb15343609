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
	// Metrics, if set, receives each attempt's duration, its steps'
	// durations and, when a run succeeds, the job's last-success time.
	// A Scheduler gives its own SchedulerConfig.Metrics when this is nil.
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
	// onClaim, if set, sees each run this runner claims the moment the
	// claim is recorded (a Scheduler's metrics count it as started).
	onClaim func(job string, c checkpoint.Claim)
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
	jobErr := callJob(ctx, job, run, dec.JSON)
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

// Claimed is a run claimed for one attempt that has not begun executing:
// Runner.Claim and Runner.ClaimRun return once the claim is recorded (so
// the caller knows at once whether it created the run, or why it was
// refused), and Execute runs the attempt, on whatever goroutine the
// caller chooses. Execute must be called, soon (before the lease would
// expire), and once.
type Claimed struct {
	r         *Runner
	job       jobs.Job
	dec       jobs.Decoded
	req       Request
	claim     checkpoint.Claim
	claimedAt time.Time
	log       zerolog.Logger
}

// RunID is the claimed run's ID.
func (c *Claimed) RunID() string { return c.claim.Lease.RunID }

// Created reports whether the claim created the run.
func (c *Claimed) Created() bool { return c.claim.Created }

// Run is the run as claimed: running, under this attempt's lease.
func (c *Claimed) Run() checkpoint.Run { return c.claim.Run }

// Attempt is the claimed attempt's number.
func (c *Claimed) Attempt() int { return c.claim.Lease.Attempt }

// Claim claims the run req's job and identifying parameters name, as Run
// does, without executing it (see Claimed). req.DryRun is refused.
func (r *Runner) Claim(ctx context.Context, req Request) (*Claimed, error) {
	if req.DryRun {
		return nil, errors.New("runner: a dry run claims nothing; call Run")
	}
	job, err := r.cfg.Jobs.Lookup(req.Job)
	if err != nil {
		return nil, err
	}
	dec, err := job.Decode(req.Values, req.ParamsFile)
	if err != nil {
		return nil, err
	}
	return r.claimRun(ctx, job, dec, req)
}

// ClaimRun claims a recorded run, as Resume does, without executing it
// (see Claimed). req.DryRun is refused.
func (r *Runner) ClaimRun(ctx context.Context, runID string, req Request) (*Claimed, error) {
	if req.DryRun {
		return nil, errors.New("runner: a dry run claims nothing; call Resume")
	}
	job, dec, err := r.stored(ctx, runID)
	if err != nil {
		return nil, err
	}
	return r.claimRun(ctx, job, dec, req)
}

// attempt claims the run and drives the job on its steps.Run; execute
// wraps it in the attempt's span.
func (r *Runner) attempt(ctx context.Context, job jobs.Job, dec jobs.Decoded, req Request) (Result, error) {
	c, err := r.claimRun(ctx, job, dec, req)
	if err != nil {
		return Result{RunID: jobs.RunID(job.Name(), dec.RunKey)}, err
	}
	return c.execute(ctx)
}

func (r *Runner) claimRun(ctx context.Context, job jobs.Job, dec jobs.Decoded, req Request) (*Claimed, error) {
	runID := jobs.RunID(job.Name(), dec.RunKey)
	log := r.cfg.Logger.With().Str(steps.FieldJob, job.Name()).Str(steps.FieldRunID, runID).Logger()
	claim, claimedAt, err := r.claim(ctx, checkpoint.ClaimRequest{
		RunID: runID, Job: job.Name(), RunKey: dec.RunKey, Params: dec.JSON, ParamsHash: dec.Hash,
		Owner: r.cfg.Owner, LeaseFor: r.cfg.Lease, Force: req.Force, CreateOnly: req.CreateOnly, OwnerGone: OwnerGone,
		Limit: dec.Limit, Audits: req.Audits,
	}, log)
	if err != nil {
		return nil, err
	}
	log = log.With().Int(steps.FieldAttempt, claim.Lease.Attempt).Logger()
	switch {
	case claim.Created:
		log.Info().Msg("run started")
	case claim.TookOverFrom != "":
		log.Warn().Str("previous_owner", claim.TookOverFrom).Msg("took over a run whose runner is gone or whose lease expired")
	default:
		log.Info().Str("previous_status", claim.PreviousStatus).Msg("run resumed")
	}
	return &Claimed{r: r, job: job, dec: dec, req: req, claim: claim, claimedAt: claimedAt, log: log}, nil
}

// Drive runs an attempt already claimed (by checkpoint.QueueStore's
// ClaimNext, say): it looks the run's job up, decodes its stored
// parameters, heartbeats the lease and records the attempt's end, as Run
// does after its own claim. claimedAt is a time read just before the
// claim was sent, on the runner's Clock: the lease lasts at least until
// then plus Config.Lease, the lease the claim must have asked for. A panic
// in job code fails this attempt only (*PanicError). A run whose job or
// parameters no longer decode is recorded failed.
func (r *Runner) Drive(ctx context.Context, claim checkpoint.Claim, claimedAt time.Time) (Result, error) {
	run := claim.Run
	job, err := r.cfg.Jobs.Lookup(run.Job)
	if err == nil {
		var dec jobs.Decoded
		if dec, err = job.Decode(nil, run.Params); err == nil {
			log := r.cfg.Logger.With().Str(steps.FieldJob, job.Name()).Str(steps.FieldRunID, claim.Lease.RunID).
				Int(steps.FieldAttempt, claim.Lease.Attempt).Logger()
			if claim.TookOverFrom != "" {
				log.Warn().Str("previous_owner", claim.TookOverFrom).Msg("took over a run whose runner is gone or whose lease expired")
			} else {
				log.Info().Str("previous_status", claim.PreviousStatus).Msg("run claimed from the queue")
			}
			c := &Claimed{r: r, job: job, dec: dec, req: Request{Job: run.Job}, claim: claim, claimedAt: claimedAt, log: log}
			return c.Execute(ctx)
		}
		err = fmt.Errorf("stored parameters no longer decode: %w", err)
	}
	err = fmt.Errorf("run %s: %w", claim.Lease.RunID, err)
	end := checkpoint.Ending{Status: checkpoint.RunFailed, Error: err.Error(), At: r.cfg.Clock.Now()}
	res := Result{RunID: claim.Lease.RunID, Attempt: claim.Lease.Attempt, Status: checkpoint.RunFailed}
	if ferr := r.cfg.Store.Finish(context.WithoutCancel(ctx), claim.Lease, end); ferr != nil {
		res.Status = checkpoint.RunRunning
		return res, fmt.Errorf("%w; and its end could not be recorded: %w", err, ferr)
	}
	return res, err
}

// Execute runs the claimed attempt to its end and says how it ended, as
// Run does, in the attempt's span.
func (c *Claimed) Execute(ctx context.Context) (Result, error) {
	return c.r.traced(ctx, c.job, c.RunID(), c.execute)
}

func (c *Claimed) execute(ctx context.Context) (Result, error) {
	r, job, dec, req, claim, claimedAt, log := c.r, c.job, c.dec, c.req, c.claim, c.claimedAt, c.log
	runID := claim.Lease.RunID
	jobLog := r.cfg.Logger.With().Str(steps.FieldJob, job.Name()).Logger()
	lease := claim.Lease
	res := Result{RunID: runID, Attempt: lease.Attempt, TookOverFrom: claim.TookOverFrom}

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopBeat := r.heartbeat(runCtx, lease, claimedAt, cancel, log)

	pastDeadline, jobErr := r.drive(runCtx, job, claim, dec, req, &res, jobLog)
	stopBeat()

	end := checkpoint.Ending{Status: checkpoint.RunSucceeded, At: r.cfg.Clock.Now()}
	var (
		outErr error
		lost   *LeaseLostError
	)
	switch {
	case jobErr == nil:
	case errors.Is(context.Cause(runCtx), checkpoint.ErrFenced) || errors.Is(jobErr, checkpoint.ErrFenced):
		log.Error().Err(jobErr).Msg("lease lost to another runner; this attempt stops and records nothing more")
		res.Status = checkpoint.RunRunning
		return res, fmt.Errorf("run %s: %w", runID, checkpoint.ErrFenced)
	case errors.As(context.Cause(runCtx), &lost):
		return r.endSelfFenced(ctx, lease, lost, jobErr, res, log)
	case ctx.Err() != nil:
		end.Status, end.Error = checkpoint.RunInterrupted, "interrupted: "+context.Cause(ctx).Error()
		outErr = fmt.Errorf("run %s: %w (resumable: run or resume it again)", runID, ErrInterrupted)
	case pastDeadline:
		// The job's own deadline passed (the caller's context is fine). A
		// step's own timeout is not it: that is the step's error.
		end.Status = checkpoint.RunFailed
		end.Error = fmt.Sprintf("deadline of %s passed: %v", job.Settings().Deadline, jobErr)
		outErr = fmt.Errorf("run %s failed: %s (rerun to resume)", runID, end.Error)
	default:
		end.Status, end.Error = checkpoint.RunFailed, jobErr.Error()
		var p *PanicError
		if errors.As(jobErr, &p) {
			// The stack goes with the attempt, so `show` can print it.
			end.Error = p.Record()
		}
		outErr = fmt.Errorf("run %s failed: %w", runID, jobErr)
		if NeedsOperator(jobErr) {
			// Recorded failed (resumable), but nothing broke: the run
			// stopped where only an operator can decide.
			outErr = fmt.Errorf("run %s stopped for an operator decision: %w", runID, jobErr)
		}
	}
	if end.Status == checkpoint.RunSucceeded {
		steps.Crash("run:before-finish")
	}
	fctx := context.WithoutCancel(ctx)
	if err := r.write(fctx, log, "record the run's end", func() error { return r.cfg.Store.Finish(fctx, lease, end) }); err != nil {
		// The run stays marked running under this attempt's lease; the
		// next run or resume takes it over (at once: this process is
		// gone by then). The step's own error is the news: keep it.
		res.Status = checkpoint.RunRunning
		log.Error().Err(err).AnErr("job_error", jobErr).Str("status", end.Status).Msg("could not record the run's end")
		if outErr == nil {
			return res, fmt.Errorf("run %s: every step completed, but recording it succeeded failed: %w; "+
				"the run stays marked running: run or resume it again to record it (no step runs again)", runID, err)
		}
		return res, fmt.Errorf("%w; and its end (%s) could not be recorded: %w; the run stays marked running until it is run or resumed again",
			outErr, end.Status, err)
	}
	res.Status = end.Status
	r.dispatch(ctx, log)
	ev, msg := log.Info(), "run "+end.Status
	var p *PanicError
	switch {
	case end.Status == checkpoint.RunInterrupted:
		// Expected and resumable: one warning saying why, not the
		// internal error of wherever the cancel reached the job.
		log.Debug().Err(jobErr).Msg("where the interruption stopped the job")
		ev, msg = log.Warn().Str("cause", context.Cause(ctx).Error()), "run interrupted; it resumes from its checkpoints when run again"
	case errors.As(jobErr, &p):
		ev = log.Error().Err(jobErr).Str("stack", string(p.Stack))
	case NeedsOperator(jobErr):
		ev, msg = log.Warn().Err(jobErr), "run stopped for an operator decision"
	case outErr != nil:
		ev = log.Error().Err(jobErr)
	}
	ev.Str("status", end.Status).Int("executed", res.Stats.Executed).Int("skipped", res.Stats.Skipped).Msg(msg)
	return res, outErr
}

// endSelfFenced ends an attempt that fenced itself (see heartbeat). Until
// its lease expires the run is still this attempt's, and Finish is fenced,
// so it records the attempt interrupted if the store answers within
// SelfFenceMargin: the next run or resume then goes on at once. Otherwise
// (the database still unreachable) the run stays marked running until the
// lease expires and another runner takes it over. Either way the error
// wraps lost.
func (r *Runner) endSelfFenced(ctx context.Context, lease checkpoint.Lease, lost *LeaseLostError,
	jobErr error, res Result, log zerolog.Logger) (Result, error) {
	log.Debug().Err(jobErr).Msg("where the self-fencing stopped the job")
	end := checkpoint.Ending{Status: checkpoint.RunInterrupted, Error: "interrupted: " + lost.Error(), At: r.cfg.Clock.Now()}
	fctx, done := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.SelfFenceMargin)
	defer done()
	if err := r.write(fctx, log, "record the run's end", func() error { return r.cfg.Store.Finish(fctx, lease, end) }); err != nil {
		res.Status = checkpoint.RunRunning
		log.Warn().Err(err).Msg("could not record the self-fenced attempt's end; the run stays marked running until its lease expires")
		return res, fmt.Errorf("%w; its end could not be recorded either (%w): the run stays marked running "+
			"until its lease expires, then running or resuming it takes it over", lost, err)
	}
	res.Status = checkpoint.RunInterrupted
	log.Warn().Str("status", end.Status).Int("executed", res.Stats.Executed).
		Msg("self-fenced attempt recorded as interrupted; it resumes from its checkpoints when run again")
	return res, fmt.Errorf("%w; the attempt was recorded as interrupted: running or resuming it again goes on from its checkpoints", lost)
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

// drive runs the job function on an attempt's steps.Run. pastDeadline
// reports that the job failed because its own deadline passed.
func (r *Runner) drive(ctx context.Context, job jobs.Job, claim checkpoint.Claim, dec jobs.Decoded, req Request, res *Result, log zerolog.Logger) (pastDeadline bool, err error) {
	cfg := r.stepsConfig(job, claim.Lease, log)
	cfg.RetrySkipped, cfg.AcceptChanged, cfg.PreviousLeaseUntil = req.RetrySkipped, req.AcceptChanged, claim.PreviousLeaseUntil
	parent := ctx
	if d := job.Settings().Deadline; d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
		defer func() {
			pastDeadline = err != nil && parent.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded)
		}()
	}
	run, err := steps.Begin(ctx, cfg)
	if err != nil {
		return false, err
	}
	err = callJob(ctx, job, run, dec.JSON)
	res.Stats = run.Stats()
	if cerr := run.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return false, err
}

// claim claims the run, waiting for a held lease when configured to. The
// time it returns was read just before the claim was sent: the lease lasts
// at least until then plus its length.
func (r *Runner) claim(ctx context.Context, req checkpoint.ClaimRequest, log zerolog.Logger) (checkpoint.Claim, time.Time, error) {
	for {
		req.Now = r.cfg.Clock.Now()
		c, err := r.cfg.Store.Claim(ctx, req)
		if err == nil && r.onClaim != nil {
			r.onClaim(req.Job, c)
		}
		if err != nil && ctx.Err() != nil {
			return c, req.Now, fmt.Errorf("%w while claiming %s: %w", ErrInterrupted, req.RunID, context.Cause(ctx))
		}
		var (
			held    *checkpoint.LeaseHeldError
			reached *checkpoint.LimitReachedError
		)
		wait := r.cfg.WaitPoll
		switch {
		case errors.As(err, &reached) && (r.cfg.Wait || r.cfg.WaitForLimit):
			log.Info().Str("limit", reached.Limit.Key).Int("max", reached.Limit.Max).Strs("holders", reached.Holders).
				Msg("concurrency limit reached; waiting for a run holding it to end")
		case !r.cfg.Wait:
			return c, req.Now, err
		case errors.As(err, &held):
			wait = min(wait, max(held.Until.Sub(req.Now), time.Millisecond))
			log.Info().Str("owner", held.Owner).Time("until", held.Until).Msg("run held by another runner; waiting")
		case errors.Is(err, checkpoint.ErrLocked):
			// Another process holds the database's write lock beyond the
			// busy timeout (a paused runner, a long transaction): the
			// claim tried nothing, so waiting longer is safe.
			log.Info().Err(err).Msg("database locked by another process; waiting")
		default:
			return c, req.Now, err
		}
		if sleepOn(r.cfg.Clock, ctx, wait) != nil {
			return c, req.Now, fmt.Errorf("%w while waiting for %s: %w", ErrInterrupted, req.RunID, err)
		}
	}
}

// WorkPartition claims one claimable partition of a partitioned batch step
// (steps.Partitions) of any running run of a job in the runner's registry,
// as owner, and works it: it replays the run's job function from the top
// like any rerun (earlier steps return their recorded outputs; a step not
// recorded, or changed, stops it with the error exit 5 reports), processes
// the partition at the matching ForEach and stops the job function there,
// recording nothing for the run's later steps and leaving the run to its
// owner. Meanwhile it heartbeats the partition every third of Config.Lease
// and stops by itself (a *steps.PartitionLeaseLostError) if no renewal
// succeeded by the lease's expiry less Config.SelfFenceMargin. worked is
// false when no partition was claimable. It takes partitions of runs of
// any queue, and of runs started directly; a Worker claims partitions
// for its free slots the same way, narrowed to its Queues when it has
// any.
func (r *Runner) WorkPartition(ctx context.Context, owner string) (worked bool, err error) {
	task, ok, err := r.claimPartition(ctx, owner)
	if err != nil || !ok {
		return ok, err
	}
	return true, task(ctx)
}

// claimPartition claims a partition as WorkPartition does and returns the
// work on it, not yet started.
func (r *Runner) claimPartition(ctx context.Context, owner string) (task func(context.Context) error, ok bool, err error) {
	if owner == "" {
		owner = r.cfg.Owner
	}
	var names []string
	for _, j := range r.cfg.Jobs.Jobs() {
		names = append(names, j.Name())
	}
	claimedAt := r.cfg.Clock.Now()
	_, pl, ok, err := r.cfg.Store.ClaimPartition(ctx, checkpoint.PartitionClaim{Owner: owner, Jobs: names, Now: claimedAt, LeaseFor: r.cfg.Lease})
	if err != nil || !ok {
		return nil, false, err
	}
	return func(ctx context.Context) error { return r.workPartition(ctx, pl, claimedAt) }, true, nil
}

// workPartition works the claimed partition pl (see WorkPartition).
func (r *Runner) workPartition(ctx context.Context, pl checkpoint.PartitionLease, claimedAt time.Time) error {
	owner, ps := pl.Owner, r.cfg.Store
	log := r.cfg.Logger.With().Str(steps.FieldRunID, pl.RunID).Str(steps.FieldStepID, pl.Step).Int("partition", pl.Index).Logger()
	release := func(cause error) {
		end := checkpoint.PartitionProgress{State: checkpoint.PartitionPending}
		if p, err := ps.Partitions(context.WithoutCancel(ctx), pl.RunID, pl.Step); err == nil {
			for _, q := range p {
				if q.Index == pl.Index {
					end.HighWater, end.Done, end.Rejected, end.Skipped, end.Executed = q.HighWater, q.Done, q.Rejected, q.Skipped, q.Executed
				}
			}
		}
		w := checkpoint.PartitionWrite{Lease: pl, Now: r.cfg.Clock.Now(), LeaseFor: r.cfg.Lease}
		rctx, done := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.SelfFenceMargin)
		defer done()
		switch err := ps.EndPartition(rctx, w, end); {
		case errors.Is(err, checkpoint.ErrFenced):
			// Released, done or failed already, or claimed by another.
		case err != nil:
			log.Warn().Err(err).Msg("could not release the partition; it is claimable once its lease passes")
		default:
			log.Warn().Err(cause).Msg("partition released without being worked")
		}
	}
	info, err := r.cfg.Store.Run(ctx, pl.RunID)
	if err != nil {
		release(err)
		return err
	}
	job, err := r.cfg.Jobs.Lookup(info.Run.Job)
	if err != nil {
		release(err)
		return fmt.Errorf("run %s: %w", pl.RunID, err)
	}
	dec, err := job.Decode(nil, info.Run.Params)
	if err != nil {
		release(err)
		return fmt.Errorf("run %s: stored parameters no longer decode: %w", pl.RunID, err)
	}
	log.Info().Int64("fence", pl.Fence).Msg("partition claimed")
	jobLog := r.cfg.Logger.With().Str(steps.FieldJob, job.Name()).Int("partition", pl.Index).Logger()
	cfg := r.stepsConfig(job, checkpoint.Lease{RunID: pl.RunID, Fence: info.Run.Fence, Attempt: pl.Attempt, Owner: owner}, jobLog)
	cfg.Partition, cfg.PartitionClaimedAt = &pl, claimedAt
	run, err := steps.Begin(ctx, cfg)
	if err != nil {
		release(err)
		return err
	}
	jobErr := callJob(ctx, job, run, dec.JSON)
	if cerr := run.Close(); jobErr == nil {
		jobErr = cerr
	}
	switch {
	case errors.Is(jobErr, steps.ErrPartitionWorked):
		log.Info().Msg("partition worked")
		return nil
	case jobErr == nil:
		jobErr = fmt.Errorf("run %s: the job returned without reaching batch step %s: it may have changed since the run's owner ran it", pl.RunID, pl.Step)
		release(jobErr)
	default:
		// Whatever stopped the replay (a step not recorded or changed, an
		// interruption before the partition was reached), hand the
		// partition back unless it was ended already: the release is
		// fenced by the partition, so it changes nothing then.
		release(jobErr)
	}
	return fmt.Errorf("partition %d of %s of run %s: %w", pl.Index, pl.Step, pl.RunID, jobErr)
}
