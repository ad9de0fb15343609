package cmd

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// testRegistryCLI returns a runner of command lines on db (after --db)
// through Execute with testRegistry, the test jobs with notifications.
func testRegistryCLI(t *testing.T, db string) func(args ...string) opsOut {
	return func(args ...string) opsOut {
		t.Helper()
		var out, errb syncBuffer
		args = append([]string{"--db", db}, args...)
		code := Execute(context.Background(), testRegistry(), args, &out, &errb)
		return opsOut{args: args, code: code, stdout: out.String(), stderr: errb.String()}
	}
}

// TestOutboxDeadLetters runs three dispatch commands at once over one
// database and a local webhook that refuses one run's notification: each
// message is delivered once with its key, the refused one is dead after
// --max-tries and `outbox --status dead` lists it.
func TestOutboxDeadLetters(t *testing.T) {
	t.Parallel()
	db, _ := testFiles(t)
	run := testRegistryCLI(t, db)
	keys := []string{"a", "b", "c", "d", "e"}
	for _, k := range keys {
		if o := run("run", "outbox", "-p", "key="+k); o.code != ExitOK {
			t.Fatalf("run outbox: exit %d\n%s", o.code, o)
		}
	}
	var (
		mu     sync.Mutex
		counts = map[string]int{}
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		counts[key]++
		mu.Unlock()
		if key == "outbox/c/notify" {
			http.Error(w, "account closed", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()

	var wg sync.WaitGroup
	outs := make([]opsOut, 3)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = run("dispatch", "--to", srv.URL, "--max-tries", "1", "--json")
		}()
	}
	wg.Wait()
	var total dispatchView
	for _, o := range outs {
		var v dispatchView
		if o.code != ExitOK || json.Unmarshal([]byte(o.stdout), &v) != nil || v.Error != "" {
			t.Fatalf("dispatch: exit %d, want 0 and its counts\n%s", o.code, o)
		}
		total.Sent, total.Failed, total.Dead = total.Sent+v.Sent, total.Failed+v.Failed, total.Dead+v.Dead
	}
	if total != (dispatchView{Sent: 4, Dead: 1}) {
		t.Errorf("three dispatchers counted %+v in all; want 4 sent, 1 dead", total)
	}
	mu.Lock()
	for _, k := range keys {
		if n := counts["outbox/"+k+"/notify"]; n != 1 {
			t.Errorf("webhook received outbox/%s/notify %d times; want once", k, n)
		}
	}
	mu.Unlock()

	o := run("outbox", "--status", "dead", "--json")
	var dead []struct {
		RunID     string `json:"run_id"`
		Key       string `json:"key"`
		Status    string `json:"status"`
		Tries     int    `json:"tries"`
		LastError string `json:"last_error"`
	}
	if o.code != ExitOK || json.Unmarshal([]byte(o.stdout), &dead) != nil {
		t.Fatalf("outbox --status dead --json: exit %d\n%s", o.code, o)
	}
	if len(dead) != 1 || dead[0].Key != "outbox/c/notify" || dead[0].RunID != "outbox/c" || dead[0].Status != checkpoint.MessageDead ||
		dead[0].Tries != 1 || !strings.Contains(dead[0].LastError, "500") {
		t.Errorf("dead messages = %+v; want outbox/c/notify after 1 try with the webhook's answer", dead)
	}
	o = run("outbox", "--status", "dead")
	if o.code != ExitOK || !strings.Contains(o.stdout, "NOTIFICATION") || !strings.Contains(o.stdout, "outbox/c/notify") ||
		strings.Contains(o.stdout, "outbox/a/notify") || !strings.Contains(o.stdout, "answered 500") {
		t.Errorf("outbox --status dead: want a table of the one dead message with its error\n%s", o)
	}
	if o = run("outbox"); o.code != ExitOK || strings.Count(o.stdout, "/notify") != len(keys) {
		t.Errorf("outbox: want every message listed\n%s", o)
	}
	if o = run("outbox", "--run", "outbox/b"); o.code != ExitOK || strings.Count(o.stdout, "/notify") != 1 || !strings.Contains(o.stdout, "outbox/b/notify") {
		t.Errorf("outbox --run outbox/b: want its one message only\n%s", o)
	}
	if o = run("outbox", "--run", "outbox/b", "--status", "dead"); o.code != ExitOK || o.stdout != "no dead messages of run outbox/b in the outbox\n" {
		t.Errorf("outbox --run outbox/b --status dead: want none\n%s", o)
	}
	if o = run("outbox", "--run", "outbox/nope"); o.code != ExitUsage || !strings.Contains(o.stderr, "outbox/nope") || !strings.Contains(o.stderr, "runs` lists the runs") {
		t.Errorf("outbox --run outbox/nope: want exit 2 naming the run and the hint\n%s", o)
	}
	if o = run("outbox", "--status", "queued"); o.code != ExitOK || o.stdout != "no queued messages in the outbox\n" {
		t.Errorf("outbox --status queued: want none\n%s", o)
	}
	if o = run("outbox", "--status", "sent", "--limit", "2"); o.code != ExitOK || strings.Count(o.stdout, "/notify") != 2 || !strings.Contains(o.stderr, "raise --limit") {
		t.Errorf("outbox --status sent --limit 2: want two and a note\n%s", o)
	}
	// Dead is final: another dispatcher does not try it again.
	if o = run("dispatch", "--to", srv.URL); o.code != ExitOK || !strings.Contains(o.stderr, "dispatched: 0 sent, 0 failed") {
		t.Errorf("dispatch after: want nothing to do\n%s", o)
	}
	if o = run("outbox", "--status", "lost"); o.code != ExitUsage {
		t.Errorf("outbox --status lost: exit %d, want 2\n%s", o.code, o)
	}
}

// TestOutboxRequeue dead-letters two runs' notifications at a refusing
// webhook, then fixes it and requeues them: refusals name what is wrong
// (no selection, an unknown key, an unknown run, a sent message) and
// change nothing they should not, the requeued messages are delivered once
// more each, and every run touched records the operation in its audit.
func TestOutboxRequeue(t *testing.T) {
	t.Parallel()
	db, _ := testFiles(t)
	run := testRegistryCLI(t, db)
	for _, k := range []string{"a", "b", "c"} {
		if o := run("run", "outbox", "-p", "key="+k); o.code != ExitOK {
			t.Fatalf("run outbox: exit %d\n%s", o.code, o)
		}
	}
	var (
		mu        sync.Mutex
		broken    = true
		tries     = map[string]int{}
		delivered = map[string]int{}
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		defer mu.Unlock()
		tries[key]++
		if broken && key != "outbox/c/notify" {
			http.Error(w, "certificate expired", http.StatusBadGateway)
			return
		}
		delivered[key]++
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	if o := run("dispatch", "--to", srv.URL, "--max-tries", "1"); o.code != ExitOK || !strings.Contains(o.stderr, "dispatched: 1 sent, 0 failed (retried later), 2 dead") {
		t.Fatalf("dispatch at the broken receiver: want 1 sent, 2 dead\n%s", o)
	}
	deadKeys := func() []string {
		t.Helper()
		o := run("outbox", "--status", "dead", "--json")
		var ms []ops.OutboxView
		if o.code != ExitOK || json.Unmarshal([]byte(o.stdout), &ms) != nil {
			t.Fatalf("outbox --status dead --json: exit %d\n%s", o.code, o)
		}
		var keys []string
		for _, m := range ms {
			keys = append(keys, m.Key)
		}
		return keys
	}
	bothDead := []string{"outbox/a/notify", "outbox/b/notify"}
	if got := deadKeys(); !slices.Equal(got, bothDead) {
		t.Fatalf("dead = %v; want %v", got, bothDead)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"outbox", "requeue", "--reason", "fixed"}, "exactly one of KEY..., --run RUN_ID or --all-dead (none given)"},
		{[]string{"outbox", "requeue", "outbox/a/notify", "--all-dead", "--reason", "fixed"}, "(more than one given)"},
		{[]string{"outbox", "requeue", "--run", "outbox/a", "--all-dead", "--reason", "fixed"}, "(more than one given)"},
		{[]string{"outbox", "requeue", "outbox/a/notify"}, "--reason"},
		{[]string{"outbox", "requeue", "outbox/a/notify", "--reason", "  "}, "--reason is empty; say what was fixed"},
		{[]string{"outbox", "requeue", "outbox/a/notify", "outbox/zz/notify", "--reason", "fixed"},
			`no message "outbox/zz/notify" in the outbox; nothing was requeued`},
		{[]string{"outbox", "requeue", "--run", "outbox/zz", "--reason", "fixed"}, `no run "outbox/zz"`},
	} {
		o := run(c.args...)
		if o.code != ExitUsage || !strings.Contains(o.stderr, c.want) || o.stdout != "" {
			t.Errorf("want exit 2 and %q on stderr, nothing on stdout\n%s", c.want, o)
		}
		if strings.Contains(o.stderr, "zz/notify") && !strings.Contains(o.stderr, "outbox --status dead` lists the dead messages") {
			t.Errorf("an unknown key: want the hint to list the dead messages\n%s", o)
		}
	}
	if got := deadKeys(); !slices.Equal(got, bothDead) {
		t.Fatalf("dead after the refused requeues = %v; want %v still (nothing requeued)", got, bothDead)
	}

	mu.Lock()
	broken = false
	mu.Unlock()
	// A sent message named with a dead one: the dead one is requeued,
	// the sent one named and left alone, exit 5.
	o := run("outbox", "requeue", "outbox/a/notify", "outbox/c/notify", "--reason", "certificate renewed", "--operator", "alice")
	if o.code != ExitOperator || !strings.Contains(o.stdout, "requeued 1 dead message, due now") || !strings.Contains(o.stdout, "outbox/a/notify") ||
		!strings.Contains(o.stdout, "last error: webhook") || strings.Contains(o.stdout, "outbox/c/notify") ||
		!strings.Contains(o.stderr, "outbox/c/notify was sent at ") || !strings.Contains(o.stderr, "it is not dead, so it is not sent again") {
		t.Errorf("requeue of a dead and a sent message: want exit 5, the dead one requeued, the sent one named on stderr\n%s", o)
	}
	o = run("outbox", "requeue", "outbox/a/notify", "--reason", "again", "--operator", "alice")
	if o.code != ExitOperator || o.stdout != "" || !strings.Contains(o.stderr, "outbox/a/notify is queued, not dead (0 failed tries so far)") {
		t.Errorf("requeue of a queued message: want exit 5 naming it queued\n%s", o)
	}
	o = run("outbox", "requeue", "--run", "outbox/b", "--reason", "certificate renewed", "--operator", "alice", "--json")
	var v struct {
		Operation string           `json:"operation"`
		Requeued  []ops.OutboxView `json:"requeued"`
		NotDead   []ops.OutboxView `json:"not_dead"`
		Operator  string           `json:"operator"`
		Reason    string           `json:"reason"`
	}
	if o.code != ExitOK || json.Unmarshal([]byte(o.stdout), &v) != nil {
		t.Fatalf("requeue --run --json: exit %d, want 0 and its outcome\n%s", o.code, o)
	}
	if v.Operation != "outbox requeue" || len(v.Requeued) != 1 || v.Requeued[0].Key != "outbox/b/notify" || v.Requeued[0].RunID != "outbox/b" ||
		v.Requeued[0].Status != checkpoint.MessageQueued || v.Requeued[0].Tries != 0 || v.NotDead == nil || len(v.NotDead) != 0 ||
		v.Operator != "alice" || v.Reason != "certificate renewed" {
		t.Errorf("requeue --run --json = %+v; want b's message queued with no tries, not_dead [], alice's reason", v)
	}
	if got := deadKeys(); len(got) != 0 {
		t.Errorf("dead after the requeues = %v; want none", got)
	}

	if o := run("dispatch", "--to", srv.URL, "--max-tries", "1"); o.code != ExitOK || !strings.Contains(o.stderr, "dispatched: 2 sent, 0 failed (retried later)\n") {
		t.Errorf("dispatch after the requeue: want the two requeued ones sent\n%s", o)
	}
	if o := run("dispatch", "--to", srv.URL); o.code != ExitOK || !strings.Contains(o.stderr, "dispatched: 0 sent, 0 failed") {
		t.Errorf("dispatch again: want nothing to do\n%s", o)
	}
	mu.Lock()
	for k, want := range map[string][2]int{"outbox/a/notify": {2, 1}, "outbox/b/notify": {2, 1}, "outbox/c/notify": {1, 1}} {
		if got := [2]int{tries[k], delivered[k]}; got != want {
			t.Errorf("%s: %d tries, %d delivered; want %d and %d (delivered once, after the requeue)", k, got[0], got[1], want[0], want[1])
		}
	}
	mu.Unlock()
	if o := run("outbox", "requeue", "--all-dead", "--reason", "sweep"); o.code != ExitOK || o.stdout != "no dead messages in the outbox; nothing requeued\n" {
		t.Errorf("requeue --all-dead with none: want exit 0 saying so\n%s", o)
	}

	for runID, want := range map[string][]string{
		"outbox/a": {"alice|certificate renewed|requeued dead message outbox/a/notify"},
		"outbox/b": {"alice|certificate renewed|requeued dead message outbox/b/notify"},
		"outbox/c": nil, // its message was sent, never requeued
	} {
		var got []string
		for _, a := range show(t, db, runID).Audit {
			if a.Command == "outbox requeue" {
				got = append(got, a.Operator+"|"+a.Reason+"|"+a.Details)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("requeues in the audit of %s = %q; want %q", runID, got, want)
		}
	}
}
