package steps

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// BenchmarkStepSpan measures what tracing adds to each step, without the
// step's own work: starting and ending its span, with tracing off (the
// global no-op provider, the default) and on (an SDK provider that
// records every span and exports none). Set it beside a step's checkpoint
// commit (go test -bench PerStep ./bench/: about a millisecond on SQLite
// with synchronous=full) to read the overhead.
//
//	go test -run '^$' -bench StepSpan -benchmem ./steps/
func BenchmarkStepSpan(b *testing.B) {
	lease := checkpoint.Lease{RunID: "settle/2026-11-28", Attempt: 1}
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	for _, c := range []struct {
		name string
		r    *Run
	}{
		{"off", &Run{lease: lease, runSettings: runSettings{now: time.Now, tracer: defaultTracer()}}},
		{"on", &Run{lease: lease, runSettings: runSettings{now: time.Now, tracer: tp.Tracer(TracerName)}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				_, sp := c.r.startStep(ctx, "post/T-1001", kindDo)
				sp.end(nil)
			}
		})
	}
}
