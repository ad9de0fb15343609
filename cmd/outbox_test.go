package cmd

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// TestOutboxDeadLetters runs three dispatch commands at once over one
// database and a local webhook that refuses one run's notification: each
// message is delivered once with its key, the refused one is dead after
// --max-tries and `outbox --status dead` lists it.
func TestOutboxDeadLetters(t *testing.T) {
	t.Parallel()
	db, _ := testFiles(t)
	run := func(args ...string) opsOut {
		t.Helper()
		var out, errb syncBuffer
		args = append([]string{"--db", db}, args...)
		code := Execute(context.Background(), testRegistry(), args, &out, &errb)
		return opsOut{args: args, code: code, stdout: out.String(), stderr: errb.String()}
	}
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
