package runner_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// The traced job: a step "load", a batch step "post" over 40 items in
// chunks of 10 (every item ending in 7 rejected, every item ending in 3
// failing and skipped by policy), an outside call "notify" to the URL
// STEPWISE_TRACE_URL names, carrying the trace context, and a step
// "report".
const (
	traceChildEnv = "STEPWISE_TRACE_CHILD" // "1" makes TestTraceChild run
	traceDBEnv    = "STEPWISE_TRACE_DB"    // the checkpoint database's location
	traceURLEnv   = "STEPWISE_TRACE_URL"   // where notify calls

	traceItems = 40
	traceChunk = 10
	traceRunID = "traced/2026-11-28"
)

func tracedRegistry(url string) *jobs.Registry {
	reg := &jobs.Registry{}
	reg.MustRegister(jobs.Define("traced", func(ctx context.Context, run *steps.Run, p jobParams) error {
		if _, err := steps.Do(ctx, run, "load", func(context.Context) (int, error) { return traceItems, nil }); err != nil {
			return err
		}
		var keys []string
		for i := range traceItems {
			keys = append(keys, fmt.Sprintf("I%02d", i))
		}
		_, err := steps.ForEach(ctx, run, "post", steps.Slice(keys, func(k string) string { return k }),
			func(ctx context.Context, k string, _ *steps.Effects) (string, error) {
				switch k[len(k)-1] {
				case '7':
					return "", steps.Reject(errors.New("account closed"))
				case '3':
					return "", errors.New("bank timeout")
				}
				return k, nil
			}, steps.ChunkSize(traceChunk), steps.SkipFailures(traceItems))
		if err != nil {
			return err
		}
		client := &http.Client{Transport: steps.TraceTransport(nil)}
		_, err = steps.Call(ctx, run, "notify", func(ctx context.Context, key string) (int, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
			if err != nil {
				return 0, err
			}
			req.Header.Set("Idempotency-Key", key)
			resp, err := client.Do(req)
			if err != nil {
				return 0, err
			}
			resp.Body.Close()
			return resp.StatusCode, nil
		})
		if err != nil {
			return err
		}
		_, err = steps.Do(ctx, run, "report", func(context.Context) (string, error) { return "ok", nil })
		return err
	}))
	return reg
}

// TestTraceChild is the first attempt's runner process: it runs the
// traced job until the crash point its environment names kills it.
func TestTraceChild(t *testing.T) {
	if os.Getenv(traceChildEnv) != "1" {
		t.Skip("the first attempt of TestTraceOfResumedRun, run in a child process")
	}
	st, err := checkpointtest.OpenLocationErr(os.Getenv(traceDBEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r, err := runner.New(runner.Config{Store: st, Jobs: tracedRegistry(os.Getenv(traceURLEnv))})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Run(context.Background(), runner.Request{Job: "traced", Values: testValues})
	t.Fatalf("the crash point did not kill the runner: %v", err)
}

// spanTree indexes the spans an in-memory exporter holds.
type spanTree struct {
	t     *testing.T
	spans tracetest.SpanStubs
}

func (s spanTree) children(parent tracetest.SpanStub) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, sp := range s.spans {
		if sp.Parent.SpanID() == parent.SpanContext.SpanID() && sp.Parent.IsValid() {
			out = append(out, sp)
		}
	}
	slices.SortFunc(out, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	return out
}

func (s spanTree) roots() []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, sp := range s.spans {
		if !sp.Parent.IsValid() {
			out = append(out, sp)
		}
	}
	return out
}

func attrs(sp tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range sp.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

// want checks that sp has each of the attributes in kv (values compared
// as their string forms).
func want(t *testing.T, sp tracetest.SpanStub, kv ...any) {
	t.Helper()
	got := attrs(sp)
	for i := 0; i < len(kv); i += 2 {
		key := attribute.Key(kv[i].(string))
		v, ok := got[key]
		if !ok {
			t.Errorf("span %q has no attribute %s; it has %v", sp.Name, key, sp.Attributes)
			continue
		}
		if w := fmt.Sprint(kv[i+1]); v.String() != w {
			t.Errorf("span %q: %s = %s, want %s", sp.Name, key, v.String(), w)
		}
	}
}

// TestTraceOfResumedRun kills the first attempt's process with SIGKILL in
// the middle of the batch step (after its third chunk committed), resumes
// the run in this process with an in-memory exporter, and checks the
// second attempt's span tree: the attempt, its steps in order (load
// replayed, post resumed with its first three chunks replayed), each
// chunk's item counts, the outside call's idempotency key, and the
// traceparent the outside call carried.
func TestTraceOfResumedRun(t *testing.T) {
	t.Parallel()
	var (
		mu          sync.Mutex
		traceparent []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		traceparent = append(traceparent, r.Header.Get("traceparent"))
		mu.Unlock()
	}))
	defer srv.Close()
	loc := checkpointtest.NewLocation(t)

	c, got := crashtest.Run(t, crashtest.Spec{Test: "TestTraceChild",
		Env: []string{traceChildEnv + "=1", traceDBEnv + "=" + loc, traceURLEnv + "=" + srv.URL,
			crashtest.CrashAt("step:post#2:after-commit")}})
	c.WantExit(got, crashtest.Killed)

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	st := checkpointtest.OpenLocation(t, loc)
	r, err := runner.New(runner.Config{Store: st, Jobs: tracedRegistry(srv.URL), TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Resume(context.Background(), traceRunID, runner.Request{})
	if err != nil || res.Status != checkpoint.RunSucceeded || res.Attempt != 2 {
		t.Fatalf("resume: %+v, %v; want attempt 2 succeeded", res, err)
	}

	tree := spanTree{t: t, spans: exp.GetSpans()}
	roots := tree.roots()
	if len(roots) != 1 || roots[0].Name != "attempt traced" {
		t.Fatalf("root spans %v, want one \"attempt traced\"", names(roots))
	}
	att := roots[0]
	want(t, att, steps.AttrRunID, traceRunID, steps.AttrJob, "traced", steps.AttrAttempt, 2, steps.AttrOutcome, "succeeded",
		"stepwise.steps.replayed", 1, "stepwise.steps.executed", 3)
	if !strings.Contains(attrs(att)["stepwise.took_over_from"].String(), ":") {
		t.Errorf("attempt span: took_over_from = %q, want the killed runner's HOST:PID", attrs(att)["stepwise.took_over_from"].String())
	}
	if att.Status.Code != codes.Ok {
		t.Errorf("attempt span status %v, want Ok", att.Status)
	}

	stepSpans := tree.children(att)
	if got, want := names(stepSpans), []string{"step load", "step post", "step notify", "step report"}; !slices.Equal(got, want) {
		t.Fatalf("the attempt's children are %q, want %q", got, want)
	}
	load, post, notify, report := stepSpans[0], stepSpans[1], stepSpans[2], stepSpans[3]
	want(t, load, steps.AttrStepID, "load", steps.AttrStepKind, "do", steps.AttrReplayed, true, steps.AttrOutcome, "completed",
		steps.AttrRunID, traceRunID, steps.AttrAttempt, 2)
	want(t, post, steps.AttrStepID, "post", steps.AttrStepKind, "batch", steps.AttrReplayed, false, steps.AttrOutcome, "completed",
		steps.AttrItems, traceItems, steps.AttrItemsCompleted, 32, steps.AttrItemsRejected, 4, steps.AttrItemsSkipped, 4,
		steps.AttrItemsExecuted, traceChunk)
	want(t, notify, steps.AttrStepKind, "call", steps.AttrReplayed, false, steps.AttrOutcome, "completed",
		steps.AttrIdempotencyKey, traceRunID+"/notify", steps.AttrTries, 1)
	want(t, report, steps.AttrReplayed, false, steps.AttrOutcome, "completed")

	chunks := tree.children(post)
	if len(chunks) != traceItems/traceChunk {
		t.Fatalf("the batch step has %d children %q, want %d chunks", len(chunks), names(chunks), traceItems/traceChunk)
	}
	for i, ch := range chunks {
		replayed, executed, replayedItems := i < 3, 0, traceChunk // chunks 0-2 committed before the kill
		if !replayed {
			executed, replayedItems = traceChunk, 0
		}
		if ch.Name != "chunk post" {
			t.Errorf("chunk %d is named %q", i, ch.Name)
		}
		want(t, ch, steps.AttrChunk, i, steps.AttrStepID, "post", steps.AttrRunID, traceRunID, steps.AttrAttempt, 2,
			steps.AttrItems, traceChunk, steps.AttrItemsCompleted, 8, steps.AttrItemsRejected, 1, steps.AttrItemsSkipped, 1,
			steps.AttrItemsReplayed, replayedItems, steps.AttrItemsExecuted, executed,
			steps.AttrReplayed, replayed, steps.AttrOutcome, "completed")
	}
	for _, sp := range append(chunks, load, notify, report) {
		if n := len(tree.children(sp)); n != 0 {
			t.Errorf("span %q has %d children, want none", sp.Name, n)
		}
	}

	// The outside call carried the notify step's span as its parent.
	mu.Lock()
	defer mu.Unlock()
	wantTP := fmt.Sprintf("00-%s-%s-01", notify.SpanContext.TraceID(), notify.SpanContext.SpanID())
	if len(traceparent) != 1 || traceparent[0] != wantTP {
		t.Errorf("the outside call carried traceparent %q, want [%s]", traceparent, wantTP)
	}
}

func names(spans []tracetest.SpanStub) []string {
	var out []string
	for _, sp := range spans {
		out = append(out, sp.Name)
	}
	return out
}

// TestTraceRecordsErrorsAndRejections checks how a failing step, a
// rejected step and a refused claim show in a trace: a failure is the
// step's and the attempt's span error, a rejection is an outcome with its
// reason (not an error), and a second claim of a succeeded run is a
// refused attempt.
func TestTraceRecordsErrorsAndRejections(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	fail := true
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
		_, err := steps.Do(ctx, run, steps.ID("check", "A-1"), func(context.Context) (int, error) {
			return 0, steps.Reject(errors.New("account closed"))
		})
		var rej *steps.RejectedError
		if !errors.As(err, &rej) {
			return fmt.Errorf("want a rejection, got %w", err)
		}
		_, err = steps.Do(ctx, run, "post", func(context.Context) (int, error) {
			if fail {
				return 0, steps.Permanent(errors.New("ledger unreachable"))
			}
			return 1, nil
		})
		return err
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	r := h.runner(func(c *runner.Config) { c.TracerProvider = tp })

	if _, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues}); err == nil {
		t.Fatal("the first attempt succeeded; want its post step to fail")
	}
	tree := spanTree{t: t, spans: exp.GetSpans()}
	att := tree.roots()[0]
	want(t, att, steps.AttrOutcome, "failed", steps.AttrAttempt, 1)
	if att.Status.Code != codes.Error || !strings.Contains(att.Status.Description, "ledger unreachable") {
		t.Errorf("attempt span status %+v, want the step's error", att.Status)
	}
	kids := tree.children(att)
	if len(kids) != 2 {
		t.Fatalf("attempt children %q, want check and post", names(kids))
	}
	check, post := kids[0], kids[1]
	if check.Name != "step check" {
		t.Errorf("a keyed step's span is named %q, want its name only (\"step check\")", check.Name)
	}
	want(t, check, steps.AttrStepID, "check/A-1", steps.AttrOutcome, "rejected", steps.AttrReason, "account closed")
	if check.Status.Code == codes.Error || len(check.Events) != 0 {
		t.Errorf("a rejection is recorded as an error: status %+v, events %v", check.Status, check.Events)
	}
	want(t, post, steps.AttrOutcome, "failed", steps.AttrReplayed, false)
	if post.Status.Code != codes.Error || len(post.Events) != 1 || post.Events[0].Name != "exception" {
		t.Errorf("failed step: status %+v, events %v; want the error recorded", post.Status, post.Events)
	}

	exp.Reset()
	fail = false
	if _, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues}); err != nil {
		t.Fatal(err)
	}
	tree = spanTree{t: t, spans: exp.GetSpans()}
	kids = tree.children(tree.roots()[0])
	want(t, kids[0], steps.AttrReplayed, true, steps.AttrOutcome, "rejected", steps.AttrTries, 1)
	want(t, kids[1], steps.AttrReplayed, false, steps.AttrOutcome, "completed", steps.AttrTries, 2)

	exp.Reset()
	if _, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues}); !errors.Is(err, checkpoint.ErrAlreadySucceeded) {
		t.Fatalf("a third run: %v, want ErrAlreadySucceeded", err)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("a refused claim made spans %q, want the attempt's only", names(spans))
	}
	want(t, spans[0], steps.AttrOutcome, "refused", steps.AttrAttempt, 0)
	if spans[0].Status.Code != codes.Error {
		t.Errorf("refused attempt status %+v, want the refusal as its error", spans[0].Status)
	}
}

// TestTraceOffRecordsNothing checks the default: without a
// TracerProvider, steps run under the global provider's no-op spans, and
// a step's context carries no trace to inject.
func TestTraceOffRecordsNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var hdr http.Header
	var sc trace.SpanContext
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
		_, err := steps.Do(ctx, run, "load", func(ctx context.Context) (int, error) {
			sc = trace.SpanContextFromContext(ctx)
			hdr = http.Header{}
			steps.InjectTrace(ctx, hdr)
			return 1, nil
		})
		return err
	}
	if _, err := h.runner(nil).Run(context.Background(), runner.Request{Job: "job", Values: testValues}); err != nil {
		t.Fatal(err)
	}
	if sc.IsValid() || len(hdr) != 0 {
		t.Errorf("with tracing off a step's context has span context %v and injects %v; want none", sc, hdr)
	}
}
