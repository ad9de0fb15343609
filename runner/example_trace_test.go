package runner_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// Trace a run and its rerun: a span per attempt with a span per step
// beneath it; on the rerun the steps are replayed from their checkpoints
// and their spans say so. A program exporting to a collector gives an
// OTLP exporter's provider instead of the in-memory one (cmd does so when
// OTEL_EXPORTER_OTLP_ENDPOINT is set).
func ExampleConfig_tracerProvider() {
	dir, err := os.MkdirTemp("", "stepwise-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	st, err := sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(dir, "stepwise.db")})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()

	var registry jobs.Registry
	registry.MustRegister(jobs.Define("report", func(ctx context.Context, run *steps.Run, p dayParams) error {
		for _, id := range []string{"load", steps.ID("price", "1")} {
			if _, err := steps.Do(ctx, run, id, func(ctx context.Context) (int, error) { return 1, nil }); err != nil {
				return err
			}
		}
		return nil
	}))
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(ctx)
	r, err := runner.New(runner.Config{Store: st, Jobs: &registry, TracerProvider: tp})
	if err != nil {
		log.Fatal(err)
	}
	req := runner.Request{Job: "report", Values: map[string]string{"date": "2026-11-28"}}
	for range 2 {
		if _, err := r.Run(ctx, req); err != nil {
			log.Fatal(err)
		}
		req.Force = true // run the succeeded run again: every step replays
	}
	for _, sp := range exp.GetSpans() { // in the order they ended
		a := map[attribute.Key]string{}
		for _, kv := range sp.Attributes {
			a[kv.Key] = kv.Value.String()
		}
		if a[steps.AttrStepID] == "" {
			fmt.Printf("%s: attempt %s %s\n", sp.Name, a[steps.AttrAttempt], a[steps.AttrOutcome])
			continue
		}
		fmt.Printf("  %s: %s %s, replayed %s\n", sp.Name, a[steps.AttrStepID], a[steps.AttrOutcome], a[steps.AttrReplayed])
	}
	// Output:
	//   step load: load completed, replayed false
	//   step price: price/1 completed, replayed false
	// attempt report: attempt 1 succeeded
	//   step load: load completed, replayed true
	//   step price: price/1 completed, replayed true
	// attempt report: attempt 2 succeeded
}
