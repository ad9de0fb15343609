package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/cmd/internal/httpapi"
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

// takenOverKey starts a slow request A with Idempotency-Key key, held by
// the steered starter (with verdicts for that many requests), lets the
// API's clock pass its AcceptTimeout, and starts its retry B with the same
// key, which takes the key over and is held in its turn. A's and B's
// answers come on slow and retry once their verdicts are given.
func takenOverKey(t *testing.T, key string, verdicts int) (a *testAPI, s *steered, header []string, slow, retry chan answer) {
	t.Helper()
	clk := &fakeClock{t: time.Date(2026, 11, 28, 2, 40, 0, 0, time.UTC)}
	s = &steered{entered: make(chan int)}
	for range verdicts {
		s.verdict = append(s.verdict, make(chan error))
	}
	a = newAPI(t, func(c *httpapi.Config) {
		s.Starter = c.Starter
		c.Starter = s
		c.Now = clk.now
		c.AcceptTimeout = time.Minute
	})
	header = []string{"Idempotency-Key", key}
	slow, retry = make(chan answer), make(chan answer)
	go func() { slow <- a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), header...) }()
	<-s.entered // A is accepting
	clk.add(2 * time.Minute)
	go func() { retry <- a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), header...) }()
	<-s.entered // B took the key over
	return a, s, header, slow, retry
}

// A slow first request (past AcceptTimeout) is taken over by a retry;
// when the slow one then fails, its DropIdempotency must not delete the
// row the retry now holds (nor the retry's FinishIdempotency update
// nothing): else the key is forgotten, and the same key with OTHER
// parameters starts a second run (201) instead of 422.
func TestTakenOverKeyIsNotForgotten(t *testing.T) {
	a, s, key, slow, retry := takenOverKey(t, "k-takeover", 3)
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
	a, s, key, slow, retry := takenOverKey(t, "k-slow", 2)
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

// hangup holds the first Start until the server has seen its client hang
// up (the request's own context ended), then fails it or starts as usual.
type hangup struct {
	httpapi.Starter
	reqCtx  chan context.Context // the first request's context, as the server gave it
	entered chan struct{}
	fail    error
	once    sync.Once
}

func (h *hangup) Start(ctx context.Context, req runner.Request) (httpapi.Started, error) {
	first := false
	h.once.Do(func() { first = true })
	if first {
		rc := <-h.reqCtx
		h.entered <- struct{}{}
		<-rc.Done()
		if h.fail != nil {
			return httpapi.Started{}, h.fail
		}
	}
	return h.Starter.Start(ctx, req)
}

// settleSeen signals each FinishIdempotency and DropIdempotency the
// handler made, with its error.
type settleSeen struct {
	checkpoint.Backend
	settled chan error
}

func (d settleSeen) FinishIdempotency(ctx context.Context, k checkpoint.IdempotencyKey, at time.Time) error {
	err := d.Backend.FinishIdempotency(ctx, k, at)
	d.settled <- err
	return err
}

func (d settleSeen) DropIdempotency(ctx context.Context, k checkpoint.IdempotencyKey) error {
	err := d.Backend.DropIdempotency(ctx, k)
	d.settled <- err
	return err
}

// A client that hangs up while its request is being accepted must not
// leave the key "accepting" (Drop/Finish on the cancelled request
// context), which would make every retry 409 "still being accepted" for
// AcceptTimeout although no request is being accepted; nor may the start
// itself be cut short.
func TestHangUpDoesNotLeaveKeyAccepting(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail error // what the start does once the client is gone
		want int   // the retry's answer
	}{
		{"start fails", checkpoint.ErrLocked, http.StatusCreated},
		{"start goes on", nil, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &hangup{reqCtx: make(chan context.Context, 1), entered: make(chan struct{}, 1), fail: tc.fail}
			settled := make(chan error, 1)
			a := newAPI(t, func(c *httpapi.Config) {
				h.Starter = c.Starter
				c.Starter = h
				c.Store = settleSeen{c.Store, settled}
			})
			// The first request goes through a front that hands its
			// context to the starter, to know when the server saw the
			// hang-up.
			var once sync.Once
			front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				once.Do(func() { h.reqCtx <- r.Context() })
				a.srv.Config.Handler.ServeHTTP(w, r)
			}))
			defer front.Close()
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, "POST", front.URL+"/api/v1/runs", jsonBody(t, start("report", "2026-11-28")))
			req.Header.Set("Authorization", "Bearer "+operateToken)
			req.Header.Set("Idempotency-Key", "k-hangup")
			go func() { <-h.entered; cancel() }() // the client hangs up mid-accept
			_, _ = http.DefaultClient.Do(req)
			if err := <-settled; err != nil {
				t.Fatalf("the first request's finish or drop, after its client hung up: %v; want done", err)
			}
			if tc.fail == nil {
				a.wait("report/2026-11-28") // the run it claimed executes
			}
			got := a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), "Idempotency-Key", "k-hangup")
			runs, _ := a.st.Runs(context.Background(), checkpoint.RunFilter{})
			if got.Status != tc.want {
				t.Fatalf("retry after the first request ended (%d runs recorded): %d %s; want %d: no request is being accepted", len(runs), got.Status, got.Raw, tc.want)
			}
			if tc.fail != nil {
				<-settled
				a.wait("report/2026-11-28")
			} else if got.Body["replayed"] != true {
				t.Errorf("retry after the first request made the run: %s; want it replayed", got.Raw)
			}
		})
	}
}

func jsonBody(t *testing.T, v any) io.Reader {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b)
}

// bobToken is a second operate token, of a caller other than ops-alice.
const bobToken = "bob-token-9e2d7c4b1a8f3e6d0c5b9a2f7e4d1c8b"

// twoOperators gives the server a second operate token, ops-bob.
func twoOperators(t *testing.T) option {
	tokens, err := httpapi.ParseTokens([]byte("reader:read:" + readToken + "\nops-alice:operate:" + operateToken + "\nops-bob:operate:" + bobToken + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return func(c *httpapi.Config) { c.Tokens = tokens }
}

// Two callers that pick the same Idempotency-Key make two independent
// requests: neither is answered with the other's run, nor refused, nor
// shown the other's parameters. Bob signs in through the cookie login,
// Alice sends her bearer token; Bob's bearer token is Bob's scope too.
func TestIdempotencyKeyIsScopedPerCaller(t *testing.T) {
	a := newAPI(t, twoOperators(t))
	cookie, csrf := a.login(bobToken)
	bob := []string{"Cookie", cookie, httpapi.CSRFHeader, csrf, "Sec-Fetch-Site", "same-origin"}
	key := []string{"Idempotency-Key", "nightly"}
	asBob := func(body any, hdr ...string) answer {
		return a.do("POST", "/api/v1/runs", "", body, append(append([]string{}, bob...), hdr...)...)
	}

	alice := a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28", "note", "alice's secret note"), key...)
	expect(t, "alice's first request", alice, http.StatusCreated)
	a.wait("report/2026-11-28")
	// Bob's request with the same key and another body is his own first
	// request: a run of his, not 422 naming Alice's parameters.
	b := asBob(start("report", "2026-11-29"), key...)
	expect(t, "bob's request with alice's key", b, http.StatusCreated)
	if b.str("id") != "report/2026-11-29" || b.Body["replayed"] == true || strings.Contains(b.Raw, "secret") {
		t.Fatalf("bob's request with alice's key answered %s; want his own run, created, not replayed", b.Raw)
	}
	a.wait("report/2026-11-29")

	// Each replays to its own run.
	for _, c := range []struct {
		who  string
		resp answer
		run  string
	}{
		{"alice", a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28", "note", "alice's secret note"), key...), "report/2026-11-28"},
		{"bob (cookie)", asBob(start("report", "2026-11-29"), key...), "report/2026-11-29"},
		{"bob (bearer)", a.do("POST", "/api/v1/runs", bobToken, start("report", "2026-11-29"), key...), "report/2026-11-29"},
	} {
		expect(t, c.who+"'s replay", c.resp, http.StatusOK)
		if c.resp.str("id") != c.run || c.resp.Body["replayed"] != true {
			t.Errorf("%s's replay answered %s; want %s, replayed", c.who, c.resp.Raw, c.run)
		}
	}
	// Within one caller the semantics are unchanged: Bob's key with
	// another body is refused, naming Bob's first request, not Alice's.
	other := a.do("POST", "/api/v1/runs", bobToken, start("report", "2026-11-30"), key...)
	expect(t, "bob's key with another body", other, http.StatusUnprocessableEntity, "idempotency_conflict", httpapi.IdempotencyHeader)
	if msg := other.str("error"); !strings.Contains(msg, `"date":"2026-11-29"`) || strings.Contains(msg, "2026-11-28") || strings.Contains(msg, "secret") {
		t.Errorf("bob's 422 says %q; want it to name his first request (2026-11-29) and nothing of alice's", msg)
	}

	// The same key and the same request from another caller: that
	// caller's first use (the run exists: 200, neither created nor
	// replayed), replayed to it from then on.
	same := []string{"Idempotency-Key", "same-request"}
	expect(t, "alice, same-request", a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-12-01"), same...), http.StatusCreated)
	a.wait("report/2026-12-01")
	first := a.do("POST", "/api/v1/runs", bobToken, start("report", "2026-12-01"), same...)
	expect(t, "bob, same-request", first, http.StatusOK)
	if first.Body["replayed"] == true || first.Body["created"] != false || first.str("id") != "report/2026-12-01" {
		t.Errorf("bob's first use of a key alice used for the same request answered %s; want the run, not created, not replayed", first.Raw)
	}
	if again := a.do("POST", "/api/v1/runs", bobToken, start("report", "2026-12-01"), same...); again.Body["replayed"] != true {
		t.Errorf("bob's second use of the key answered %s; want replayed", again.Raw)
	}

	// The keys are stored under each caller's token name.
	for who, run := range map[string]string{"token:ops-alice": "report/2026-11-28", "token:ops-bob": "report/2026-11-29"} {
		rec, begun, err := a.st.BeginIdempotency(context.Background(), checkpoint.IdempotencyKey{Scope: who, Key: "nightly", RequestHash: "probe",
			Job: "report", Params: []byte("{}"), RunID: "report/probe", CreatedAt: time.Now()}, time.Time{})
		if err != nil || begun || rec.RunID != run || rec.State != checkpoint.IdempotencyDone {
			t.Errorf("key nightly in scope %s: %+v, begun %v, %v; want done, run %s", who, rec, begun, err, run)
		}
	}
	if info, _ := a.st.Run(context.Background(), "report/2026-11-28"); len(info.Attempts) != 1 {
		t.Errorf("alice's run has %d attempts; want 1", len(info.Attempts))
	}
}

// While one caller's first request with a key is being accepted, another
// caller's request with that key is not held up (409) behind it.
func TestIdempotencyKeyAcceptingIsPerCaller(t *testing.T) {
	s := &steered{entered: make(chan int), verdict: []chan error{make(chan error), make(chan error)}}
	a := newAPI(t, twoOperators(t), func(c *httpapi.Config) {
		s.Starter = c.Starter
		c.Starter = s
	})
	key := []string{"Idempotency-Key", "k-shared"}
	slow := make(chan answer)
	go func() { slow <- a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), key...) }()
	<-s.entered // Alice's request is accepting
	bob := make(chan answer)
	go func() { bob <- a.do("POST", "/api/v1/runs", bobToken, start("report", "2026-11-29"), key...) }()
	select {
	case i := <-s.entered:
		s.verdict[i] <- nil
	case got := <-bob:
		s.verdict[0] <- nil
		<-slow
		t.Fatalf("bob's request with the key alice's request holds answered %d %s before reaching the starter; want it started", got.Status, got.Raw)
	}
	expect(t, "bob's request", <-bob, http.StatusCreated)
	a.wait("report/2026-11-29")
	// Alice's own retry meanwhile is still held up by her first request.
	expect(t, "alice's retry", a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), key...), http.StatusConflict, "conflict")
	s.verdict[0] <- nil
	expect(t, "alice's request", <-slow, http.StatusCreated)
	a.wait("report/2026-11-28")
}

// A key recorded before keys were scoped (the empty scope) is nobody's:
// it is never replayed to a caller, nor its parameters shown.
func TestLegacyIdempotencyKeyReplaysToNobody(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	rec, begun, err := a.st.BeginIdempotency(ctx, checkpoint.IdempotencyKey{Key: "old", RequestHash: "h", Job: "report",
		Params: []byte(`{"date":"2020-01-01","note":"someone's secret"}`), RunID: "report/2020-01-01", CreatedAt: time.Now()}, time.Time{})
	if err != nil || !begun {
		t.Fatalf("record a legacy key: %v, %v", begun, err)
	}
	if err := a.st.FinishIdempotency(ctx, rec, time.Now()); err != nil {
		t.Fatal(err)
	}
	got := a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), "Idempotency-Key", "old")
	expect(t, "a caller's request with a legacy key", got, http.StatusCreated)
	if got.str("id") != "report/2026-11-28" || strings.Contains(got.Raw, "secret") {
		t.Errorf("a caller's request with a legacy key answered %s; want its own run", got.Raw)
	}
	a.wait("report/2026-11-28")
}

// Prune deletes a pruned run's Idempotency-Keys: a start with the old
// key is then answered by the run key (the tombstone, created false, not
// a replay), and the key is not recorded again for the next prune to miss.
func TestPrunedRunsKeyIsAnsweredByItsRunKey(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	key := []string{"Idempotency-Key", "k-pruned"}
	expect(t, "the first start", a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), key...), http.StatusCreated)
	a.wait("report/2026-11-28")
	if got := a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), key...); got.Status != http.StatusOK || got.Body["replayed"] != true {
		t.Fatalf("a replay before the prune answered %d %s; want 200, replayed", got.Status, got.Raw)
	}
	res, err := a.st.Prune(ctx, checkpoint.Audit{At: time.Now(), Operator: "test", Command: "prune", Reason: "retention"}, time.Now().Add(time.Hour), false)
	if err != nil || len(res.Runs) != 1 || res.IdempotencyKeys != 1 {
		t.Fatalf("prune = %+v, %v; want the run and its one key", res, err)
	}
	for range 2 {
		got := a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"), key...)
		expect(t, "a start with the pruned run's key", got, http.StatusOK)
		if got.str("id") != "report/2026-11-28" || got.str("status") != checkpoint.RunSucceeded || got.Body["created"] != false || got.Body["replayed"] != nil {
			t.Errorf("a start with the pruned run's key answered %s; want its run key's tombstone, succeeded, not created, not replayed", got.Raw)
		}
	}
	rec, begun, err := a.st.BeginIdempotency(ctx, checkpoint.IdempotencyKey{Scope: "token:ops-alice", Key: "k-pruned", RequestHash: "x",
		Job: "report", Params: []byte(`{}`), RunID: "report/x", CreatedAt: time.Now()}, time.Time{})
	if err != nil || !begun {
		t.Errorf("the pruned run's key after the starts: %+v, begun %v, %v; want not recorded again", rec, begun, err)
	}
}
