package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// deadLetters queues a message for each of steps in runID (claimed by
// owner at t0) and makes each dead with one failed try.
func (e *env) deadLetters(st checkpoint.Store, runID, owner string, steps ...string) {
	e.t.Helper()
	ob := capability[outbox](e.t, st, "outbox")
	c := e.claim(st, runID, owner, t0)
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
		for _, s := range steps {
			if err := tx.Enqueue(message(runID, s, t0)); err != nil {
				return err
			}
		}
		return nil
	})
	for _, s := range steps {
		dead, err := ob.MarkFailed(e.ctx, checkpoint.DeliveryFailure{Key: runID + "/" + s, Error: "503 receiver down", RetryAt: t0.Add(time.Second), MaxTries: 1})
		if err != nil || !dead {
			e.t.Fatalf("MarkFailed %s/%s = %v, %v; want it dead", runID, s, dead, err)
		}
	}
}

// byKey indexes a run's messages by key.
func (e *env) byKey(ob outbox, runID string) map[string]checkpoint.Message {
	e.t.Helper()
	ms, err := ob.RunMessages(e.ctx, runID)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]checkpoint.Message{}
	for _, m := range ms {
		out[m.Key] = m
	}
	return out
}

func testRequeue(t *testing.T, h Harness) {
	callerClock(t, h, "ByKey", requeueByKey)
	t.Run("UnknownKey", func(t *testing.T) { requeueUnknownKey(t, h) })
	t.Run("ByRunAndAll", func(t *testing.T) { requeueByRunAndAll(t, h) })
	t.Run("BadSelection", func(t *testing.T) { requeueBadSelection(t, h) })
	t.Run("WhileDispatching", func(t *testing.T) { requeueWhileDispatching(t, h) })
}

// requeueByKey is the Requeue test ByKey.
//
// Longer than 80 lines: one message requeued through its states in order, each step on what the last left.
func requeueByKey(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	ob := capability[outbox](t, st, "outbox")
	op := capability[operator](t, st, "operator")
	e.deadLetters(st, "requeue/1", ownerA, "poison", "dead2")
	c := e.claim(st, "requeue/1", ownerB, t0.Add(lease))
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
		for _, s := range []string{"fine", "waiting"} {
			if err := tx.Enqueue(message("requeue/1", s, t0.Add(time.Second))); err != nil {
				return err
			}
		}
		return nil
	})
	sentAt := t0.Add(2 * time.Second)
	if err := ob.MarkSent(e.ctx, "requeue/1/fine", sentAt); err != nil {
		t.Fatal(err)
	}
	// The waiting one is claimed by a dispatcher right now: requeue
	// must not shorten its window.
	now := t0.Add(time.Hour)
	if ms, err := ob.ClaimMessages(e.ctx, now.Add(-time.Minute), 10, 5*time.Minute); err != nil || !slices.Equal(msgKeys(ms), []string{"requeue/1/waiting"}) {
		t.Fatalf("claim = %v, %v; want the waiting message only", msgKeys(ms), err)
	}
	before := e.byKey(ob, "requeue/1")

	a := audit("", "outbox requeue", now)
	res, err := ob.RequeueDead(e.ctx, checkpoint.Requeue{
		Keys: []string{"requeue/1/fine", "requeue/1/poison", "requeue/1/waiting", "requeue/1/poison"}, Now: now, Audit: a})
	if err != nil {
		t.Fatalf("RequeueDead = %v", err)
	}
	if got := msgKeys(res.Requeued); !slices.Equal(got, []string{"requeue/1/poison"}) {
		t.Fatalf("requeued %v; want the dead one named, once", got)
	}
	if m := res.Requeued[0]; m.Status != checkpoint.MessageQueued || m.Tries != 0 || !sameTime(m.NextAt, now) ||
		m.LastError != "503 receiver down" || m.RunID != "requeue/1" || !sameTime(m.CreatedAt, t0) {
		t.Errorf("requeued message = %+v; want queued, no tries, due at %s, its last error and creation kept", m, now)
	}
	if got := msgKeys(res.NotDead); !slices.Equal(got, []string{"requeue/1/fine", "requeue/1/waiting"}) {
		t.Errorf("not dead = %v; want the sent and the queued one, in the order named", got)
	} else if res.NotDead[0].Status != checkpoint.MessageSent || res.NotDead[1].Status != checkpoint.MessageQueued {
		t.Errorf("not dead = %+v; want their statuses sent and queued", res.NotDead)
	}
	after := e.byKey(ob, "requeue/1")
	for _, k := range []string{"requeue/1/fine", "requeue/1/waiting", "requeue/1/dead2"} {
		if b, a := before[k], after[k]; b.Status != a.Status || b.Tries != a.Tries || !sameTime(a.NextAt, b.NextAt) ||
			!sameTime(a.SentAt, b.SentAt) || a.LastError != b.LastError {
			t.Errorf("%s was %+v, after the requeue %+v; want it untouched", k, b, a)
		}
	}

	// A dispatcher delivers it once: one claim takes it, and after
	// its delivery no later claim does.
	ms, err := ob.ClaimMessages(e.ctx, now, 10, time.Minute)
	if err != nil || !slices.Equal(msgKeys(ms), []string{"requeue/1/poison"}) {
		t.Fatalf("claim after the requeue = %v, %v; want the requeued message (the waiting one still claimed)", msgKeys(ms), err)
	}
	if ms, err := ob.ClaimMessages(e.ctx, now, 10, time.Minute); err != nil || len(ms) != 0 {
		t.Errorf("second claim in the window = %v, %v; want none", msgKeys(ms), err)
	}
	if err := ob.MarkSent(e.ctx, "requeue/1/poison", now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if ms, err := ob.ClaimMessages(e.ctx, now.Add(24*time.Hour), 10, time.Minute); err != nil || slices.Contains(msgKeys(ms), "requeue/1/poison") {
		t.Errorf("claim a day later = %v, %v; want the delivered message never again", msgKeys(ms), err)
	}
	if m := e.byKey(ob, "requeue/1")["requeue/1/poison"]; m.Status != checkpoint.MessageSent || m.Tries != 1 || m.LastError != "" {
		t.Errorf("delivered message = %+v; want sent after one try counted since the requeue", m)
	}

	// Asked again, it is sent, not dead: reported, left alone.
	res, err = ob.RequeueDead(e.ctx, checkpoint.Requeue{Keys: []string{"requeue/1/poison"}, Now: now.Add(time.Minute), Audit: a})
	if err != nil || len(res.Requeued) != 0 || !slices.Equal(msgKeys(res.NotDead), []string{"requeue/1/poison"}) {
		t.Errorf("requeue of the delivered message = %+v, %v; want it reported not dead", res, err)
	}

	audits, err := op.Audits(e.ctx, "requeue/1")
	if err != nil {
		t.Fatal(err)
	}
	if len(audits) != 1 {
		t.Fatalf("audits = %+v; want one, for the requeue that changed something", audits)
	}
	if g := audits[0]; g.RunID != "requeue/1" || g.Command != "outbox requeue" || g.Operator != a.Operator || g.Reason != a.Reason ||
		!sameTime(g.At, now) || g.Details != "requeued dead message requeue/1/poison" {
		t.Errorf("audit = %+v; want the operator's record with the requeued key", g)
	}
}

// requeueUnknownKey is the Requeue test UnknownKey.
func requeueUnknownKey(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	ob := capability[outbox](t, st, "outbox")
	op := capability[operator](t, st, "operator")
	e.deadLetters(st, "requeue/2", ownerA, "poison")
	_, err := ob.RequeueDead(e.ctx, checkpoint.Requeue{
		Keys: []string{"requeue/2/poison", "requeue/2/typo", "requeue/2/other"}, Now: t0.Add(time.Hour), Audit: audit("", "outbox requeue", t0)})
	var unknown *checkpoint.UnknownMessagesError
	if !errors.As(err, &unknown) || !slices.Equal(unknown.Keys, []string{"requeue/2/typo", "requeue/2/other"}) {
		t.Fatalf("requeue naming unknown keys = %v; want an *UnknownMessagesError naming both", err)
	}
	if !errors.Is(err, checkpoint.ErrNotFound) || !strings.Contains(err.Error(), `"requeue/2/typo"`) || !strings.Contains(err.Error(), `"requeue/2/other"`) {
		t.Errorf("error %q; want ErrNotFound, naming each unknown key", err)
	}
	_, err = ob.RequeueDead(e.ctx, checkpoint.Requeue{Keys: []string{"nope"}, Now: t0.Add(time.Hour), Audit: audit("", "outbox requeue", t0)})
	if !errors.As(err, &unknown) || err.Error() != `no message "nope" in the outbox; nothing was requeued` {
		t.Errorf("requeue of one unknown key = %v; want it named", err)
	}
	if m := e.byKey(ob, "requeue/2")["requeue/2/poison"]; m.Status != checkpoint.MessageDead || m.Tries != 1 {
		t.Errorf("dead message named with an unknown key = %+v; want it still dead: nothing changes", m)
	}
	if audits, err := op.Audits(e.ctx, "requeue/2"); err != nil || len(audits) != 0 {
		t.Errorf("audits = %+v, %v; want none for a refused requeue", audits, err)
	}
}

// requeueByRunAndAll is the Requeue test ByRunAndAll.
func requeueByRunAndAll(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	ob := capability[outbox](t, st, "outbox")
	op := capability[operator](t, st, "operator")
	e.deadLetters(st, "requeue/3", ownerA, "b", "a")
	e.deadLetters(st, "requeue/4", ownerA, "c")
	c := e.claim(st, "requeue/5", ownerA, t0)
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error { return tx.Enqueue(message("requeue/5", "sent", t0)) })
	if err := ob.MarkSent(e.ctx, "requeue/5/sent", t0); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(time.Hour)
	a := audit("", "outbox requeue --run requeue/3", now)
	res, err := ob.RequeueDead(e.ctx, checkpoint.Requeue{RunID: "requeue/3", Now: now, Audit: a})
	if err != nil || !slices.Equal(msgKeys(res.Requeued), []string{"requeue/3/a", "requeue/3/b"}) || len(res.NotDead) != 0 {
		t.Fatalf("requeue of run requeue/3 = %+v, %v; want its two dead messages, by creation then key", res, err)
	}
	if m := e.byKey(ob, "requeue/4")["requeue/4/c"]; m.Status != checkpoint.MessageDead {
		t.Errorf("another run's dead message = %+v; want it still dead", m)
	}
	if res, err := ob.RequeueDead(e.ctx, checkpoint.Requeue{RunID: "requeue/9", Now: now, Audit: a}); err != nil || len(res.Requeued) != 0 {
		t.Errorf("requeue of a run with no dead messages = %+v, %v; want nothing, no error", res, err)
	}
	res, err = ob.RequeueDead(e.ctx, checkpoint.Requeue{All: true, Now: now, Audit: audit("", "outbox requeue --all-dead", now)})
	if err != nil || !slices.Equal(msgKeys(res.Requeued), []string{"requeue/4/c"}) {
		t.Fatalf("requeue of all dead = %+v, %v; want the last dead one only (the others queued, the sent one never)", res, err)
	}
	if m := e.byKey(ob, "requeue/5")["requeue/5/sent"]; m.Status != checkpoint.MessageSent || m.Tries != 1 {
		t.Errorf("sent message after requeue --all-dead = %+v; want it untouched", m)
	}
	if res, err := ob.RequeueDead(e.ctx, checkpoint.Requeue{All: true, Now: now, Audit: a}); err != nil || len(res.Requeued) != 0 {
		t.Errorf("requeue of all dead with none = %+v, %v; want nothing, no error", res, err)
	}
	if dead, err := ob.Messages(e.ctx, checkpoint.MessageDead, 0); err != nil || len(dead) != 0 {
		t.Errorf("dead messages = %v, %v; want none left", msgKeys(dead), err)
	}
	for run, want := range map[string][]string{
		"requeue/3": {"outbox requeue --run requeue/3: requeued 2 dead messages: requeue/3/a, requeue/3/b"},
		"requeue/4": {"outbox requeue --all-dead: requeued dead message requeue/4/c"},
		"requeue/5": nil,
	} {
		audits, err := op.Audits(e.ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, g := range audits {
			got = append(got, g.Command+": "+g.Details)
		}
		if !slices.Equal(got, want) {
			t.Errorf("audits of %s = %q; want %q", run, got, want)
		}
	}
}

// requeueBadSelection is the Requeue test BadSelection.
func requeueBadSelection(t *testing.T, h Harness) {
	e := newEnv(t, h)
	ob := capability[outbox](t, e.open(), "outbox")
	for _, r := range []checkpoint.Requeue{{}, {Keys: []string{"k"}, All: true}, {RunID: "r", All: true}, {Keys: []string{"k"}, RunID: "r"}} {
		if _, err := ob.RequeueDead(e.ctx, r); !errors.Is(err, checkpoint.ErrBadRequeue) {
			t.Errorf("RequeueDead(%+v) = %v; want ErrBadRequeue", r, err)
		}
	}
}

// requeueWhileDispatching: Dispatchers claim on two handles while the requeue commits: every
// requeued message is claimed exactly once in its window, and sent
// messages are never claimed.
func requeueWhileDispatching(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	const n = 30
	var steps []string
	for i := range n {
		steps = append(steps, fmt.Sprintf("m%02d", i))
	}
	e.deadLetters(a, "requeue/6", ownerA, steps...)
	c := e.claim(a, "requeue/7", ownerA, t0)
	e.inTx(a, c.Lease, func(tx checkpoint.Tx) error { return tx.Enqueue(message("requeue/7", "sent", t0)) })
	obA, obB := capability[outbox](t, a, "outbox"), capability[outbox](t, b, "outbox")
	if err := obA.MarkSent(e.ctx, "requeue/7/sent", t0); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(time.Hour)
	var (
		mu      sync.Mutex
		claimed = map[string]int{}
		wg      sync.WaitGroup
		stop    = make(chan struct{})
		errs    = make(chan error, 4*n)
	)
	for w := range 2 {
		ob := []outbox{obA, obB}[w]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ms, err := ob.ClaimMessages(e.ctx, now, 4, time.Hour)
				if err != nil {
					errs <- err
					return
				}
				for _, m := range ms {
					if err := ob.MarkSent(e.ctx, m.Key, now); err != nil {
						errs <- err
						return
					}
				}
				mu.Lock()
				for _, m := range ms {
					claimed[m.Key]++
				}
				done := len(claimed) == n
				mu.Unlock()
				if done {
					return
				}
			}
		}()
	}
	res, err := obB.RequeueDead(e.ctx, checkpoint.Requeue{All: true, Now: now, Audit: audit("", "outbox requeue --all-dead", now)})
	if err != nil || len(res.Requeued) != n {
		close(stop)
		wg.Wait()
		t.Fatalf("requeue while dispatching = %d requeued, %v; want all %d", len(res.Requeued), err, n)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for k, times := range claimed {
		if times != 1 || !strings.HasPrefix(k, "requeue/6/") {
			t.Errorf("%s claimed %d times; want each requeued message once, the sent one never", k, times)
		}
	}
	if len(claimed) != n {
		t.Errorf("%d messages claimed; want all %d requeued", len(claimed), n)
	}
	if sent, err := obA.Messages(e.ctx, checkpoint.MessageSent, 0); err != nil || len(sent) != n+1 {
		t.Errorf("%d sent, %v; want all %d and the one sent before", len(sent), err, n+1)
	}
}
