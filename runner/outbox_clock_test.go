package runner_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// issue 23.4: on PostgreSQL a failed delivery's retry time comes from the
// database clock, as leases do. A dispatcher one day ahead fails a
// delivery; the message is due again after the backoff on the server's
// clock, not a day later, so a healthy dispatcher delivers it soon after.
func TestOutboxRetryTimeIsTheDatabasesClock(t *testing.T) {
	ctx := context.Background()
	st, err := postgres.Open(ctx, postgres.Config{URL: pgtest.Schema(t)}) // the server's clock, as in production
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: "settle/d", Job: "settle", RunKey: "d", Params: []byte("{}"),
		ParamsHash: "h", Owner: "t:1", LeaseFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	run, err := steps.Begin(ctx, steps.Config{Store: st, Lease: c.Lease})
	if err != nil {
		t.Fatal(err)
	}
	if err := steps.Notify(ctx, run, "notify", "settled", map[string]string{"date": "d"}); err != nil {
		t.Fatal(err)
	}
	h := &hook{fail: 1}
	srv := httptest.NewServer(h) // 127.0.0.1
	defer srv.Close()
	backoff := steps.RetryPolicy{Initial: 300 * time.Millisecond, Jitter: steps.NoJitter}
	ahead := &outboxClock{now: time.Now().Add(24 * time.Hour)}
	skewed := runner.Dispatcher{Store: st, To: runner.WebhookDelivery{URL: srv.URL}, Clock: ahead, Backoff: backoff}
	if res, err := skewed.Pass(ctx); err != nil || res.Failed != 1 {
		t.Fatalf("skewed pass: %+v, %v; want one failure", res, err)
	}
	msgs, err := st.RunMessages(ctx, "settle/d")
	if err != nil || len(msgs) != 1 {
		t.Fatalf("messages: %+v, %v", msgs, err)
	}
	if wait := time.Until(msgs[0].NextAt); msgs[0].Status != checkpoint.MessageQueued || wait > time.Minute {
		t.Fatalf("after a failure seen from a clock a day ahead the message is %s, due in %s; want queued, due after the 300ms backoff",
			msgs[0].Status, wait.Round(time.Second))
	}
	healthy := runner.Dispatcher{Store: st, To: runner.WebhookDelivery{URL: srv.URL}, Backoff: backoff}
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := healthy.Pass(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Sent == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a healthy dispatcher did not deliver the message within 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
