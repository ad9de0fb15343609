package web_test

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/cmd/internal/web"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// chartClock is a clock the batch job moves, to give each run its length.
type chartClock struct {
	runner.SystemClock
	mu  sync.Mutex
	now time.Time
}

func (c *chartClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *chartClock) advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

type nightParams struct {
	Date    string `param:"date,key" format:"date" help:"business date"`
	Minutes int    `param:"minutes" help:"how long it takes"`
	Bad     int    `param:"bad" help:"items rejected"`
	Fail    bool   `param:"fail" help:"fail after the batch"`
}

// nightlyRuns records runs of job "nightly" on st: a batch of 10 items,
// the first Bad rejected, the last skipped, each run taking its minutes.
func nightlyRuns(t *testing.T, st checkpoint.Backend, runs ...nightParams) *chartClock {
	t.Helper()
	clk := &chartClock{now: time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC)}
	reg := &jobs.Registry{}
	reg.MustRegister(jobs.Define("nightly", func(ctx context.Context, run *steps.Run, p nightParams) error {
		clk.advance(time.Duration(p.Minutes) * time.Minute)
		items := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
		if _, err := steps.ForEach(ctx, run, "post", steps.Slice(items, strconv.Itoa),
			func(ctx context.Context, i int, e *steps.Effects) (int, error) {
				switch {
				case i <= p.Bad:
					return 0, steps.Reject(errors.New("overdrawn"))
				case i == 10:
					return 0, errors.New("broken")
				}
				return i, nil
			}, steps.SkipFailures(5)); err != nil {
			return err
		}
		if p.Fail {
			return errors.New("the ledger is closed")
		}
		return nil
	}))
	// A lease far longer than the fake hours a run takes: its runner never
	// judges itself fenced when the clock jumps.
	r, err := runner.New(runner.Config{Store: st, Jobs: reg, Clock: clk, Lease: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range runs {
		clk.advance(time.Hour)
		_, _ = r.Run(context.Background(), runner.Request{Job: "nightly", Values: map[string]string{
			"date": p.Date, "minutes": strconv.Itoa(p.Minutes), "bad": strconv.Itoa(p.Bad), "fail": strconv.FormatBool(p.Fail)}})
	}
	return clk
}

// The runs list shows the counts by status of the runs its job and key
// filters select; a job's page charts its last runs as SVG drawn by the
// server: a duration bar per run, as tall as its run took, and the batch
// items stacked.
func TestRunCountsAndJobCharts(t *testing.T) {
	st := checkpointtest.Open(t)
	clk := nightlyRuns(t, st,
		nightParams{Date: "2026-11-27", Minutes: 10, Bad: 1},
		nightParams{Date: "2026-11-28", Minutes: 20, Bad: 2},
		nightParams{Date: "2026-11-29", Minutes: 40, Bad: 6, Fail: true})
	srv := serve(t, web.Config{Store: st, Logger: zerolog.New(zerolog.NewTestWriter(t)), Now: clk.Now, Location: time.UTC})

	_, body := get(t, srv, "/?job=nightly")
	count := func(status string) string {
		m := regexp.MustCompile(`data-status="` + status + `">([0-9+]+)<`).FindStringSubmatch(body)
		if m == nil {
			return "none"
		}
		return m[1]
	}
	for status, want := range map[string]string{"": "3", "succeeded": "2", "failed": "1", "running": "0", "stale": "0", "abandoned": "0"} {
		if got := count(status); got != want {
			t.Errorf("runs list count of %q = %s; want %s", status, got, want)
		}
	}
	if !strings.Contains(body, `href="/jobs/nightly"`) {
		t.Errorf("the runs list of job nightly does not link its page")
	}
	_, body = get(t, srv, "/?job=a%26status%3Dfailed")
	if !strings.Contains(body, `href="?job=a%26status%3Dfailed&amp;status=succeeded"`) || !strings.Contains(body, `href="?job=a%26status%3Dfailed"`) {
		t.Errorf("the counts' links do not keep a job filter holding & and = as one value:\n%s", body)
	}
	_, body = get(t, srv, "/?job=other")
	if count("") != "0" || count("succeeded") != "0" {
		t.Errorf("counts of a job with no runs: all %s, succeeded %s; want 0", count(""), count("succeeded"))
	}

	res, body := get(t, srv, "/jobs/nightly")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /jobs/nightly: %s\n%s", res.Status, body)
	}
	svg := func(id string) string {
		m := regexp.MustCompile(`(?s)<svg id="` + id + `".*?</svg>`).FindString(body)
		if m == "" {
			t.Fatalf("the job page has no %s:\n%s", id, body)
		}
		return m
	}
	dur := svg("duration-chart")
	heights := regexp.MustCompile(`<rect class="bar s-(\w+)" x="\d+" y="\d+" width="\d+" height="(\d+)"`).FindAllStringSubmatch(dur, -1)
	if len(heights) != 3 {
		t.Fatalf("duration chart has %d bars; want 3, one per run:\n%s", len(heights), dur)
	}
	// 10, 20 and 40 minutes: the longest fills the chart (114 units),
	// the others a quarter and a half of it.
	for i, want := range []struct{ status, height string }{{"succeeded", "29"}, {"succeeded", "57"}, {"failed", "114"}} {
		if heights[i][1] != want.status || heights[i][2] != want.height {
			t.Errorf("duration bar %d = %s, height %s; want %s, height %s", i, heights[i][1], heights[i][2], want.status, want.height)
		}
	}
	wantIn(t, "duration chart", dur, "2026-11-29: failed, took 40m", `href="/runs/nightly/2026-11-27"`, ">40m<")
	items := svg("items-chart")
	segs := regexp.MustCompile(`<rect class="bar seg-(\w+)"`).FindAllStringSubmatch(items, -1)
	if n := strings.Count(items, `<a href="/runs/nightly/`); n != 3 || len(segs) != 9 {
		t.Errorf("items chart has %d bars, %d segments; want 3 bars of posted, rejected and skipped:\n%s", n, len(segs), items)
	}
	wantIn(t, "items chart", items, "2026-11-29: 3 posted, 6 rejected, 1 skipped", "2026-11-27: 8 posted, 1 rejected, 1 skipped")
	if strings.Contains(body, "style=") || strings.Contains(body, "<script>") {
		t.Errorf("the job page has inline style or script, which its Content-Security-Policy refuses")
	}

	_, body = get(t, srv, "/jobs/never")
	wantIn(t, "page of a job without runs", text(body), "No runs of job never are recorded")
}
