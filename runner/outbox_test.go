package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// queueOne notifies once in a claimed run and returns the store.
func queueOne(t *testing.T) checkpoint.Backend {
	t.Helper()
	ctx := context.Background()
	st := checkpointtest.Open(t)
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: "settle/d", Job: "settle", RunKey: "d", Params: []byte("{}"),
		ParamsHash: "h", Owner: "t:1", Now: time.Now(), LeaseFor: time.Minute})
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
	// A rerun of the step queues nothing twice.
	run2, _ := steps.Begin(ctx, steps.Config{Store: st, Lease: c.Lease})
	if err := steps.Notify(ctx, run2, "notify", "settled", map[string]string{"date": "d"}); err != nil {
		t.Fatal(err)
	}
	return st
}

// hook records webhook deliveries.
type hook struct {
	mu   sync.Mutex
	keys []string
	fail int // answer 503 this many times first
}

func (h *hook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fail > 0 {
		h.fail--
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return
	}
	var env struct {
		Key   string `json:"key"`
		Topic string `json:"topic"`
	}
	b, _ := io.ReadAll(r.Body)
	json.Unmarshal(b, &env)
	if env.Key != r.Header.Get("Idempotency-Key") || env.Topic != "settled" {
		http.Error(w, "bad envelope", http.StatusBadRequest)
		return
	}
	h.keys = append(h.keys, env.Key)
}

// losingStore is a real store whose MarkSent fails: the process died
// between delivering and recording the delivery.
type losingStore struct{ checkpoint.Backend }

func (losingStore) MarkSent(context.Context, string, time.Time) error { return errors.New("killed") }

// outboxClock is a controllable clock (waits are real).
type outboxClock struct {
	runner.SystemClock
	now time.Time
}

func (c *outboxClock) Now() time.Time { return c.now }

func TestOutboxWebhookAtLeastOnce(t *testing.T) {
	ctx := context.Background()
	st := queueOne(t)
	h := &hook{fail: 1}
	srv := httptest.NewServer(h) // 127.0.0.1
	defer srv.Close()
	clock := &outboxClock{now: time.Now()}
	d := runner.Dispatcher{Store: st, To: runner.WebhookDelivery{URL: srv.URL}, Clock: clock,
		Backoff: steps.RetryPolicy{Initial: time.Minute, Jitter: steps.NoJitter}}

	// The queued message was not delivered with the checkpoint (as after a
	// crash right after the commit): the next pass delivers it, but the
	// webhook is busy: retried later, not lost.
	res, err := d.Pass(ctx)
	if err != nil || res.Sent != 0 || res.Failed != 1 {
		t.Fatalf("first pass: %+v, %v; want one failure", res, err)
	}
	msgs, _ := st.RunMessages(ctx, "settle/d")
	if len(msgs) != 1 || msgs[0].Status != checkpoint.MessageQueued || msgs[0].Tries != 1 || msgs[0].LastError == "" {
		t.Fatalf("after failure: %+v", msgs)
	}
	if res, _ := d.Pass(ctx); res.Sent+res.Failed != 0 {
		t.Fatalf("retried before its backoff: %+v", res)
	}
	clock.now = clock.now.Add(time.Minute)
	// Delivered, but the process dies before recording it: delivered again
	// with the same key on the next pass (at least once, never zero).
	lost := runner.Dispatcher{Store: losingStore{st}, To: runner.WebhookDelivery{URL: srv.URL}, Clock: clock}
	if _, err := lost.Pass(ctx); err == nil {
		t.Fatal("pass with a failing MarkSent reported success")
	}
	// Its claim hides the message from every dispatcher until the window
	// ends; then another takes it.
	if res, err := d.Pass(ctx); err != nil || res.Sent+res.Failed != 0 {
		t.Fatalf("pass within the dead dispatcher's window: %+v, %v; want nothing delivered", res, err)
	}
	clock.now = clock.now.Add(runner.DefaultVisibility)
	if res, err := d.Pass(ctx); err != nil || res.Sent != 1 {
		t.Fatalf("redelivery: %+v, %v", res, err)
	}
	if len(h.keys) != 2 || h.keys[0] != "settle/d/notify" || h.keys[1] != h.keys[0] {
		t.Fatalf("webhook saw %v; want the same key twice", h.keys)
	}
	msgs, _ = st.RunMessages(ctx, "settle/d")
	if msgs[0].Status != checkpoint.MessageSent || msgs[0].SentAt.IsZero() {
		t.Fatalf("not marked sent: %+v", msgs[0])
	}
	if res, _ := d.Pass(ctx); res.Sent != 0 {
		t.Fatal("a sent message was delivered again")
	}
}

func TestParseDelivery(t *testing.T) {
	for _, bad := range []string{"", "file:", "ftp://x", "stdout2"} {
		if _, err := runner.ParseDelivery(bad, io.Discard); err == nil {
			t.Errorf("ParseDelivery(%q) accepted", bad)
		}
	}
	for _, good := range []string{"stdout", "file:/tmp/x.jsonl", "https://example.invalid/hook"} {
		if _, err := runner.ParseDelivery(good, io.Discard); err != nil {
			t.Errorf("ParseDelivery(%q): %v", good, err)
		}
	}
}
