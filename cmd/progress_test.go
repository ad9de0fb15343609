package cmd

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/steps"
)

// Off a terminal the display draws nothing: the runner logs progress
// (runner/progress_test.go), so run and resume log it as serve and
// backfill do.
func TestProgressOffATerminalIsTheRunnersLog(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress("auto", &buf) // a buffer is not a terminal
	if p.mode != "log" || p.hook() != nil || p.logEvery() != 0 {
		t.Fatalf("off a terminal: mode %q, hook set %v, log every %s; want log, no hook, the runner's default",
			p.mode, p.hook() != nil, p.logEvery())
	}
	for _, mode := range []string{"bar", "none"} {
		if q := newProgress(mode, &buf); q.logEvery() >= 0 {
			t.Errorf("--progress %s: the runner logs progress every %s; want never", mode, q.logEvery())
		}
	}
}

// On a terminal (forced here) progress is a bar naming the step, its count
// and its rejections.
func TestProgressBar(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress("bar", &buf)
	p.hook()(steps.Progress{Step: "post", Total: 10, Done: 4, Rejected: 1, StartedAt: time.Now()})
	p.close()
	out := buf.String()
	for _, want := range []string{"post (1 rejected, 0 skipped)", "/10, "} { // the count is throttled to 10 redraws a second
		if !strings.Contains(out, want) {
			t.Errorf("bar output lacks %q:\n%q", want, out)
		}
	}
	// none shows nothing.
	buf.Reset()
	q := newProgress("none", &buf)
	if q.hook() != nil {
		t.Error("--progress none has a progress hook")
	}
	q.close()
	if buf.Len() != 0 {
		t.Errorf("--progress none wrote %q", buf.String())
	}
}

// A log line written while the bar is up clears the bar first, so the line
// starts on a clean line; close writes nothing after it (the bar is
// gone already), so the outcome printed next is not preceded by bar residue.
func TestProgressBarClearsForLogLines(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress("bar", &buf)
	log := zerolog.New(p)
	p.report(steps.Progress{Step: "post", Total: 10, Done: 4, StartedAt: time.Now()})
	drawn := buf.Len()
	if drawn == 0 || !strings.Contains(buf.String(), "post") {
		t.Fatalf("no bar drawn: %q", buf.String())
	}
	log.Warn().Msg("run interrupted")
	out := buf.String()
	line := strings.Index(out, `{"level":"warn"`)
	if line < drawn {
		t.Fatalf("log line at %d, inside the bar (%d bytes):\n%q", line, drawn, out)
	}
	if clear := out[drawn:line]; !strings.HasPrefix(clear, "\r") || strings.TrimSpace(clear) != "" {
		t.Errorf("between the bar and the log line %q; want the bar cleared (\\r, blanks, \\r)", clear)
	}
	p.close()
	after := buf.String()[line:]
	if want := `{"level":"warn","message":"run interrupted"}` + "\n"; after != want {
		t.Errorf("after the log line and close: %q; want only the line %q", after, want)
	}
}
