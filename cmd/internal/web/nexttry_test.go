package web_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/cmd/internal/web"
)

// issue 23.1: a pooled run put back in its queue after a store fault says
// on the dashboard when a worker takes it again.
func TestRunsListShowsThePoolsNextTry(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	now := time.Now()
	if _, err := st.Enqueue(ctx, checkpoint.EnqueueRequest{RunID: "settle/" + testDate, Job: "settle", RunKey: testDate,
		Params: []byte(`{"date":"` + testDate + `"}`), ParamsHash: "h", Now: now}); err != nil {
		t.Fatal(err)
	}
	c, ok, err := st.ClaimNext(ctx, checkpoint.ClaimNextRequest{Owner: "w:1", Now: now, LeaseFor: time.Minute})
	if err != nil || !ok {
		t.Fatalf("claim: %v, %v", ok, err)
	}
	if err := st.Finish(ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunInterrupted, Error: "store fault", At: now,
		RetryAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	srv := serve(t, web.Config{Store: st})
	for _, path := range []string{"/", "/runs/settle/" + testDate} {
		_, body := get(t, srv, path)
		if !strings.Contains(text(body), "next try") {
			t.Errorf("GET %s does not say when the next try is:\n%s", path, text(body))
		}
	}
}
