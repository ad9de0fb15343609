package cmd

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// tracingHelp is the program help's paragraph on traces.
const tracingHelp = `Traces: run, resume, rerun, backfill and serve export OpenTelemetry traces over
OTLP (a span per attempt, step and batch chunk; http/protobuf, or grpc per
OTEL_EXPORTER_OTLP_PROTOCOL) when OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, with the other standard OTEL_* variables
(headers, timeout, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER); off otherwise.
TRACEPARENT (W3C) makes a run's trace a child of the caller's.`

// traceFlushTimeout bounds how long the exit waits for the last spans to
// be exported (an unreachable collector must not hold a finished run).
const traceFlushTimeout = 5 * time.Second

// Protocols of OTEL_EXPORTER_OTLP_PROTOCOL this program exports with.
const (
	protoHTTP = "http/protobuf"
	protoGRPC = "grpc"
)

// otlpTraces says whether the standard OpenTelemetry variables getenv
// reads ask for OTLP trace export, and over which protocol: an OTLP
// endpoint is set (or OTEL_TRACES_EXPORTER is otlp), the SDK is not
// disabled and OTEL_TRACES_EXPORTER does not name another exporter. The
// protocol is http/protobuf unless OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (or
// OTEL_EXPORTER_OTLP_PROTOCOL) says grpc; any other turns export off with
// a warning saying why.
func otlpTraces(getenv func(string) string) (proto string, warning string) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return "", ""
	}
	exporter := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))
	if exporter != "" && exporter != "otlp" {
		return "", "" // "none", or an exporter this program does not have
	}
	if exporter == "" && getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return "", ""
	}
	name := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	proto = getenv(name)
	if proto == "" {
		name = "OTEL_EXPORTER_OTLP_PROTOCOL"
		proto = getenv(name)
	}
	switch proto {
	case "", protoHTTP:
		return protoHTTP, ""
	case protoGRPC:
		return protoGRPC, ""
	}
	return "", fmt.Sprintf("%s=%q is not supported: traces are not exported. Use %s (a collector's port 4318, the default) or %s (port 4317)",
		name, proto, protoHTTP, protoGRPC)
}

// tracing returns the tracer provider of this command's runs: an OTLP
// exporter's when the standard variables ask for one (see otlpTraces),
// else nil (the runner then uses the global provider, a no-op unless the
// embedding program set one). It is set up once per command and flushed
// by close. With inheritParent, a TRACEPARENT variable (and TRACESTATE)
// makes env.Ctx carry the caller's span, the parent of this process's
// attempts (a scheduler that traces its jobs); serve, whose runs are not
// one caller's, passes false. Tracing never stops a run: a setup failure
// is a warning on stderr.
func (e *Env) tracing(inheritParent bool) trace.TracerProvider {
	if !e.traceInit {
		e.traceInit = true
		e.tracer = e.startTracing()
	}
	if e.tracer == nil {
		return nil
	}
	if inheritParent {
		carrier := propagation.MapCarrier{"traceparent": os.Getenv("TRACEPARENT"), "tracestate": os.Getenv("TRACESTATE")}
		e.Ctx = propagation.TraceContext{}.Extract(e.Ctx, carrier)
	}
	return e.tracer
}

func (e *Env) startTracing() *sdktrace.TracerProvider {
	proto, warning := otlpTraces(os.Getenv)
	if warning != "" {
		fmt.Fprintf(e.Stderr, "%s: warning: %s\n", e.Name, warning)
	}
	if proto == "" {
		return nil
	}
	// The exporter reads the endpoint, headers, timeout, compression and
	// TLS settings from the standard variables itself.
	var (
		exp sdktrace.SpanExporter
		err error
	)
	if proto == protoGRPC {
		exp, err = otlptracegrpc.New(e.Ctx)
	} else {
		exp, err = otlptracehttp.New(e.Ctx)
	}
	if err != nil {
		fmt.Fprintf(e.Stderr, "%s: warning: traces are not exported: %v\n", e.Name, err)
		return nil
	}
	// service.name defaults to the program's name; OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES override it.
	res, err := resource.New(e.Ctx, resource.WithAttributes(attribute.String("service.name", e.Name)),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost(), resource.WithProcessPID())
	if err != nil {
		// A partial resource (a bad OTEL_RESOURCE_ATTRIBUTES entry) is
		// still usable: say what was wrong and go on with it.
		fmt.Fprintf(e.Stderr, "%s: warning: trace resource: %v\n", e.Name, err)
	}
	if res == nil {
		res = resource.Default()
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
}

// closeTracing exports the spans still queued, within traceFlushTimeout.
func (e *Env) closeTracing() {
	if e.tracer == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(e.Ctx), traceFlushTimeout)
	defer cancel()
	if err := e.tracer.Shutdown(ctx); err != nil {
		fmt.Fprintf(e.Stderr, "%s: warning: the last traces could not be exported: %v\n", e.Name, err)
	}
}
