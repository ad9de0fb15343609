package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// message is an outbox message of a step, created at.
func message(runID, step string, at time.Time) checkpoint.Message {
	return checkpoint.Message{Key: runID + "/" + step, Topic: "settled", Payload: []byte(`{"step":"` + step + `"}`), CreatedAt: at}
}

// msgKeys lists the keys of messages.
func msgKeys(ms []checkpoint.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Key)
	}
	return out
}

func testOutbox(t *testing.T, h Harness) {
	t.Run("QueuedWithTheCheckpoint", func(t *testing.T) {
		e := newEnv(t, h)
		a, b := e.open(), e.open()
		ob := capability[outbox](t, b, "outbox")
		c := e.claim(a, "outbox/1", ownerA, t0)
		e.inTx(a, c.Lease, func(tx checkpoint.Tx) error {
			if err := tx.PutStep(completed("notify", `1`)); err != nil {
				return err
			}
			return tx.Enqueue(message("outbox/1", "notify", t0))
		})
		boom := errors.New("the step failed")
		if err := a.InTx(e.ctx, c.Lease, func(tx checkpoint.Tx) error {
			if err := tx.Enqueue(message("outbox/1", "lost", t0)); err != nil {
				return err
			}
			return boom
		}); !errors.Is(err, boom) {
			t.Fatalf("InTx = %v; want the function's error", err)
		}
		ms, err := ob.RunMessages(e.ctx, "outbox/1")
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) != 1 {
			t.Fatalf("messages = %+v; want only the committed one", ms)
		}
		m := ms[0]
		if m.Key != "outbox/1/notify" || m.RunID != "outbox/1" || m.Topic != "settled" || string(m.Payload) != `{"step":"notify"}` ||
			m.Status != checkpoint.MessageQueued || m.Tries != 0 || m.LastError != "" || !sameTime(m.CreatedAt, t0) || !sameTime(m.NextAt, t0) || !m.SentAt.IsZero() {
			t.Errorf("message = %+v; want it queued as enqueued, due at its creation %s", m, t0)
		}
	})

	t.Run("SameKeyKeepsTheFirst", func(t *testing.T) {
		e := newEnv(t, h)
		st := e.open()
		ob := capability[outbox](t, st, "outbox")
		c := e.claim(st, "outbox/2", ownerA, t0)
		first := message("outbox/2", "notify", t0)
		e.inTx(st, c.Lease, func(tx checkpoint.Tx) error { return tx.Enqueue(first) })
		c2 := e.claim(st, "outbox/2", ownerB, t0.Add(lease))
		again := first
		again.Payload, again.CreatedAt = []byte(`{"again":true}`), t0.Add(time.Hour)
		e.inTx(st, c2.Lease, func(tx checkpoint.Tx) error { return tx.Enqueue(again) })
		ms, err := ob.RunMessages(e.ctx, "outbox/2")
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) != 1 || string(ms[0].Payload) != string(first.Payload) || !sameTime(ms[0].CreatedAt, t0) {
			t.Errorf("messages after queuing a key twice = %+v; want the first one only", ms)
		}
	})

	t.Run("Delivery", func(t *testing.T) {
		e := newEnv(t, h)
		st := e.open()
		ob := capability[outbox](t, st, "outbox")
		c := e.claim(st, "outbox/3", ownerA, t0)
		e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
			for i, s := range []string{"c", "a", "b", "later"} {
				at := t0.Add(time.Duration(i) * time.Second)
				if s == "later" {
					at = t0.Add(time.Hour)
				}
				if err := tx.Enqueue(message("outbox/3", s, at)); err != nil {
					return err
				}
			}
			return nil
		})
		due := func(now time.Time, limit int) []string {
			ms, err := ob.DueMessages(e.ctx, now, limit)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range ms {
				if m.Status != checkpoint.MessageQueued || m.NextAt.After(now) {
					t.Errorf("due message %+v at %s; want only queued messages due by then", m, now)
				}
			}
			return msgKeys(ms)
		}
		now := t0.Add(time.Minute)
		if got, want := due(now, 10), []string{"outbox/3/c", "outbox/3/a", "outbox/3/b"}; !slices.Equal(got, want) {
			t.Errorf("due = %v; want %v (oldest first, the later one not yet)", got, want)
		}
		if got := due(now, 2); len(got) != 2 {
			t.Errorf("due with limit 2 = %v; want two", got)
		}
		if got := due(t0.Add(-time.Second), 10); len(got) != 0 {
			t.Errorf("due before any was created = %v; want none", got)
		}
		if err := ob.MarkFailed(e.ctx, "outbox/3/c", "connection refused", now.Add(10*time.Minute)); err != nil {
			t.Fatal(err)
		}
		if err := ob.MarkSent(e.ctx, "outbox/3/a", now); err != nil {
			t.Fatal(err)
		}
		if got, want := due(now, 10), []string{"outbox/3/b"}; !slices.Equal(got, want) {
			t.Errorf("due after a failure and a delivery = %v; want %v", got, want)
		}
		if got, want := due(now.Add(time.Hour), 10), []string{"outbox/3/b", "outbox/3/c", "outbox/3/later"}; !slices.Equal(got, want) {
			t.Errorf("due an hour later = %v; want %v (the failed one again, ordered by its retry time)", got, want)
		}
		// A failure reported after the delivery changes nothing.
		if err := ob.MarkFailed(e.ctx, "outbox/3/a", "late report", now.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		ms, err := ob.RunMessages(e.ctx, "outbox/3")
		if err != nil {
			t.Fatal(err)
		}
		byKey := map[string]checkpoint.Message{}
		for _, m := range ms {
			byKey[m.Key] = m
		}
		if m := byKey["outbox/3/c"]; m.Status != checkpoint.MessageQueued || m.Tries != 1 || m.LastError != "connection refused" || !sameTime(m.NextAt, now.Add(10*time.Minute)) {
			t.Errorf("failed message = %+v; want queued, one try, its error, next at %s", m, now.Add(10*time.Minute))
		}
		if m := byKey["outbox/3/a"]; m.Status != checkpoint.MessageSent || m.Tries != 1 || m.LastError != "" || !sameTime(m.SentAt, now) {
			t.Errorf("sent message = %+v; want sent at %s after one try", m, now)
		}
	})
}
