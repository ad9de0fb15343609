package runner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// tickingClock advances a millisecond at every reading,
// shared by every dispatcher: time moves without sleeps (waits are real).
type tickingClock struct {
	runner.SystemClock
	ns atomic.Int64
}

func (c *tickingClock) Now() time.Time { return time.Unix(0, c.ns.Add(int64(time.Millisecond))).UTC() }

// countingHook counts deliveries by key and fails every delivery of one.
type countingHook struct {
	mu     sync.Mutex
	counts map[string]int
	bad    []string // envelopes whose key and Idempotency-Key differ
	poison string
}

func (h *countingHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var env struct {
		Key string `json:"key"`
	}
	b, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(b, &env); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if env.Key != r.Header.Get("Idempotency-Key") {
		h.bad = append(h.bad, env.Key+" != "+r.Header.Get("Idempotency-Key"))
	}
	h.counts[env.Key]++
	if env.Key == h.poison {
		http.Error(w, "cannot take this one", http.StatusInternalServerError)
	}
}

// TestThreeDispatchersDeliverEachOnce runs three dispatchers, each on a
// handle of its own (three hosts), over one outbox and a local webhook:
// every message is delivered, with its stable key, once (no dispatcher
// dies, so no window runs out), and the one the webhook always refuses is
// dead after MaxTries deliveries and never tried again.
func TestThreeDispatchersDeliverEachOnce(t *testing.T) {
	ctx := context.Background()
	clock := &tickingClock{}
	clock.ns.Store(time.Date(2026, 1, 31, 23, 0, 0, 0, time.UTC).UnixNano())
	st, loc := checkpointtest.OpenNew(t)
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: "settle/2026-01-31", Job: "settle", RunKey: "2026-01-31", Params: []byte("{}"),
		ParamsHash: "h", Owner: "t:1", Now: clock.Now(), LeaseFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	const n, maxTries = 90, 3
	var keys []string
	if err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		for i := range n {
			m := checkpoint.Message{Key: fmt.Sprintf("settle/2026-01-31/notify-%02d", i), Topic: "settled",
				Payload: []byte(fmt.Sprintf(`{"i":%d}`, i)), CreatedAt: clock.Now()}
			keys = append(keys, m.Key)
			if err := tx.Enqueue(m); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	poison := keys[n/2]
	h := &countingHook{counts: map[string]int{}, poison: poison}
	srv := httptest.NewServer(h)
	defer srv.Close()

	var (
		wg               sync.WaitGroup
		sent, dead, left atomic.Int64
		errs             = make(chan error, 3)
	)
	for w := range 3 {
		d := runner.Dispatcher{Store: checkpointtest.OpenLocation(t, loc), To: runner.WebhookDelivery{URL: srv.URL}, Clock: clock,
			Backoff:    steps.RetryPolicy{Initial: time.Millisecond, Max: time.Millisecond, Jitter: steps.NoJitter},
			VisibleFor: time.Hour, MaxTries: maxTries, Batch: 4}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Until nothing is queued: messages another dispatcher
			// claimed stay queued until it delivers them, however slowly
			// a loaded machine lets it, so a count of passes would run
			// out while it waits. A pass that found nothing yields a
			// moment to the others.
			for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
				res, err := d.Pass(ctx)
				if err != nil {
					errs <- fmt.Errorf("dispatcher %d: %w", w, err)
					return
				}
				sent.Add(int64(res.Sent))
				dead.Add(int64(res.Dead))
				left.Add(int64(res.Left))
				queued, err := d.Store.Messages(ctx, checkpoint.MessageQueued, 1)
				if err != nil {
					errs <- err
					return
				}
				if len(queued) == 0 {
					return
				}
				if res == (runner.PassResult{}) {
					time.Sleep(time.Millisecond)
				}
			}
			errs <- fmt.Errorf("dispatcher %d: messages still queued after a minute", w)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(h.bad) > 0 {
		t.Errorf("deliveries whose body key and Idempotency-Key differ: %v", h.bad)
	}
	for _, k := range keys {
		want := 1
		if k == poison {
			want = maxTries
		}
		if got := h.counts[k]; got != want {
			t.Errorf("message %s delivered %d times; want %d", k, got, want)
		}
	}
	if len(h.counts) != n {
		t.Errorf("the webhook saw %d keys; want the %d queued, no other", len(h.counts), n)
	}
	if sent.Load() != n-1 || dead.Load() != 1 || left.Load() != 0 {
		t.Errorf("passes counted %d sent, %d dead, %d left; want %d, 1, 0", sent.Load(), dead.Load(), left.Load(), n-1)
	}
	ms, err := st.Messages(ctx, checkpoint.MessageDead, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Key != poison || ms[0].Tries != maxTries || ms[0].LastError == "" {
		t.Fatalf("dead messages = %+v; want %s after %d tries with its error", ms, poison, maxTries)
	}
	// Dead is final: a later pass, long after, does not try it again.
	d := runner.Dispatcher{Store: st, To: runner.WebhookDelivery{URL: srv.URL}, Clock: clock, MaxTries: maxTries}
	clock.ns.Add(int64(24 * time.Hour))
	if res, err := d.Pass(ctx); err != nil || res != (runner.PassResult{}) {
		t.Errorf("pass a day later = %+v, %v; want nothing to do", res, err)
	}
	if got := h.counts[poison]; got != maxTries {
		t.Errorf("the dead message was delivered %d times in all; want %d", got, maxTries)
	}
}

// slowDelivery takes a fake minute per delivery.
type slowDelivery struct {
	clock *outboxClock
	keys  []string
}

func (s *slowDelivery) Deliver(_ context.Context, m checkpoint.Message) error {
	s.keys = append(s.keys, m.Key)
	s.clock.now = s.clock.now.Add(time.Minute)
	return nil
}

// TestDispatcherLeavesWhatItsWindowCannotCover: a batch slower than the
// claim's window stops delivering before the window ends, so no other
// dispatcher's claim overlaps a delivery; what is left is claimable when
// the window ends.
func TestDispatcherLeavesWhatItsWindowCannotCover(t *testing.T) {
	ctx := context.Background()
	clock := &outboxClock{now: time.Date(2026, 1, 31, 23, 0, 0, 0, time.UTC)}
	st := checkpointtest.Open(t)
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: "r", Job: "settle", RunKey: "r", Params: []byte("{}"),
		ParamsHash: "h", Owner: "t:1", Now: clock.now, LeaseFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		for i := range 5 {
			if err := tx.Enqueue(checkpoint.Message{Key: fmt.Sprintf("r/m%d", i), Topic: "t", Payload: []byte("{}"), CreatedAt: clock.now}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slow := &slowDelivery{clock: clock}
	// A 4-minute window stops deliveries at 3.6 minutes: four of five
	// start within it.
	d := runner.Dispatcher{Store: st, To: slow, Clock: clock, VisibleFor: 4 * time.Minute, Batch: 5}
	res, err := d.Pass(ctx)
	if err != nil || res.Sent != 4 || res.Left != 1 {
		t.Fatalf("slow pass = %+v, %v; want 4 sent, 1 left", res, err)
	}
	if ms, err := st.ClaimMessages(ctx, clock.now.Add(-time.Microsecond), 5, time.Minute); err != nil || len(ms) != 0 {
		t.Fatalf("claim before the window ends = %+v, %v; want nothing (the left one is still claimed)", ms, err)
	}
	if res, err := d.Pass(ctx); err != nil || res.Sent != 1 {
		t.Fatalf("pass when the window ends = %+v, %v; want the left one sent", res, err)
	}
	if len(slow.keys) != 5 || slow.keys[4] != "r/m4" {
		t.Errorf("delivered %v; want each of five once, r/m4 last", slow.keys)
	}
}

func TestDispatcherRefusesNegativeSettings(t *testing.T) {
	st := checkpointtest.Open(t)
	for _, d := range []runner.Dispatcher{{MaxTries: -1}, {VisibleFor: -time.Second}, {Batch: -1}} {
		d.Store, d.To = st, &runner.WriterDelivery{W: io.Discard}
		if _, err := d.Pass(context.Background()); err == nil {
			t.Errorf("Pass with %+v accepted it", d)
		}
	}
}
