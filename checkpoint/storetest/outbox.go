package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
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
	t.Run("Requeue", func(t *testing.T) { testRequeue(t, h) })
	t.Run("QueuedWithTheCheckpoint", func(t *testing.T) { outboxQueuedWithTheCheckpoint(t, h) })
	callerClock(t, h, "SameKeyKeepsTheFirst", outboxSameKeyKeepsTheFirst)
	callerClock(t, h, "Claim", outboxClaim)
	callerClock(t, h, "DeadLetter", outboxDeadLetter)
	callerClock(t, h, "ConcurrentClaimsAreDisjoint", outboxConcurrentClaimsAreDisjoint)
}

// outboxQueuedWithTheCheckpoint is the Outbox test QueuedWithTheCheckpoint.
func outboxQueuedWithTheCheckpoint(t *testing.T, h Harness) {
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
}

// outboxSameKeyKeepsTheFirst is the Outbox test SameKeyKeepsTheFirst.
func outboxSameKeyKeepsTheFirst(t *testing.T, h Harness) {
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
}

// outboxClaim is the Outbox test Claim.
func outboxClaim(t *testing.T, h Harness) {
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
	const window = 2 * time.Minute
	claim := func(now time.Time, limit int) []string {
		t.Helper()
		ms, err := ob.ClaimMessages(e.ctx, now, limit, window)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.Status != checkpoint.MessageQueued || !sameTime(m.NextAt, now.Add(window)) {
				t.Errorf("claimed message %+v at %s; want it queued, invisible until %s", m, now, now.Add(window))
			}
		}
		return msgKeys(ms)
	}
	now := t0.Add(time.Minute)
	if got := claim(t0.Add(-time.Second), 10); len(got) != 0 {
		t.Errorf("claim before any was created = %v; want none", got)
	}
	if got, want := claim(now, 2), []string{"outbox/3/c", "outbox/3/a"}; !slices.Equal(got, want) {
		t.Errorf("claim with limit 2 = %v; want %v (oldest first)", got, want)
	}
	if got, want := claim(now, 10), []string{"outbox/3/b"}; !slices.Equal(got, want) {
		t.Errorf("second claim = %v; want %v (the claimed ones invisible, the later one not yet due)", got, want)
	}
	if got := claim(now.Add(window-time.Microsecond), 10); len(got) != 0 {
		t.Errorf("claim within the window = %v; want none", got)
	}
	if dead, err := ob.MarkFailed(e.ctx, checkpoint.DeliveryFailure{Key: "outbox/3/c", Error: "connection refused", RetryAt: now.Add(10 * time.Minute), MaxTries: 3}); err != nil || dead {
		t.Fatalf("MarkFailed = %v, %v; want a retry, no error", dead, err)
	}
	if err := ob.MarkSent(e.ctx, "outbox/3/a", now); err != nil {
		t.Fatal(err)
	}
	// b's dispatcher recorded nothing: after the window it is claimable again.
	if got, want := claim(now.Add(window), 10), []string{"outbox/3/b"}; !slices.Equal(got, want) {
		t.Errorf("claim when the window ends = %v; want %v (its dispatcher never answered)", got, want)
	}
	if got, want := claim(now.Add(time.Hour), 10), []string{"outbox/3/b", "outbox/3/c", "outbox/3/later"}; !slices.Equal(got, want) {
		t.Errorf("claim an hour later = %v; want %v (ordered by when each was due; the sent one never)", got, want)
	}
	// A failure reported after the delivery changes nothing.
	if dead, err := ob.MarkFailed(e.ctx, checkpoint.DeliveryFailure{Key: "outbox/3/a", Error: "late report", RetryAt: now.Add(time.Minute), MaxTries: 1}); err != nil || dead {
		t.Fatalf("MarkFailed of a sent message = %v, %v; want no change, no error", dead, err)
	}
	ms, err := ob.RunMessages(e.ctx, "outbox/3")
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]checkpoint.Message{}
	for _, m := range ms {
		byKey[m.Key] = m
	}
	if m := byKey["outbox/3/c"]; m.Status != checkpoint.MessageQueued || m.Tries != 1 || m.LastError != "connection refused" || !sameTime(m.NextAt, now.Add(time.Hour+window)) {
		t.Errorf("failed message = %+v; want queued, one try, its error, claimed until %s", m, now.Add(time.Hour+window))
	}
	if m := byKey["outbox/3/a"]; m.Status != checkpoint.MessageSent || m.Tries != 1 || m.LastError != "" || !sameTime(m.SentAt, now) {
		t.Errorf("sent message = %+v; want sent at %s after one try", m, now)
	}
}

// outboxDeadLetter is the Outbox test DeadLetter.
//
// Longer than 80 lines: one message retried to the dead letter in order, each step on what the last left.
func outboxDeadLetter(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	ob := capability[outbox](t, st, "outbox")
	c := e.claim(st, "outbox/4", ownerA, t0)
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
		for _, s := range []string{"poison", "once", "fine"} {
			if err := tx.Enqueue(message("outbox/4", s, t0)); err != nil {
				return err
			}
		}
		return nil
	})
	fail := func(key string, at time.Time, max int) bool {
		t.Helper()
		dead, err := ob.MarkFailed(e.ctx, checkpoint.DeliveryFailure{Key: key, Error: "500 at " + at.Format(time.TimeOnly), RetryAt: at.Add(time.Second), MaxTries: max})
		if err != nil {
			t.Fatal(err)
		}
		return dead
	}
	now := t0
	for try := 1; try <= 3; try++ {
		ms, err := ob.ClaimMessages(e.ctx, now, 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(msgKeys(ms), "outbox/4/poison") {
			t.Fatalf("try %d: claimed %v; want the poison message among them", try, msgKeys(ms))
		}
		if dead := fail("outbox/4/poison", now, 3); dead != (try == 3) {
			t.Errorf("try %d of 3: dead = %v; want %v", try, dead, try == 3)
		}
		if try == 1 {
			if !fail("outbox/4/once", now, 1) {
				t.Error("a failure with MaxTries 1: not dead; want dead at once")
			}
			if err := ob.MarkSent(e.ctx, "outbox/4/fine", now); err != nil {
				t.Fatal(err)
			}
		}
		now = now.Add(2 * time.Second)
	}
	if ms, err := ob.ClaimMessages(e.ctx, now.Add(24*time.Hour), 10, time.Minute); err != nil || len(ms) != 0 {
		t.Errorf("claim a day later = %v, %v; want no message: dead and sent ones are never claimed", msgKeys(ms), err)
	}
	if fail("outbox/4/poison", now, 3) {
		t.Error("a failure reported for a dead message reports dead again; want it left as it is")
	}
	dead, err := ob.Messages(e.ctx, checkpoint.MessageDead, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := msgKeys(dead), []string{"outbox/4/once", "outbox/4/poison"}; !slices.Equal(got, want) {
		t.Errorf("dead messages = %v; want %v (by creation, then key)", got, want)
	}
	for _, m := range dead {
		if m.Status != checkpoint.MessageDead || m.LastError == "" {
			t.Errorf("dead message %+v; want status dead and its last error", m)
		}
	}
	if len(dead) == 2 && dead[1].Tries != 3 {
		t.Errorf("poison message tries = %d; want 3, the limit, and no more", dead[1].Tries)
	}
	if all, err := ob.Messages(e.ctx, "", 0); err != nil || len(all) != 3 {
		t.Errorf("every message = %v, %v; want all three", msgKeys(all), err)
	}
	if sent, err := ob.Messages(e.ctx, checkpoint.MessageSent, 0); err != nil || !slices.Equal(msgKeys(sent), []string{"outbox/4/fine"}) {
		t.Errorf("sent messages = %v, %v; want the fine one", msgKeys(sent), err)
	}
	if some, err := ob.Messages(e.ctx, "", 2); err != nil || len(some) != 2 {
		t.Errorf("messages with limit 2 = %v, %v; want two", msgKeys(some), err)
	}
	var invalid *checkpoint.InvalidClaimError
	if _, err := ob.MarkFailed(e.ctx, checkpoint.DeliveryFailure{Key: "outbox/4/fine", Error: "x", RetryAt: now}); !errors.As(err, &invalid) || invalid.Field != "MaxTries" {
		t.Errorf("MarkFailed with MaxTries 0 = %v; want an *InvalidClaimError naming MaxTries", err)
	}
	if _, err := ob.ClaimMessages(e.ctx, now, 0, time.Minute); !errors.As(err, &invalid) || invalid.Field != "limit" {
		t.Errorf("claim with limit 0 = %v; want an *InvalidClaimError naming limit", err)
	}
	if _, err := ob.ClaimMessages(e.ctx, now, 1, 0); !errors.As(err, &invalid) || invalid.Field != "visibleFor" {
		t.Errorf("claim with no window = %v; want an *InvalidClaimError naming visibleFor", err)
	}
}

// outboxConcurrentClaimsAreDisjoint is the Outbox test ConcurrentClaimsAreDisjoint.
func outboxConcurrentClaimsAreDisjoint(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	c := e.claim(a, "outbox/5", ownerA, t0)
	const n = 60
	e.inTx(a, c.Lease, func(tx checkpoint.Tx) error {
		for i := range n {
			if err := tx.Enqueue(message("outbox/5", fmt.Sprintf("m%02d", i), t0.Add(time.Duration(i)*time.Millisecond))); err != nil {
				return err
			}
		}
		return nil
	})
	now := t0.Add(time.Minute)
	// Four claimers, two on each handle (two hosts), claim in small
	// batches at one instant until nothing is left.
	var (
		mu     sync.Mutex
		owners = map[string]int{}
		wg     sync.WaitGroup
		errs   = make(chan error, 4*n)
	)
	for w := range 4 {
		ob := capability[outbox](t, []checkpoint.Store{a, b}[w%2], "outbox")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ms, err := ob.ClaimMessages(e.ctx, now, 3, time.Minute)
				if err != nil {
					errs <- err
					return
				}
				if len(ms) == 0 {
					return
				}
				mu.Lock()
				for _, m := range ms {
					if prev, ok := owners[m.Key]; ok {
						errs <- fmt.Errorf("message %s claimed by claimer %d and again by %d within one window", m.Key, prev, w)
					}
					owners[m.Key] = w
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(owners) != n {
		t.Errorf("%d messages claimed; want all %d", len(owners), n)
	}
	ob := capability[outbox](t, b, "outbox")
	if ms, err := ob.ClaimMessages(e.ctx, now.Add(time.Minute-time.Microsecond), n, time.Minute); err != nil || len(ms) != 0 {
		t.Errorf("claim within the window = %v, %v; want none", msgKeys(ms), err)
	}
	if ms, err := ob.ClaimMessages(e.ctx, now.Add(time.Minute), n, time.Minute); err != nil || len(ms) != n {
		t.Errorf("claim after the window = %d messages, %v; want all %d again (no claimer recorded an outcome)", len(ms), err, n)
	}
}
