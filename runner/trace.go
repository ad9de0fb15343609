package runner

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// Attributes of the attempt span besides steps' (steps.AttrRunID and the
// others).
const (
	// attrTookOverFrom names the dead or stale runner an attempt replaced.
	attrTookOverFrom = "stepwise.took_over_from"
	// attrStepsExecuted and attrStepsReplayed count the attempt's steps
	// that ran and those returned from their checkpoints.
	attrStepsExecuted = "stepwise.steps.executed"
	attrStepsReplayed = "stepwise.steps.replayed"
	attrDryRun        = "stepwise.dry_run"
)

// outcomeRefused is the attempt span's outcome when the run could not be
// claimed (held by another runner, already succeeded, parameters
// changed): no attempt was made.
const outcomeRefused = "refused"

// execute runs one attempt of the run (attempt) under its span, the
// parent of its steps' spans, and counts it in Metrics.
func (r *Runner) execute(ctx context.Context, job jobs.Job, dec jobs.Decoded, req Request) (Result, error) {
	return r.traced(ctx, job, jobs.RunID(job.Name(), dec.RunKey), func(ctx context.Context) (Result, error) {
		return r.attempt(ctx, job, dec, req)
	})
}

// traced runs one attempt of runID (claim included, when fn claims) in the
// attempt's span and counts it: its duration, its end and its steps.
func (r *Runner) traced(ctx context.Context, job jobs.Job, runID string, fn func(context.Context) (Result, error)) (Result, error) {
	ctx, span := r.tracer.Start(ctx, "attempt "+job.Name(),
		trace.WithAttributes(attribute.String(steps.AttrRunID, runID), attribute.String(steps.AttrJob, job.Name())))
	began := r.cfg.Clock.Now()
	res, err := fn(ctx)
	if res.Attempt > 0 {
		r.cfg.Metrics.attemptEnded(job.Name(), res.Status, r.cfg.Clock.Now().Sub(began))
		r.cfg.Metrics.runEnded(job.Name(), res)
	}
	endAttempt(span, res, err)
	return res, err
}

// dryRun runs a dry run (dryAttempt) under a span of its own.
func (r *Runner) dryRun(ctx context.Context, job jobs.Job, dec jobs.Decoded) (Result, error) {
	runID := jobs.RunID(job.Name(), dec.RunKey)
	ctx, span := r.tracer.Start(ctx, "dry run "+job.Name(),
		trace.WithAttributes(attribute.String(steps.AttrRunID, runID), attribute.String(steps.AttrJob, job.Name()),
			attribute.Bool(attrDryRun, true)))
	res, err := r.dryAttempt(ctx, job, dec)
	endAttempt(span, res, err)
	return res, err
}

// endAttempt sets the attempt's outcome on its span and ends it: its
// status (a checkpoint.Run* status, or "refused" when nothing was
// claimed), its steps, and its error.
func endAttempt(span trace.Span, res Result, err error) {
	defer span.End()
	if !span.IsRecording() {
		return
	}
	outcome := res.Status
	if res.Attempt == 0 && res.Status != "dry-run" {
		outcome = outcomeRefused
	}
	span.SetAttributes(attribute.Int(steps.AttrAttempt, res.Attempt), attribute.String(steps.AttrOutcome, outcome),
		attribute.Int(attrStepsExecuted, res.Stats.Executed), attribute.Int(attrStepsReplayed, res.Stats.Skipped))
	if res.TookOverFrom != "" {
		span.SetAttributes(attribute.String(attrTookOverFrom, res.TookOverFrom))
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else if res.Status == checkpoint.RunSucceeded {
		span.SetStatus(codes.Ok, "")
	}
}

// traceDispatch records an outbox delivery pass on its span.
func traceDispatch(span trace.Span, res PassResult, err error) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.Int("stepwise.outbox.sent", res.Sent), attribute.Int("stepwise.outbox.failed", res.Failed),
		attribute.Int("stepwise.outbox.dead", res.Dead))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
}
