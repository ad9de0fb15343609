package runner_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// progressLine is a "progress" log line's fields.
type progressLine struct {
	Level    string   `json:"level"`
	Message  string   `json:"message"`
	Job      string   `json:"job"`
	RunID    string   `json:"run_id"`
	Attempt  int      `json:"attempt"`
	Step     string   `json:"step_id"`
	Done     int64    `json:"done"`
	Total    int64    `json:"total"`
	Rate     *float64 `json:"items_per_second"`
	ETA      *float64 `json:"eta_seconds"`
	Replayed int64    `json:"replayed"`
}

// progressLines returns the progress lines of a JSON log.
func progressLines(t *testing.T, log []byte) []progressLine {
	t.Helper()
	var out []progressLine
	sc := bufio.NewScanner(bytes.NewReader(log))
	for sc.Scan() {
		var l progressLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if l.Message == "progress" {
			out = append(out, l)
		}
	}
	return out
}

// syncBuf is a log sink safe for the runner's goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.b.Bytes())
}

// Every run the runner drives logs its batch steps' progress with the
// run's job, run_id and attempt: the first chunk, then at most every
// ProgressLog of the injected clock, and always the last chunk; the rate
// is per second and the ETA in seconds.
func TestRunnerLogsProgress(t *testing.T) {
	h := newHarness(t)
	clock := &fakeClock{now: time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)}
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
		_, err := steps.ForEach(ctx, run, "post", steps.Slice([]int{1, 2, 3, 4, 5, 6}, strconv.Itoa),
			func(context.Context, int, *steps.Effects) (int, error) {
				clock.Advance(2 * time.Second) // each chunk of one item takes 2s
				return 0, nil
			}, steps.ChunkSize(1))
		return err
	}
	var log syncBuf
	var hooked []int64
	r := h.runner(func(c *runner.Config) {
		c.Clock, c.Logger = clock, zerolog.New(&log)
		c.OnProgress = func(p steps.Progress) { hooked = append(hooked, p.Done) }
	})
	if _, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues}); err != nil {
		t.Fatal(err)
	}
	lines := progressLines(t, log.Bytes())
	// Reports at 2s, 4s, ... 12s: logged at 2s (first), 8s (5s after),
	// and 12s (the last).
	var done []int64
	for _, l := range lines {
		done = append(done, l.Done)
		if l.Level != "info" || l.Job != "job" || l.RunID != testRunID || l.Attempt != 1 || l.Step != "post" || l.Total != 6 {
			t.Errorf("progress line %+v; want info with job, run_id %s, attempt 1, step_id post, total 6", l, testRunID)
		}
	}
	if want := []int64{1, 4, 6}; !slices.Equal(done, want) {
		t.Fatalf("progress logged at done = %v; want %v", done, want)
	}
	if l := lines[0]; l.Rate == nil || *l.Rate != 0.5 || l.ETA == nil || *l.ETA != 10 {
		t.Errorf("first line rate %v items/s, eta %v s; want 0.5 and 10", deref(l.Rate), deref(l.ETA))
	}
	if !slices.Equal(hooked, []int64{1, 2, 3, 4, 5, 6, 6}) {
		t.Errorf("OnProgress got done = %v; want every chunk, then the final report", hooked)
	}

	// A source that does not know its total still gets its last line.
	h3 := newHarness(t)
	h3.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
		seq := func(yield func(string, int) bool) {
			for i := 1; i <= 6; i++ {
				if !yield(strconv.Itoa(i), i) {
					return
				}
			}
		}
		_, err := steps.ForEach(ctx, run, "post", steps.Seq(seq, -1),
			func(context.Context, int, *steps.Effects) (int, error) { clock.Advance(2 * time.Second); return 0, nil }, steps.ChunkSize(1))
		return err
	}
	log = syncBuf{}
	r = h3.runner(func(c *runner.Config) { c.Clock, c.Logger = clock, zerolog.New(&log) })
	if _, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues}); err != nil {
		t.Fatal(err)
	}
	if ls := progressLines(t, log.Bytes()); len(ls) == 0 || ls[len(ls)-1].Done != 6 {
		t.Errorf("unknown total: progress lines %+v; want the last one at done 6", ls)
	}

	// A negative ProgressLog logs none (a bar shows progress instead).
	h2 := newHarness(t)
	h2.body = h.body
	log = syncBuf{}
	r = h2.runner(func(c *runner.Config) { c.Clock, c.Logger, c.ProgressLog = clock, zerolog.New(&log), -1 })
	if _, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues}); err != nil {
		t.Fatal(err)
	}
	if n := len(progressLines(t, log.Bytes())); n != 0 {
		t.Errorf("ProgressLog -1 logged %d progress lines; want none", n)
	}
}

func deref(f *float64) any {
	if f == nil {
		return nil
	}
	return *f
}

// A partitioned batch step's owner reports the step's summed progress as
// often as the progress hook wants it: every ProgressLog when it only
// logs (it used to read the partitions every 500ms whatever the log's
// interval). With ProgressLog at 50ms, a step whose partitions are held
// up in their first items logs six progress lines well within 1.5s; at
// 500ms it would have logged four at most.
func TestPartitionedProgressFollowsTheHooksInterval(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	h.body = func(ctx context.Context, run *steps.Run, _ jobParams) error {
		_, err := steps.ForEach(ctx, run, "items", steps.Slice(partitionKeys(), func(k string) string { return k }),
			func(ctx context.Context, k string, _ *steps.Effects) (string, error) {
				if k == "k00" || k == "k10" { // each partition's first item
					<-gate
				}
				return k, nil
			}, steps.Partitions(2), steps.ChunkSize(2))
		return err
	}
	var log syncBuf
	r := h.runner(func(c *runner.Config) { c.Logger, c.ProgressLog = zerolog.New(&log), 50*time.Millisecond })
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
		done <- err
	}()
	const want, within = 6, 1500 * time.Millisecond
	start := time.Now()
	n := 0
	for time.Since(start) < within {
		if n = len(progressLines(t, log.Bytes())); n >= want {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n < want {
		t.Errorf("%d progress lines in %s of a partitioned step logging every 50ms; want %d at least", n, within, want)
	}
	lines := progressLines(t, log.Bytes())
	if last := lines[len(lines)-1]; last.Step != "items" || last.Done != 20 || last.Total != 20 {
		t.Errorf("last progress line %+v; want items, 20 of 20 done", last)
	}
}
