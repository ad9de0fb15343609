package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

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
	// finish records the attempt's end; nil is the store's Finish. A
	// worker's slot sets it to finish and claim its next run at once.
	finish finishFunc
}

// finishFunc records an attempt's end, as checkpoint.Store's Finish does.
type finishFunc func(ctx context.Context, l checkpoint.Lease, e checkpoint.Ending) error

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
	return r.driveClaim(ctx, claim, claimedAt, nil)
}

// driveClaim is Drive, recording the attempt's end with finish (nil: the
// store's Finish) when the job ran.
func (r *Runner) driveClaim(ctx context.Context, claim checkpoint.Claim, claimedAt time.Time, finish finishFunc) (Result, error) {
	run := claim.Run
	r.cfg.Metrics.runStarted(run.Job, claim)
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
			c := &Claimed{r: r, job: job, dec: dec, req: Request{Job: run.Job}, claim: claim, claimedAt: claimedAt, log: log, finish: finish}
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
	r.cfg.Metrics.runEnded(run.Job, res)
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

	pastDeadline, jobErr := r.driveRetrying(runCtx, job, claim, dec, req, &res, jobLog, log)
	stopBeat()

	var lost *LeaseLostError
	switch {
	case jobErr == nil:
	case errors.Is(context.Cause(runCtx), checkpoint.ErrFenced) || errors.Is(jobErr, checkpoint.ErrFenced):
		log.Error().Err(jobErr).Msg("lease lost to another runner; this attempt stops and records nothing more")
		res.Status = checkpoint.RunRunning
		return res, fmt.Errorf("run %s: %w", runID, checkpoint.ErrFenced)
	case errors.As(context.Cause(runCtx), &lost):
		return r.endSelfFenced(ctx, lease, lost, jobErr, res, log)
	}
	end, outErr := r.ending(ctx, job, claim, pastDeadline, jobErr)
	if end.Status == checkpoint.RunSucceeded {
		steps.Crash("run:before-finish")
	}
	fctx := context.WithoutCancel(ctx)
	finish := c.finish
	if finish == nil {
		finish = r.cfg.Store.Finish
	}
	if err := r.write(fctx, log, "record the run's end", func() error { return finish(fctx, lease, end) }); err != nil {
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
	logEnd(ctx, log, end, jobErr, outErr, res.Stats)
	return res, outErr
}

// ending is how an attempt whose lease held ends after its job returned
// jobErr: the Ending to record, and the error Run returns with it. A
// pooled run that gave up on store faults goes back to its queue
// (requeueAfterFault) while its attempts last.
func (r *Runner) ending(ctx context.Context, job jobs.Job, claim checkpoint.Claim, pastDeadline bool, jobErr error) (checkpoint.Ending, error) {
	runID := claim.Lease.RunID
	end := checkpoint.Ending{Status: checkpoint.RunSucceeded, At: r.cfg.Clock.Now()}
	var fault *StoreFaultError
	switch {
	case jobErr == nil:
		return end, nil
	case ctx.Err() != nil:
		end.Status, end.Error = checkpoint.RunInterrupted, "interrupted: "+context.Cause(ctx).Error()
		return end, fmt.Errorf("run %s: %w (resumable: run or resume it again)", runID, ErrInterrupted)
	case pastDeadline:
		// The job's own deadline passed (the caller's context is fine). A
		// step's own timeout is not it: that is the step's error.
		end.Status = checkpoint.RunFailed
		end.Error = fmt.Sprintf("deadline of %s passed: %v", job.Settings().Deadline, jobErr)
		return end, fmt.Errorf("run %s failed: %s (rerun to resume)", runID, end.Error)
	case errors.As(jobErr, &fault):
		if e, ok := r.requeueAfterFault(job, claim, fault); ok {
			return e, jobErr
		}
		end.Status, end.Error = checkpoint.RunFailed, jobErr.Error()
		return end, jobErr
	}
	end.Status, end.Error = checkpoint.RunFailed, jobErr.Error()
	var p *PanicError
	if errors.As(jobErr, &p) {
		// The stack goes with the attempt, so `show` can print it.
		end.Error = p.Record()
	}
	if NeedsOperator(jobErr) {
		// Recorded failed (resumable), but nothing broke: the run
		// stopped where only an operator can decide.
		return end, fmt.Errorf("run %s stopped for an operator decision: %w", runID, jobErr)
	}
	return end, fmt.Errorf("run %s failed: %w", runID, jobErr)
}

// logEnd logs how a recorded attempt ended, at the level its end calls for.
func logEnd(ctx context.Context, log zerolog.Logger, end checkpoint.Ending, jobErr, outErr error, stats steps.Stats) {
	ev, msg := log.Info(), "run "+end.Status
	var (
		p     *PanicError
		fault *StoreFaultError
	)
	switch {
	case errors.As(jobErr, &fault) && fault.RetryIn > 0 && end.Status == checkpoint.RunInterrupted:
		ev, msg = log.Warn().Err(fault.Err).Float64(steps.FieldRetryInSeconds, fault.RetryIn.Seconds()), "run back in its queue after store faults; a worker tries it again"
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
	ev.Str("status", end.Status).Int("executed", stats.Executed).Int("skipped", stats.Skipped).Msg(msg)
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

// drive runs the job function on an attempt's steps.Run. pastDeadline
// reports that the job failed because its own deadline passed.
func (r *Runner) drive(ctx context.Context, job jobs.Job, claim checkpoint.Claim, dec jobs.Decoded, req Request, res *Result, log zerolog.Logger) (pastDeadline bool, err error) {
	cfg := r.stepsConfig(job, claim.Lease, log)
	cfg.RetrySkipped, cfg.AcceptChanged, cfg.PreviousLeaseUntil = req.RetrySkipped, req.AcceptChanged, claim.PreviousLeaseUntil
	// A run claimed from the queue for the first time has no checkpoints
	// to read (a queued run has never been claimed).
	cfg.Unclaimed = claim.PreviousStatus == checkpoint.RunQueued
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
	err = callJob(jobs.WithTargets(ctx, r.cfg.Targets), job, run, dec.JSON)
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
		if err == nil {
			r.cfg.Metrics.runStarted(req.Job, c)
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
		if sleep(ctx, r.cfg.Clock, wait) != nil {
			return c, req.Now, fmt.Errorf("%w while waiting for %s: %w", ErrInterrupted, req.RunID, err)
		}
	}
}
