package cmd

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

func TestOTLPTracesFromEnvironment(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		env       map[string]string
		wantProto string
		warns     bool
	}{
		{"nothing set", nil, "", false},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, protoHTTP, false},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, protoHTTP, false},
		{"exporter otlp alone", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, protoHTTP, false},
		{"exporter none", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, "", false},
		{"sdk disabled", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, "", false},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, protoGRPC, false},
		{"traces protocol wins", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, protoHTTP, false},
		{"http/json", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "", true},
		{"other variables only", map[string]string{"OTEL_SERVICE_NAME": "settle", "OTEL_EXPORTER_OTLP_HEADERS": "a=b"}, "", false},
	}
	for _, tc := range cases {
		proto, warning := otlpTraces(func(k string) string { return tc.env[k] })
		if proto != tc.wantProto || (warning != "") != tc.warns {
			t.Errorf("%s: otlpTraces = %q, warning %q; want %q, a warning: %v", tc.name, proto, warning, tc.wantProto, tc.warns)
		}
		if tc.warns && !strings.Contains(warning, "OTEL_EXPORTER_OTLP_PROTOCOL") {
			t.Errorf("%s: the warning %q does not name the variable", tc.name, warning)
		}
	}
}

// otlpReceiver is an OTLP/HTTP trace receiver: it keeps every span it is
// sent, with its resource's service.name.
type otlpReceiver struct {
	mu       sync.Mutex
	requests int
	spans    []*tracepb.Span
	services []string
	srv      *httptest.Server
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	rc := &otlpReceiver{}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
			http.Error(w, "not an OTLP trace export", http.StatusNotFound)
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = gz
		}
		b, err := io.ReadAll(body)
		var req collectortrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(b, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		rc.requests++
		for _, rs := range req.ResourceSpans {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					rc.services = append(rc.services, kv.GetValue().GetStringValue())
				}
			}
			for _, ss := range rs.ScopeSpans {
				rc.spans = append(rc.spans, ss.Spans...)
			}
		}
		rc.mu.Unlock()
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *otlpReceiver) got() (requests int, spans []*tracepb.Span, services []string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.requests, slices.Clone(rc.spans), slices.Clone(rc.services)
}

// TestRunExportsTracesOverOTLP runs the CLI in a real process with
// OTEL_EXPORTER_OTLP_ENDPOINT naming a local receiver and TRACEPARENT set
// (a scheduler that traces its jobs): the receiver gets the attempt's and
// the steps' spans, in the caller's trace, flushed before the process
// exits. Without the endpoint nothing is exported.
func TestRunExportsTracesOverOTLP(t *testing.T) {
	t.Parallel()
	rc := newOTLPReceiver(t)
	db := testDB(t)
	side := filepath.Join(t.TempDir(), "side")
	const (
		traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
		parentID = "00f067aa0ba902b7"
	)
	c, got := runChild(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rc.srv.URL, "OTEL_SERVICE_NAME=settlement",
		"TRACEPARENT=00-" + traceID + "-" + parentID + "-01"}, crashyArgs(db, "traced", side)...)
	c.WantExit(got, exited0)
	if strings.Contains(c.Stderr(), "warning") {
		t.Errorf("the run warned:\n%s", c.Stderr())
	}
	_, spans, services := rc.got()
	var names []string
	var attempt *tracepb.Span
	for _, sp := range spans {
		names = append(names, sp.Name)
		if sp.Name == "attempt crashy" {
			attempt = sp
		}
		if id := hex.EncodeToString(sp.TraceId); id != traceID {
			t.Errorf("span %q is in trace %s, want the caller's %s", sp.Name, id, traceID)
		}
	}
	slices.Sort(names)
	if want := []string{"attempt crashy", "step step", "step step", "step step"}; !slices.Equal(names, want) {
		t.Fatalf("exported spans %q, want %q", names, want)
	}
	if p := hex.EncodeToString(attempt.ParentSpanId); p != parentID {
		t.Errorf("the attempt's parent is %s, want TRACEPARENT's %s", p, parentID)
	}
	for _, sp := range spans {
		if sp != attempt && hex.EncodeToString(sp.ParentSpanId) != hex.EncodeToString(attempt.SpanId) {
			t.Errorf("span %q is not the attempt's child", sp.Name)
		}
	}
	if len(services) == 0 || services[0] != "settlement" {
		t.Errorf("service.name %q, want OTEL_SERVICE_NAME's settlement", services)
	}

	// The same without an endpoint: nothing reaches the receiver.
	before, _, _ := rc.got()
	c, got = runChild(t, []string{"OTEL_SERVICE_NAME=settlement", "TRACEPARENT=00-" + traceID + "-" + parentID + "-01"},
		crashyArgs(db, "untraced", side)...)
	c.WantExit(got, exited0)
	if after, _, _ := rc.got(); after != before {
		t.Errorf("a run without an OTLP endpoint made %d exports", after-before)
	}
}

// TestUnsupportedOTLPProtocolWarnsAndRuns checks that a tracing setting
// this program cannot honour never stops a run: it warns, naming the
// variable, and runs untraced.
func TestUnsupportedOTLPProtocolWarnsAndRuns(t *testing.T) {
	t.Parallel()
	rc := newOTLPReceiver(t)
	db := testDB(t)
	c, got := runChild(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rc.srv.URL, "OTEL_EXPORTER_OTLP_PROTOCOL=http/json"},
		crashyArgs(db, "k", filepath.Join(t.TempDir(), "side"))...)
	c.WantExit(got, exited0)
	if want := `warning: OTEL_EXPORTER_OTLP_PROTOCOL="http/json" is not supported`; !strings.Contains(c.Stderr(), want) {
		t.Errorf("stderr does not say %q:\n%s", want, c.Stderr())
	}
	if n, _, _ := rc.got(); n != 0 {
		t.Errorf("%d exports with an unsupported protocol", n)
	}
}

// TestNoTracerProviderWithoutEndpoint checks that a command whose
// environment asks for no export builds no tracer provider, exporter or
// batch span processor (their goroutine and span buffer would cost every
// run memory for spans nobody reads), and that the same Env with an
// endpoint does build one.
func TestNoTracerProviderWithoutEndpoint(t *testing.T) {
	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		t.Setenv(k, "")
	}
	var stderr strings.Builder
	e := &Env{Ctx: context.Background(), Stderr: &stderr, Name: "stepwise"}
	if e.tracing(true) != nil || e.tracer != nil {
		t.Fatal("tracing() without an endpoint built a tracer provider; want none")
	}
	if stderr.Len() != 0 {
		t.Errorf("stderr: %q", stderr.String())
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	e = &Env{Ctx: context.Background(), Stderr: &stderr, Name: "stepwise"}
	if tp := e.tracing(true); tp == nil {
		t.Fatalf("tracing() with an endpoint built no tracer provider (stderr %q)", stderr.String())
	}
	e.closeTracing()
}
