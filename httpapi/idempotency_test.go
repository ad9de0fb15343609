package httpapi_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/httpapi"
	"github.com/stepwise-run/stepwise/runner"
)

// steered holds each Start until told what to do: nil passes it on,
// an error fails it.
type steered struct {
	httpapi.Starter
	entered chan int
	verdict []chan error
	mu      sync.Mutex
	n       int
}

func (s *steered) Start(ctx context.Context, req runner.Request) (httpapi.Started, error) {
	s.mu.Lock()
	i := s.n
	s.n++
	s.mu.Unlock()
	s.entered <- i
	if err := <-s.verdict[i]; err != nil {
		return httpapi.Started{}, err
	}
	return s.Starter.Start(ctx, req)
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// A slow first request (past AcceptTimeout) is taken over by a retry;
// when the slow one then fails, its DropIdempotency must not delete the
// row the retry now holds (nor the retry's FinishIdempotency update
// nothing): else the key is forgotten, and the same key with OTHER
// parameters starts a second run (201) instead of 422.
func TestTakenOverKeyIsNotForgotten(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 11, 28, 2, 40, 0, 0, time.UTC)}
	s := &steered{entered: make(chan int), verdict: []chan error{make(chan error), make(chan error), make(chan error)}}
	a := newAPI(t, func(c *httpapi.Config) {
		s.Starter = c.Starter
		c.Starter = s
		c.Now = clk.now
		c.AcceptTimeout = time.Minute
	})
	key := []string{"Idempotency-Key", "k-takeover"}
	slow := make(chan answer)
	go func() { slow <- a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), key...) }()
	<-s.entered // A is accepting
	clk.add(2 * time.Minute)
	retry := make(chan answer)
	go func() { retry <- a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), key...) }()
	<-s.entered                          // B took the key over
	s.verdict[0] <- checkpoint.ErrLocked // A fails (e.g. SQLite busy), drops "its" key
	t.Logf("slow request: %d", (<-slow).Status)
	s.verdict[1] <- nil // B creates the run
	b := <-retry
	expect(t, "the retry", b, http.StatusCreated)
	a.wait("report/2026-11-28")

	done := make(chan answer)
	go func() { done <- a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-29"), key...) }()
	select {
	case i := <-s.entered:
		s.verdict[i] <- nil
		got := <-done
		runs, _ := a.st.Runs(context.Background(), checkpoint.RunFilter{})
		t.Fatalf("the key with other params reached the starter and answered %d (%d runs now); want 422 idempotency_conflict", got.Status, len(runs))
	case got := <-done:
		expect(t, "the key with other params", got, http.StatusUnprocessableEntity, "idempotency_conflict")
	}
}

// A slow first request taken over by a retry that finishes first does not
// think it recorded the key: its FinishIdempotency finds the key another
// request's, and it answers 409 (retry), while the key replays the run.
func TestTakenOverKeyIsNotFinishedByTheSlowRequest(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 11, 28, 2, 40, 0, 0, time.UTC)}
	s := &steered{entered: make(chan int), verdict: []chan error{make(chan error), make(chan error)}}
	a := newAPI(t, func(c *httpapi.Config) {
		s.Starter = c.Starter
		c.Starter = s
		c.Now = clk.now
		c.AcceptTimeout = time.Minute
	})
	key := []string{"Idempotency-Key", "k-slow"}
	slow := make(chan answer)
	go func() { slow <- a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), key...) }()
	<-s.entered // A is accepting
	clk.add(2 * time.Minute)
	retry := make(chan answer)
	go func() { retry <- a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), key...) }()
	<-s.entered         // B took the key over
	s.verdict[1] <- nil // B creates the run and records the key done
	expect(t, "the retry", <-retry, http.StatusCreated)
	a.wait("report/2026-11-28")
	s.verdict[0] <- nil // A finds the run made, and the key not its own
	expect(t, "the slow request", <-slow, http.StatusConflict, "conflict", httpapi.IdempotencyHeader)
	again := a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), key...)
	expect(t, "a replay", again, http.StatusOK)
	if again.Body["replayed"] != true || again.str("id") != "report/2026-11-28" {
		t.Errorf("a replay of the key: %s; want the run, replayed", again.Raw)
	}
}
