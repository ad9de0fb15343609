package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/cmd/internal/httpapi"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// receiver is a Delivery that refuses the keys in refuse and records the
// keys it took.
type receiver struct {
	mu     sync.Mutex
	refuse map[string]bool
	got    []string
}

func (d *receiver) Deliver(ctx context.Context, m checkpoint.Message) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refuse[m.Key] {
		return errors.New("receiver answered 503")
	}
	d.got = append(d.got, m.Key)
	return nil
}

// dispatch runs one dispatcher pass over a's store: a refused delivery is
// dead at once.
func (a *testAPI) dispatch(to *receiver) runner.PassResult {
	a.t.Helper()
	res, err := (&runner.Dispatcher{Store: a.st, To: to, MaxTries: 1}).Pass(context.Background())
	if err != nil {
		a.t.Fatal(err)
	}
	return res
}

// messages are the messages of a GET /api/v1/outbox answer.
func messages(t *testing.T, what string, got answer) []map[string]any {
	t.Helper()
	expect(t, what, got, http.StatusOK)
	list, ok := got.Body["messages"].([]any)
	if !ok {
		t.Fatalf("%s: no messages list\n%s", what, got.Raw)
	}
	out := make([]map[string]any, 0, len(list))
	for _, m := range list {
		out = append(out, m.(map[string]any))
	}
	return out
}

func keysOf(ms []map[string]any) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m["key"].(string))
	}
	return out
}

func keyList(v any) []string {
	list, _ := v.([]any)
	out := []string{}
	for _, m := range list {
		out = append(out, m.(map[string]any)["key"].(string))
	}
	return out
}

// TestOutboxListsAsTheCLI lists the outbox by status, run and limit, each
// message as `outbox --json` shows it, and refuses bad queries naming
// the parameter.
func TestOutboxListsAsTheCLI(t *testing.T) {
	a := newAPI(t)
	days := []string{"2026-11-26", "2026-11-27", "2026-11-28"}
	for _, d := range days {
		expect(t, "start notify", a.do("POST", "/api/v1/runs", operateToken, start("notify", d)), http.StatusCreated)
		a.wait("notify/" + d)
	}
	all := messages(t, "the outbox", a.do("GET", "/api/v1/outbox", readToken, nil))
	if got := keysOf(all); !slices.Equal(got, []string{"notify/2026-11-26/notify", "notify/2026-11-27/notify", "notify/2026-11-28/notify"}) {
		t.Fatalf("outbox keys %v; want the three notifications, oldest first", got)
	}
	if m := all[0]; m["run_id"] != "notify/2026-11-26" || m["status"] != checkpoint.MessageQueued || m["topic"] != "day.closed" ||
		!reflect.DeepEqual(m["payload"], map[string]any{"date": "2026-11-26"}) {
		t.Errorf("first message %v; want its run, topic, status and payload as JSON", m)
	}
	rcv := &receiver{refuse: map[string]bool{"notify/2026-11-28/notify": true}}
	if res := a.dispatch(rcv); res.Sent != 2 || res.Dead != 1 {
		t.Fatalf("dispatch: %+v; want 2 sent, 1 dead", res)
	}

	// The API shows exactly what the CLI's JSON shows.
	dead := a.do("GET", "/api/v1/outbox?status=dead", readToken, nil)
	views, err := ops.ListOutbox(context.Background(), a.st, ops.OutboxQuery{Status: checkpoint.MessageDead})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(views)
	var want []any
	_ = json.Unmarshal(b, &want)
	if !reflect.DeepEqual(dead.Body["messages"], want) || len(want) != 1 {
		t.Errorf("dead messages:\n%s\nwant the CLI's view of the one dead message:\n%s", dead.Raw, b)
	}
	if m := messages(t, "dead", dead)[0]; m["tries"] != 1.0 || !strings.Contains(m["last_error"].(string), "503") {
		t.Errorf("dead message %v; want its try and error", m)
	}
	sent := messages(t, "sent of one run", a.do("GET", "/api/v1/outbox?status=sent&run=notify/2026-11-27", readToken, nil))
	if got := keysOf(sent); !slices.Equal(got, []string{"notify/2026-11-27/notify"}) || sent[0]["sent_at"] == nil {
		t.Errorf("sent messages of notify/2026-11-27: %v; want its one, with sent_at", sent)
	}
	if got := messages(t, "dead of a run without", a.do("GET", "/api/v1/outbox?status=dead&run=notify%2F2026-11-27", readToken, nil)); len(got) != 0 {
		t.Errorf("dead messages of notify/2026-11-27: %v; want none", got)
	}
	page := a.do("GET", "/api/v1/outbox?limit=2", readToken, nil)
	if got := keysOf(messages(t, "limit 2", page)); len(got) != 2 || page.Body["more"] != true {
		t.Errorf("limit 2: %s; want two and more", page.Raw)
	}
	if page = a.do("GET", "/api/v1/outbox?limit=3", readToken, nil); page.Body["more"] != nil {
		t.Errorf("limit 3 of 3: %s; want no more", page.Raw)
	}
	expect(t, "bad status", a.do("GET", "/api/v1/outbox?status=lost", readToken, nil), 400, "bad_request", "status")
	expect(t, "bad limit", a.do("GET", "/api/v1/outbox?limit=0", readToken, nil), 400, "bad_request", "limit")
	expect(t, "unknown run", a.do("GET", "/api/v1/outbox?run=notify/2030-01-01", readToken, nil), 404, "not_found", "run")
	expect(t, "no token", a.do("GET", "/api/v1/outbox", "", nil), http.StatusUnauthorized, "unauthenticated")
}

// TestOutboxRequeue refuses requeues without a token, a write role, CSRF,
// a selection or a reason, and unknown keys or runs, changing nothing;
// then requeues a dead message, audited under the token's name, and the
// next dispatcher delivers it.
func TestOutboxRequeue(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	for _, d := range []string{"2026-11-26", "2026-11-27", "2026-11-28"} {
		expect(t, "start notify", a.do("POST", "/api/v1/runs", operateToken, start("notify", d)), http.StatusCreated)
		a.wait("notify/" + d)
	}
	refusing := &receiver{refuse: map[string]bool{"notify/2026-11-27/notify": true, "notify/2026-11-28/notify": true}}
	if res := a.dispatch(refusing); res.Sent != 1 || res.Dead != 2 {
		t.Fatalf("dispatch: %+v; want 1 sent, 2 dead", res)
	}
	const path = "/api/v1/outbox/requeue"
	one := map[string]any{"keys": []string{"notify/2026-11-28/notify"}, "reason": "receiver fixed"}

	expect(t, "no token", a.do("POST", path, "", one), http.StatusUnauthorized, "unauthenticated")
	expect(t, "read token", a.do("POST", path, readToken, one), http.StatusForbidden, "forbidden")
	cookie, csrf := a.login(operateToken)
	expect(t, "cookie without CSRF", a.do("POST", path, "", one, "Cookie", cookie), http.StatusForbidden, "csrf")
	for _, c := range []struct {
		what  string
		body  any
		field string
	}{
		{"no selection", map[string]any{"reason": "x"}, "keys"},
		{"all_dead false", map[string]any{"all_dead": false, "reason": "x"}, "keys"},
		{"empty keys", map[string]any{"keys": []string{}, "reason": "x"}, "keys"},
		{"keys and run", map[string]any{"keys": []string{"notify/2026-11-28/notify"}, "run": "notify/2026-11-28", "reason": "x"}, "run"},
		{"run and all_dead", map[string]any{"run": "notify/2026-11-28", "all_dead": true, "reason": "x"}, "all_dead"},
		{"an empty key", map[string]any{"keys": []string{"notify/2026-11-28/notify", " "}, "reason": "x"}, "keys"},
		{"no reason", map[string]any{"keys": []string{"notify/2026-11-28/notify"}}, "reason"},
		{"blank reason", map[string]any{"all_dead": true, "reason": "  "}, "reason"},
	} {
		expect(t, c.what, a.do("POST", path, operateToken, c.body), http.StatusBadRequest, "bad_request", c.field)
	}
	expect(t, "unknown field", a.do("POST", path, operateToken, map[string]any{"all": true, "reason": "x"}), http.StatusBadRequest, "bad_json", "all")
	unknown := a.do("POST", path, operateToken, map[string]any{"keys": []string{"notify/2026-11-28/notify", "notify/2030-01-01/notify"}, "reason": "x"})
	expect(t, "an unknown key", unknown, http.StatusNotFound, "not_found", "keys")
	if !strings.Contains(unknown.str("error"), `"notify/2030-01-01/notify"`) {
		t.Errorf("unknown key refused with %q; want the key named", unknown.str("error"))
	}
	expect(t, "an unknown run", a.do("POST", path, operateToken, map[string]any{"run": "notify/2030-01-01", "reason": "x"}), http.StatusNotFound, "not_found", "run")
	if got := keysOf(messages(t, "dead after refusals", a.do("GET", "/api/v1/outbox?status=dead", readToken, nil))); len(got) != 2 {
		t.Fatalf("dead after the refused requeues: %v; want both still dead", got)
	}

	// One dead key and one sent: the dead one is queued again, the sent
	// one named as not dead.
	rq := a.do("POST", path, operateToken, map[string]any{"keys": []string{"notify/2026-11-28/notify", "notify/2026-11-26/notify"}, "reason": "receiver fixed"})
	expect(t, "requeue", rq, http.StatusOK)
	if got := keyList(rq.Body["requeued"]); !slices.Equal(got, []string{"notify/2026-11-28/notify"}) {
		t.Errorf("requeued %v; want the dead one\n%s", got, rq.Raw)
	}
	if got := keyList(rq.Body["not_dead"]); !slices.Equal(got, []string{"notify/2026-11-26/notify"}) {
		t.Errorf("not dead %v; want the sent one\n%s", got, rq.Raw)
	}
	if m := rq.Body["requeued"].([]any)[0].(map[string]any); m["status"] != checkpoint.MessageQueued || m["tries"] != 0.0 || m["run_id"] != "notify/2026-11-28" {
		t.Errorf("requeued message %v; want it queued with no tries", m)
	}
	if rq.str("operation") != "outbox requeue" || rq.str("operator") != "ops-alice" || rq.str("reason") != "receiver fixed" || rq.str("at") == "" ||
		!strings.Contains(rq.str("result"), "requeued 1 dead message") || !strings.Contains(rq.str("result"), "notify/2026-11-26/notify was sent at") {
		t.Errorf("requeue answered %s", rq.Raw)
	}
	queued := messages(t, "queued", a.do("GET", "/api/v1/outbox?status=queued", readToken, nil))
	if got := keysOf(queued); !slices.Equal(got, []string{"notify/2026-11-28/notify"}) {
		t.Errorf("queued after the requeue: %v; want the requeued one", got)
	}
	audits, err := a.st.Audits(ctx, "notify/2026-11-28")
	if err != nil {
		t.Fatal(err)
	}
	if len(audits) != 1 || audits[0].Operator != "ops-alice" || audits[0].Command != "outbox requeue" || audits[0].Reason != "receiver fixed" ||
		!strings.Contains(audits[0].Details, "notify/2026-11-28/notify") || !strings.Contains(audits[0].Details, "via HTTP API, request "+rq.Header.Get("X-Request-Id")) {
		t.Errorf("audit of notify/2026-11-28: %+v; want the requeue under the token's name, via this request", audits)
	}
	if au, _ := a.st.Audits(ctx, "notify/2026-11-26"); len(au) != 0 {
		t.Errorf("the run of the sent message got audit records %+v; want none", au)
	}

	// The next dispatcher delivers it.
	fixed := &receiver{}
	if res := a.dispatch(fixed); res.Sent != 1 || res.Dead != 0 || !slices.Equal(fixed.got, []string{"notify/2026-11-28/notify"}) {
		t.Errorf("dispatch after the requeue: %+v, delivered %v; want the requeued message sent", res, fixed.got)
	}
	sent := messages(t, "sent of the run", a.do("GET", "/api/v1/outbox?run=notify/2026-11-28", readToken, nil))
	if len(sent) != 1 || sent[0]["status"] != checkpoint.MessageSent {
		t.Errorf("notify/2026-11-28's messages after delivery: %v; want it sent", sent)
	}

	// A run's dead messages, through a cookie session with its CSRF token.
	byRun := a.do("POST", path, "", map[string]any{"run": "notify/2026-11-27", "reason": "certificate renewed"},
		"Cookie", cookie, httpapi.CSRFHeader, csrf, "Sec-Fetch-Site", "same-origin")
	expect(t, "requeue a run", byRun, http.StatusOK)
	if got := keyList(byRun.Body["requeued"]); !slices.Equal(got, []string{"notify/2026-11-27/notify"}) || byRun.str("operator") != "ops-alice" {
		t.Errorf("requeue of a run answered %s", byRun.Raw)
	}
	// Nothing dead is left: all_dead requeues nothing, with empty lists.
	none := a.do("POST", path, operateToken, map[string]any{"all_dead": true, "reason": "sweep"})
	expect(t, "requeue all dead", none, http.StatusOK)
	if r, ok := none.Body["requeued"].([]any); !ok || len(r) != 0 || none.str("result") != "no dead messages; nothing requeued" {
		t.Errorf("requeue of nothing answered %s", none.Raw)
	}
	if nd, ok := none.Body["not_dead"].([]any); !ok || len(nd) != 0 {
		t.Errorf("requeue of nothing: not_dead %s; want []", none.Raw)
	}
}
