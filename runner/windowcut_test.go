package runner_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/runner"
)

// ctxSlow delivers after d unless its context ends first.
type ctxSlow struct{ d time.Duration }

func (s ctxSlow) Deliver(ctx context.Context, m checkpoint.Message) error {
	select {
	case <-time.After(s.d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestWindowCutIsNotATry: a delivery the dispatcher's own claim window cut
// short is not counted as a try, so it can never make a message dead (a
// 300ms window, deliveries of 200ms, two messages, MaxTries 1: the second
// is cut). Found by review.
func TestWindowCutIsNotATry(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	now := time.Now()
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: "r", Job: "settle", RunKey: "r", Params: []byte("{}"),
		ParamsHash: "h", Owner: "t:1", Now: now, LeaseFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		for i := range 2 {
			if err := tx.Enqueue(checkpoint.Message{Key: fmt.Sprintf("r/m%d", i), Topic: "t", Payload: []byte("{}"), CreatedAt: now.Add(-time.Second)}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	d := runner.Dispatcher{Store: st, To: ctxSlow{200 * time.Millisecond}, VisibleFor: 300 * time.Millisecond, Batch: 2, MaxTries: 1}
	res, err := d.Pass(ctx)
	if err != nil || res.Dead != 0 || res.Sent+res.Left != 2 {
		t.Errorf("pass = %+v, %v; want both messages sent or left for the next window, none dead", res, err)
	}
	ms, err := st.RunMessages(ctx, "r")
	if err != nil || len(ms) != 2 {
		t.Fatalf("messages: %v, %v", ms, err)
	}
	for _, m := range ms {
		t.Logf("%s status=%s tries=%d err=%q", m.Key, m.Status, m.Tries, m.LastError)
		if m.Status == checkpoint.MessageDead {
			t.Errorf("%s dead after the dispatcher's own window cut its delivery short", m.Key)
		}
	}
}
