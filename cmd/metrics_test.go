package cmd

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// metricValue returns the value of series in a /metrics scrape, or -1.
func metricValue(t *testing.T, body, series string) float64 {
	t.Helper()
	for line := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("series %s: value %q: %v", series, v, err)
			}
			return f
		}
	}
	return -1
}

// TestServeMetricsDurationsAndLastSuccess scrapes a real serve's /metrics
// after its schedule's runs (one 200ms step each) succeeded: the attempt
// and step duration histograms have observed them, at least the step's
// pace each, and the job's last success is a unix time within the test.
func TestServeMetricsDurationsAndLastSuccess(t *testing.T) {
	t.Parallel()
	db, side := testFiles(t)
	began := time.Now()
	c := startServe(t, db, side, "--listen", "127.0.0.1:0")
	c.WaitFor("the listen address", func() bool { return serveAddr.MatchString(c.Stdout()) })
	addr := serveAddr.FindStringSubmatch(c.Stdout())[1]
	waitRuns(t, c, side, 3) // the third started: the first two ended
	code, body := httpGet(t, "http://"+addr+"/metrics")
	scraped := time.Now()
	stopServe(t, c)
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d:\n%s", code, body)
	}
	attempts := metricValue(t, body, `stepwise_attempt_duration_seconds_count{job="crashy",status="succeeded"}`)
	stepsN := metricValue(t, body, `stepwise_step_duration_seconds_count{job="crashy",step="step"}`)
	stepsSum := metricValue(t, body, `stepwise_step_duration_seconds_sum{job="crashy",step="step"}`)
	if attempts < 1 || stepsN < 1 {
		t.Fatalf("observed %v attempts and %v steps; want at least one each:\n%s", attempts, stepsN, body)
	}
	if stepsSum/stepsN < 0.2 {
		t.Errorf("steps took %.3fs on average; each paces 200ms", stepsSum/stepsN)
	}
	if !strings.Contains(body, `stepwise_step_duration_seconds_bucket{job="crashy",step="step",le="0.25"}`) {
		t.Errorf("no 0.25s bucket of the step histogram:\n%s", body)
	}
	last := metricValue(t, body, `stepwise_job_last_success_timestamp_seconds{job="crashy"}`)
	if at := time.Unix(0, int64(last*1e9)); at.Before(began.Add(-time.Second)) || at.After(scraped) {
		t.Errorf("last success %v (%s) is not between the start %s and the scrape %s", last, at, began, scraped)
	}
}
