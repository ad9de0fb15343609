package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/cmd/internal/httpapi"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// Tokens of the test server.
const (
	readToken    = "read-token-7f3a9c2e51b8d406e9a1c3f5b7d2e8a0"
	operateToken = "operate-token-4c8e1a7f3b9d2056c4e8a1f7b3d9e205"
)

var accounts = checkpoint.Table{Name: "accounts", Key: "id", Value: "balance", Version: "version"}

type dayParams struct {
	Date string `param:"date,key" format:"date"`
	Note string `param:"note" help:"free text"`
	Fail bool   `param:"fail" help:"fail the load step"`
}

type xfer struct {
	ID, From, To string
	Amount       int64
}

// registry has report (one effect step, then a step that fails when
// asked), settle (a batch step moving money, T3 rejected) and notify (one
// notification in the outbox).
func registry() *jobs.Registry {
	var reg jobs.Registry
	reg.MustRegister(
		jobs.Define("report", func(ctx context.Context, run *steps.Run, p dayParams) error {
			if _, err := steps.Apply(ctx, run, steps.ID("fee"), steps.Target{Table: accounts}, func(ctx context.Context, e *steps.Effects) (int, error) {
				e.Add("a", -5)
				e.Add("b", 5)
				return 1, nil
			}); err != nil {
				return err
			}
			_, err := steps.Do(ctx, run, steps.ID("load"), func(ctx context.Context) (int, error) {
				if p.Fail {
					return 0, errors.New("the ledger is closed")
				}
				return 42, nil
			})
			return err
		}),
		jobs.Define("settle", func(ctx context.Context, run *steps.Run, p dayParams) error {
			items := []xfer{{"T1", "a", "b", 10}, {"T2", "b", "a", 5}, {"T3", "a", "b", 7}, {"T4", "a", "b", 1}}
			_, err := steps.ForEach(ctx, run, "post", steps.Slice(items, func(x xfer) string { return x.ID }),
				func(ctx context.Context, x xfer, e *steps.Effects) (int64, error) {
					if x.ID == "T3" {
						return 0, steps.Reject(errors.New("account a is frozen for T3"))
					}
					e.Add("acct:"+x.From, -x.Amount)
					e.Add("acct:"+x.To, x.Amount)
					return x.Amount, nil
				}, steps.WithTarget(steps.Target{Table: accounts}), steps.ChunkSize(2))
			return err
		}),
		jobs.Define("notify", func(ctx context.Context, run *steps.Run, p dayParams) error {
			return steps.Notify(ctx, run, "notify", "day.closed", map[string]string{"date": p.Date})
		}),
		payJob,
	)
	return &reg
}

// testAPI is a server on a real store of the suite's kind.
type testAPI struct {
	t     *testing.T
	st    checkpoint.Backend
	loc   string
	srv   *httptest.Server
	api   *httpapi.Server
	local *httpapi.Local
	mu    sync.Mutex
	ended map[string]chan struct{}
}

type option func(*httpapi.Config)

func newAPI(t *testing.T, opts ...option) *testAPI {
	t.Helper()
	st, loc := checkpointtest.OpenNew(t)
	checkpointtest.CreateTable(t, loc, accounts, map[string]int64{"a": 100, "b": 0, "acct:a": 100, "acct:b": 0})
	return newAPIOn(t, st, loc, opts...)
}

// newAPIOn starts a server on st, as a restarted process would.
func newAPIOn(t *testing.T, st checkpoint.Backend, loc string, opts ...option) *testAPI {
	t.Helper()
	reg := registry()
	r, err := runner.New(runner.Config{Store: st, Jobs: reg})
	if err != nil {
		t.Fatal(err)
	}
	a := &testAPI{t: t, st: st, loc: loc, ended: map[string]chan struct{}{}}
	a.local = httpapi.NewLocal(r)
	a.local.OnDone = func(res runner.Result, err error) { close(a.endOf(res.RunID)) }
	tokens, err := httpapi.ParseTokens([]byte("# test tokens\nreader:read:" + readToken + "\nops-alice:operate:" + operateToken + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := httpapi.Config{Store: st, Jobs: reg, Starter: a.local, Tokens: tokens}
	for _, o := range opts {
		o(&cfg)
	}
	api, err := httpapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.api, a.srv = api, httptest.NewServer(api)
	t.Cleanup(func() {
		a.srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a.local.Shutdown(ctx)
	})
	return a
}

// endOf is the channel closed when the attempt the API started of runID
// ends (one at a time per run in these tests).
func (a *testAPI) endOf(runID string) chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ended[runID] == nil {
		a.ended[runID] = make(chan struct{})
	}
	return a.ended[runID]
}

// wait waits for the attempt of runID the API started to end, and forgets
// it (so the next one can be waited for).
func (a *testAPI) wait(runID string) {
	a.t.Helper()
	select {
	case <-a.endOf(runID):
	case <-time.After(30 * time.Second):
		a.t.Fatalf("the run %s the API started did not end within 30s", runID)
	}
	a.mu.Lock()
	delete(a.ended, runID)
	a.mu.Unlock()
}

// answer is a decoded response.
type answer struct {
	Status int
	Header http.Header
	Body   map[string]any
	Raw    string
}

func (r answer) str(k string) string { s, _ := r.Body[k].(string); return s }

// do sends a request with token (none if "") and a JSON body (a string
// is sent as it is).
func (a *testAPI) do(method, path, token string, body any, hdr ...string) answer {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, a.srv.URL+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return a.send(req)
}

func (a *testAPI) send(req *http.Request) answer {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Errorf("%s %s: %v", req.Method, req.URL, err)
		return answer{}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	out := answer{Status: resp.StatusCode, Header: resp.Header, Raw: string(raw)}
	_ = json.Unmarshal(raw, &out.Body)
	return out
}

// expect fails the test unless the answer has the status (and, if given,
// the error code and field).
func expect(t *testing.T, what string, got answer, status int, codeField ...string) {
	t.Helper()
	if got.Status != status {
		t.Fatalf("%s: status %d; want %d\n%s", what, got.Status, status, got.Raw)
	}
	if len(codeField) > 0 && got.str("code") != codeField[0] {
		t.Fatalf("%s: code %q; want %q\n%s", what, got.str("code"), codeField[0], got.Raw)
	}
	if len(codeField) > 1 && got.str("field") != codeField[1] {
		t.Fatalf("%s: field %q; want %q\n%s", what, got.str("field"), codeField[1], got.Raw)
	}
	if status >= 400 && got.str("request_id") == "" {
		t.Fatalf("%s: error without a request_id: %s", what, got.Raw)
	}
}

func start(job, date string, extra ...string) map[string]any {
	p := map[string]any{"date": date}
	for i := 0; i+1 < len(extra); i += 2 {
		p[extra[i]] = extra[i+1]
	}
	return map[string]any{"job": job, "params": p}
}

// login logs in with token through the API and returns the session cookie
// ("name=ID", for a Cookie header) and its CSRF token.
func (a *testAPI) login(token string, hdr ...string) (cookie, csrf string) {
	a.t.Helper()
	got := a.do("POST", "/api/v1/login", "", map[string]any{"token": token}, hdr...)
	expect(a.t, "login", got, http.StatusOK)
	cookie, _, _ = strings.Cut(got.Header.Get("Set-Cookie"), ";")
	return cookie, got.str("csrf_token")
}
