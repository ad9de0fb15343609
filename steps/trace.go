package steps

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation name of Stepwise's spans: the tracer
// the runner and the steps ask their TracerProvider for.
const TracerName = "github.com/stepwise-run/stepwise"

// Span attributes of Stepwise's traces, shared by steps and runner so that
// one name always means one thing (as the log fields are).
//
// Every span of an attempt carries AttrRunID and AttrAttempt; a step span
// adds AttrStepID, AttrStepKind, AttrOutcome, AttrReplayed and AttrTries;
// a batch chunk's span adds AttrStepID, AttrChunk and the AttrItems*
// counts. AttrOutcome is one of:
//
//	completed        the step (or chunk) finished: its output is recorded
//	rejected         a business rejection, pinned (not a span error)
//	failed           the step failed; a rerun runs it again
//	interrupted      the attempt was cancelled (a signal, a deadline) in it
//	outcome_unknown  an outside call that may or may not have happened
//	changed          its input or a batch item changed since it ran
//
// A step an earlier attempt finished is returned from its checkpoint
// without running; its span is kept, marked AttrReplayed, with the
// outcome the checkpoint records, so a rerun's trace shows the whole job
// and which parts of it did work.
const (
	AttrRunID    = "stepwise.run_id"
	AttrJob      = "stepwise.job"
	AttrAttempt  = "stepwise.attempt"
	AttrStepID   = "stepwise.step_id"
	AttrStepKind = "stepwise.step.kind" // do, apply, call, batch or notify
	AttrOutcome  = "stepwise.outcome"
	AttrReplayed = "stepwise.replayed"
	// AttrTries is the step's try number when this attempt reached it: 1
	// on its first try, more when earlier tries failed (each retry in the
	// attempt adds a "retry" event); a replayed step's recorded count.
	AttrTries = "stepwise.step.tries"
	// AttrReason is a rejected step's or item's pinned reason.
	AttrReason = "stepwise.reason"
	// AttrIdempotencyKey is an outside call's key (see IdempotencyKey).
	AttrIdempotencyKey = "stepwise.idempotency_key"
	// AttrChunk is a chunk's number within its attempt (0-based), as in
	// the crash points.
	AttrChunk = "stepwise.chunk"
	// AttrItems is how many items a chunk held; on a batch step's span,
	// how many its source yielded (BatchSummary.Total).
	AttrItems = "stepwise.items"
	// AttrItemsCompleted, AttrItemsRejected and AttrItemsSkipped count the
	// chunk's (or batch step's) finished items by status, replayed ones
	// included; AttrItemsReplayed says how many of them an earlier attempt
	// had finished, AttrItemsExecuted how many this attempt processed.
	AttrItemsCompleted = "stepwise.items.completed"
	AttrItemsRejected  = "stepwise.items.rejected"
	AttrItemsSkipped   = "stepwise.items.skipped"
	AttrItemsReplayed  = "stepwise.items.replayed"
	AttrItemsExecuted  = "stepwise.items.executed"
)

// Step kinds, the values of AttrStepKind.
const (
	kindDo     = "do"
	kindApply  = "apply"
	kindCall   = "call"
	kindBatch  = "batch"
	kindNotify = "notify"
)

// Outcomes, the values of AttrOutcome (and of StepEnd.Outcome).
const (
	outcomeCompleted   = "completed"
	outcomeRejected    = "rejected"
	outcomeFailed      = "failed"
	outcomeInterrupted = "interrupted"
	outcomeUnknown     = "outcome_unknown"
	outcomeChanged     = "changed"
)

// StepEnd is one step's end, as Config.OnStepEnd receives it (the
// runner's duration histograms).
type StepEnd struct {
	// ID is the step's ID, e.g. "post/T-1001".
	ID string
	// Name is the ID's name, its part before the first "/" ("post"): a
	// label of bounded cardinality.
	Name string
	// Kind is do, apply, call, batch or notify.
	Kind string
	// Outcome is one of AttrOutcome's values.
	Outcome string
	// Replayed is set when the step was returned from its checkpoint
	// without running.
	Replayed bool
	// Took is how long the call took, on Config.Now's clock.
	Took time.Duration
}

// stepSpan is one step's span while it runs.
type stepSpan struct {
	r        *Run
	span     trace.Span
	id, kind string
	began    time.Time // only when r.onStepEnd is set
	replayed bool
	tries    int
}

// startStep starts the span of step id; the step's function runs under
// the context it returns, so the span is the parent of whatever the
// function traces (an outgoing HTTP request, say).
func (r *Run) startStep(ctx context.Context, id, kind string) (context.Context, *stepSpan) {
	ctx, span := r.tracer.Start(ctx, "step "+stepName(id))
	s := &stepSpan{r: r, span: span, id: id, kind: kind}
	if r.onStepEnd != nil {
		s.began = r.now()
	}
	return ctx, s
}

// end ends the span (and reports the step) with the step's error.
func (s *stepSpan) end(err error, attrs ...attribute.KeyValue) {
	outcome := outcomeOf(err)
	if s.r.onStepEnd != nil {
		s.r.onStepEnd(StepEnd{ID: s.id, Name: stepName(s.id), Kind: s.kind, Outcome: outcome, Replayed: s.replayed,
			Took: s.r.now().Sub(s.began)})
	}
	if !s.span.IsRecording() {
		s.span.End()
		return
	}
	s.span.SetAttributes(append(attrs,
		attribute.String(AttrRunID, s.r.lease.RunID), attribute.Int(AttrAttempt, s.r.lease.Attempt),
		attribute.String(AttrStepID, s.id), attribute.String(AttrStepKind, s.kind),
		attribute.String(AttrOutcome, outcome), attribute.Bool(AttrReplayed, s.replayed), attribute.Int(AttrTries, s.tries))...)
	spanError(s.span, outcome, err)
	s.span.End()
}

// spanError records err on span: a rejection as its reason (a result,
// not an error), anything else as the span's error.
func spanError(span trace.Span, outcome string, err error) {
	switch {
	case err == nil:
	case outcome == outcomeRejected:
		var rej *RejectedError
		if errors.As(err, &rej) {
			span.SetAttributes(attribute.String(AttrReason, rej.Reason))
		}
	default:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
}

// outcomeOf classifies a step's error into one of AttrOutcome's values.
func outcomeOf(err error) string {
	if err == nil {
		return outcomeCompleted // before the targets below, which errors.As makes escape
	}
	var (
		rej     *RejectedError
		unknown *OutcomeUnknownError
		changed *StepChangedError
		item    *ItemChangedError
	)
	switch {
	case errors.As(err, &rej):
		return outcomeRejected
	case errors.As(err, &unknown):
		return outcomeUnknown
	case errors.As(err, &changed), errors.As(err, &item):
		return outcomeChanged
	case errors.Is(err, ErrInterrupted), errors.Is(err, context.Canceled):
		return outcomeInterrupted
	}
	return outcomeFailed
}

// stepName is a step ID's name: its part before the first "/".
func stepName(id string) string {
	name, _, _ := strings.Cut(id, "/")
	return name
}

// traceRetry notes on the step's span a failed try that will be retried.
func traceRetry(ctx context.Context, try int, err error) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("retry", trace.WithAttributes(attribute.Int(AttrTries, try), attribute.String("error", err.Error())))
	}
}

// flush processes and commits the buffered chunk (flushChunk) under a
// span of its own, the parent of its items' functions' spans.
func (b *batch[I, O]) flush(ctx context.Context) error {
	ctx, span := b.r.tracer.Start(ctx, "chunk "+b.name)
	if !span.IsRecording() {
		err := b.flushChunk(ctx)
		span.End()
		return err
	}
	chunk, items := b.chunk, len(b.keys)
	sum, replayed := b.sum, b.prog.Replayed
	err := b.flushChunk(ctx)
	completed, rejected, skipped := b.sum.Completed-sum.Completed, b.sum.Rejected-sum.Rejected, b.sum.Skipped-sum.Skipped
	replayed = b.prog.Replayed - replayed
	outcome := outcomeOf(err)
	span.SetAttributes(attribute.String(AttrRunID, b.r.lease.RunID), attribute.Int(AttrAttempt, b.r.lease.Attempt),
		attribute.String(AttrStepID, b.name), attribute.Int(AttrChunk, chunk), attribute.Int(AttrItems, items),
		attribute.Int64(AttrItemsCompleted, completed), attribute.Int64(AttrItemsRejected, rejected),
		attribute.Int64(AttrItemsSkipped, skipped), attribute.Int64(AttrItemsReplayed, replayed),
		attribute.Int64(AttrItemsExecuted, b.sum.Executed-sum.Executed),
		attribute.String(AttrOutcome, outcome), attribute.Bool(AttrReplayed, items > 0 && replayed == int64(items)))
	spanError(span, outcome, err)
	span.End()
	return err
}

// batchAttrs are a finished batch step's counts, for its span.
func batchAttrs(sum BatchSummary) []attribute.KeyValue {
	return []attribute.KeyValue{attribute.Int64(AttrItems, sum.Total), attribute.Int64(AttrItemsCompleted, sum.Completed),
		attribute.Int64(AttrItemsRejected, sum.Rejected), attribute.Int64(AttrItemsSkipped, sum.Skipped),
		attribute.Int64(AttrItemsExecuted, sum.Executed)}
}

// defaultTracer is the tracer of a Run whose Config names none: the
// global OpenTelemetry provider's, a no-op unless the program set one.
func defaultTracer() trace.Tracer { return otel.Tracer(TracerName) }

// InjectTrace puts the trace context of ctx (inside a step, the step's
// span) on h as the W3C Trace Context headers traceparent and tracestate,
// so the outside system's trace joins the run's. Call it on an outgoing
// request's headers:
//
//	req, _ := http.NewRequestWithContext(ctx, "POST", url, body)
//	steps.InjectTrace(ctx, req.Header)
//
// Without a recording trace (tracing off) it adds nothing.
func InjectTrace(ctx context.Context, h http.Header) {
	if trace.SpanContextFromContext(ctx).IsValid() {
		propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(h))
	}
}

// TraceTransport returns an http.RoundTripper that sends every request
// through base (http.DefaultTransport if nil) with the trace context of
// the request's context on it (see InjectTrace): give a step's HTTP client
// one and each call carries traceparent.
//
//	client := &http.Client{Transport: steps.TraceTransport(nil), Timeout: 10 * time.Second}
func TraceTransport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return traceTransport{base: base}
}

type traceTransport struct{ base http.RoundTripper }

// RoundTrip implements http.RoundTripper. The request is cloned before
// its headers are set, as RoundTripper's contract asks.
func (t traceTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if trace.SpanContextFromContext(req.Context()).IsValid() {
		req = req.Clone(req.Context())
		InjectTrace(req.Context(), req.Header)
	}
	return t.base.RoundTrip(req)
}
