package cmd

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/steps"
)

// Off a terminal, progress is a structured log line: the first chunk, then
// at most every progressLogEvery, and always the last one.
func TestProgressLogLines(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress("auto", &buf, zerolog.New(&buf)) // a buffer is not a terminal
	if p.mode != "log" {
		t.Fatalf("mode %q off a terminal, want log", p.mode)
	}
	start := time.Now().Add(-2 * time.Second)
	p.report(steps.Progress{Step: "post", Total: 3000, Done: 1000, StartedAt: start})
	p.report(steps.Progress{Step: "post", Total: 3000, Done: 2000, StartedAt: start}) // within 5s: quiet
	p.report(steps.Progress{Step: "post", Total: 3000, Done: 3000, Rejected: 7, StartedAt: start})
	p.close()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d progress lines, want 2 (first and last):\n%s", len(lines), buf.String())
	}
	var last struct {
		Step     string  `json:"step_id"`
		Done     int64   `json:"done"`
		Total    int64   `json:"total"`
		Rejected int64   `json:"rejected"`
		Rate     float64 `json:"rate"`
		Message  string  `json:"message"`
	}
	if err := json.Unmarshal([]byte(lines[1]), &last); err != nil {
		t.Fatal(err)
	}
	if last.Step != "post" || last.Done != 3000 || last.Total != 3000 || last.Rejected != 7 || last.Rate <= 0 || last.Message != "progress" {
		t.Fatalf("last line %+v", last)
	}
}

// On a terminal (forced here) progress is a bar naming the step, its count
// and its rejections.
func TestProgressBar(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress("bar", &buf, zerolog.Nop())
	p.report(steps.Progress{Step: "post", Total: 10, Done: 4, Rejected: 1, StartedAt: time.Now()})
	p.close()
	out := buf.String()
	for _, want := range []string{"post (1 rejected, 0 skipped)", "/10, "} { // the count is throttled to 10 redraws a second
		if !strings.Contains(out, want) {
			t.Errorf("bar output lacks %q:\n%q", want, out)
		}
	}
	// none shows nothing.
	buf.Reset()
	q := newProgress("none", &buf, zerolog.New(&buf))
	q.report(steps.Progress{Step: "post", Total: 10, Done: 10})
	q.close()
	if buf.Len() != 0 {
		t.Errorf("--progress none wrote %q", buf.String())
	}
}
