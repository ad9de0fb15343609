package storetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// Times far from the wall clock on both sides: a store that reads its own
// clock anywhere (to judge a lease, to stamp a row) gets these wrong.
var (
	farPast   = time.Date(1901, 2, 3, 4, 5, 6, 789012000, time.UTC)
	farFuture = time.Date(2999, 12, 30, 23, 58, 59, 123456000, time.UTC)
)

func testErrorsAndClock(t *testing.T, h Harness) {
	callerClock(t, h, "TimesComeFromTheRequest", clockTimesComeFromTheRequest)
	callerClock(t, h, "LeasesAreJudgedByTheRequestTime", clockLeasesAreJudgedByTheRequestTime)
	callerClock(t, h, "PruneCutoffFromTheRequest", clockPruneCutoffFromTheRequest)
	callerClock(t, h, "TimeZonesAndPrecision", clockTimeZonesAndPrecision)
	callerClock(t, h, "ErrorsNameWhatIsWrong", clockErrorsNameWhatIsWrong)
	t.Run("CanceledContextWritesNothing", func(t *testing.T) { clockCanceledContextWritesNothing(t, h) })
	if h.ServerClock {
		t.Run("ServerClockIgnoresRequestTimes", func(t *testing.T) { clockServerClockIgnoresRequestTimes(t, h) })
	}
}

// clockServerClockIgnoresRequestTimes holds the harness to its word: with
// ServerClock set, Open's handles judge leases by the database's clock,
// so a claim made "in" the far future holds its lease until the database's
// now plus the lease, not the request's, and another host claiming at the
// far future's end of that lease finds it still held. (Otherwise the suite
// would certify the production mode on handles that are not in it.)
func clockServerClockIgnoresRequestTimes(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	c := e.claim(a, "server-clock/1", ownerA, farFuture)
	if sameTime(c.Run.LeaseUntil, farFuture.Add(lease)) || c.Run.LeaseUntil.After(farFuture) {
		t.Fatalf("a claim at %s on a ServerClock handle holds its lease until %s: the request's time, not the database's",
			farFuture, c.Run.LeaseUntil)
	}
	_, err := b.Claim(e.ctx, claimReq("server-clock/1", ownerB, farFuture.Add(2*lease)))
	var held *checkpoint.LeaseHeldError
	if !errors.As(err, &held) || held.Owner != ownerA {
		t.Fatalf("a claim long after the far-future lease, on a ServerClock handle: %v; want *LeaseHeldError of %s (the database's clock says the lease is live)", err, ownerA)
	}
}

// clockTimesComeFromTheRequest is the ErrorsAndClock test TimesComeFromTheRequest.
func clockTimesComeFromTheRequest(t *testing.T, h Harness) {
	for name, now := range map[string]time.Time{"far past": farPast, "far future": farFuture} {
		t.Run(strings.ReplaceAll(name, " ", "-"), func(t *testing.T) {
			e := newEnv(t, h)
			st := e.open()
			c := e.claim(st, "clock/1", ownerA, now)
			if err := st.Heartbeat(e.ctx, c.Lease, now.Add(time.Second), now.Add(2*lease)); err != nil {
				t.Fatal(err)
			}
			step := completed("load", `1`)
			step.StartedAt, step.FinishedAt = now.Add(2*time.Second), now.Add(3*time.Second)
			e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
				if err := tx.PutStep(step); err != nil {
					return err
				}
				return tx.Enqueue(message("clock/1", "load", now.Add(4*time.Second)))
			})
			end := now.Add(5 * time.Second)
			if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: end}); err != nil {
				t.Fatal(err)
			}
			info := e.run(st, "clock/1")
			r, a := info.Run, info.Attempts[0]
			for what, pair := range map[string][2]time.Time{
				"run created":      {r.CreatedAt, now},
				"run updated":      {r.UpdatedAt, end},
				"run finished":     {r.FinishedAt, end},
				"attempt started":  {a.StartedAt, now},
				"attempt finished": {a.FinishedAt, end},
			} {
				if !sameTime(pair[0], pair[1]) {
					t.Errorf("%s at %s; want %s, the time the request gave", what, pair[0], pair[1])
				}
			}
			s := e.steps(st, "clock/1")["load"]
			if !sameTime(s.StartedAt, step.StartedAt) || !sameTime(s.FinishedAt, step.FinishedAt) {
				t.Errorf("step times %s, %s; want %s, %s", s.StartedAt, s.FinishedAt, step.StartedAt, step.FinishedAt)
			}
			if ob, ok := st.(outbox); ok {
				ms, err := ob.RunMessages(e.ctx, "clock/1")
				if err != nil || len(ms) != 1 || !sameTime(ms[0].CreatedAt, now.Add(4*time.Second)) {
					t.Errorf("messages = %+v, %v; want one created at %s", ms, err, now.Add(4*time.Second))
				}
				if due, _ := ob.ClaimMessages(e.ctx, now.Add(4*time.Second-time.Microsecond), 10, time.Minute); len(due) != 0 {
					t.Errorf("a message is claimed before the time it was queued for: %+v", due)
				}
				if due, _ := ob.ClaimMessages(e.ctx, now.Add(4*time.Second), 10, time.Minute); len(due) != 1 || !sameTime(due[0].NextAt, now.Add(4*time.Second+time.Minute)) {
					t.Errorf("claim at the time it was queued for = %+v; want the message, claimed for a minute of the request's clock", due)
				}
			}
			if sc, ok := st.(schedules); ok {
				c, err := sc.ClaimSchedule(e.ctx, schedReq("clock", ownerA, now))
				if err != nil {
					t.Fatal(err)
				}
				if !sameTime(c.State.LastFire, now) || !sameTime(c.State.LeaseUntil, now.Add(lease)) || !sameTime(c.State.CreatedAt, now) {
					t.Errorf("schedule = %+v; want settle mark and creation %s, lease until %s", c.State, now, now.Add(lease))
				}
			}
			if op, ok := st.(operator); ok {
				if err := op.ResetSteps(e.ctx, audit("clock/1", "note", now), now, nil); err != nil {
					t.Fatal(err)
				}
				if as, err := op.Audits(e.ctx, "clock/1"); err != nil || len(as) != 1 || !sameTime(as[0].At, now) {
					t.Errorf("audit = %+v, %v; want one at %s", as, err, now)
				}
			}
		})
	}
}

// clockLeasesAreJudgedByTheRequestTime is the ErrorsAndClock test LeasesAreJudgedByTheRequestTime.
func clockLeasesAreJudgedByTheRequestTime(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	// Long past by the wall clock, live by the request's.
	e.claim(a, "clock/past", ownerA, farPast)
	if _, err := b.Claim(e.ctx, claimReq("clock/past", ownerB, farPast.Add(lease-time.Microsecond))); !errors.As(err, new(*checkpoint.LeaseHeldError)) {
		t.Errorf("claim within a lease given in the far past: %v; want *LeaseHeldError (the lease is judged by the request's time)", err)
	}
	if op, ok := b.(operator); ok {
		now := farPast.Add(time.Second)
		if err := op.Recover(e.ctx, audit("clock/past", "recover", now), now, false); !errors.Is(err, checkpoint.ErrNotStale) {
			t.Errorf("recover within a lease given in the far past: %v; want ErrNotStale", err)
		}
	}
	// Far ahead of the wall clock, yet expired by the request's.
	e.claim(a, "clock/future", ownerA, farFuture)
	c := e.claim(b, "clock/future", ownerB, farFuture.Add(lease))
	if c.TookOverFrom != ownerA || !sameTime(c.Run.LeaseUntil, farFuture.Add(2*lease)) {
		t.Errorf("takeover at the end of a far-future lease = %+v; want it taken over from %s until %s", c, ownerA, farFuture.Add(2*lease))
	}
	if r := e.run(a, "clock/past").Run; r.Stale(farPast) || !r.Stale(farPast.Add(lease)) {
		t.Errorf("Stale of a far-past lease: at its claim %v, at its end %v; want false, true", r.Stale(farPast), r.Stale(farPast.Add(lease)))
	}
}

// clockPruneCutoffFromTheRequest is the ErrorsAndClock test PruneCutoffFromTheRequest.
func clockPruneCutoffFromTheRequest(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	op := capability[operator](t, st, "operator actions")
	c := e.claim(st, "clock/prune", ownerA, farFuture)
	if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: farFuture}); err != nil {
		t.Fatal(err)
	}
	res, err := op.Prune(e.ctx, audit("", "prune", t0), t0, false)
	if err != nil || len(res.Runs) != 0 {
		t.Errorf("prune at %s of a run finished at %s = %+v, %v; want nothing pruned", t0, farFuture, res, err)
	}
	res, err = op.Prune(e.ctx, audit("", "prune", farFuture.Add(time.Hour)), farFuture.Add(time.Microsecond), false)
	if err != nil || len(res.Runs) != 1 {
		t.Errorf("prune with a cutoff just after the run finished = %+v, %v; want it pruned", res, err)
	}
}

// clockTimeZonesAndPrecision is the ErrorsAndClock test TimeZonesAndPrecision.
func clockTimeZonesAndPrecision(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	zone := time.FixedZone("UTC-3:30", -(3*3600 + 1800))
	now := time.Date(2031, 3, 14, 11, 39, 26, 535897999, zone) // t0 plus 999ns, half an hour off the hour
	e.claim(st, "clock/zone", ownerA, now)
	r := e.run(st, "clock/zone").Run
	if !sameTime(r.CreatedAt, now) || !sameTime(r.LeaseUntil, now.Add(lease)) {
		t.Errorf("run created %s, lease until %s; want the instants %s and %s, to the microsecond", r.CreatedAt, r.LeaseUntil, now, now.Add(lease))
	}
	if _, err := st.Claim(e.ctx, claimReq("clock/zone", ownerB, t0.Add(lease-time.Millisecond))); !errors.As(err, new(*checkpoint.LeaseHeldError)) {
		t.Errorf("claim in UTC before a lease given in another zone ends: %v; want *LeaseHeldError", err)
	}
	e.claim(st, "clock/zone", ownerB, t0.Add(lease+time.Microsecond))
}

// clockErrorsNameWhatIsWrong is the ErrorsAndClock test ErrorsNameWhatIsWrong.
func clockErrorsNameWhatIsWrong(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	c := e.claim(a, "errors/1", ownerA, t0)
	e.claim(b, "errors/1", ownerB, t0.Add(lease))
	err := a.InTx(e.ctx, c.Lease, func(tx checkpoint.Tx) error { return tx.PutStep(completed("load", `1`)) })
	if !errors.Is(err, checkpoint.ErrFenced) || !strings.Contains(err.Error(), "errors/1") {
		t.Errorf("fenced write: %v; want ErrFenced naming the run", err)
	}
	if _, err := a.Run(e.ctx, "errors/missing"); !errors.Is(err, checkpoint.ErrNotFound) || !strings.Contains(err.Error(), "errors/missing") {
		t.Errorf("Run of a missing run: %v; want ErrNotFound naming it", err)
	}
	if err := a.Heartbeat(e.ctx, c.Lease, t0, t0.Add(lease)); !errors.Is(err, checkpoint.ErrFenced) || !strings.Contains(err.Error(), "errors/1") {
		t.Errorf("fenced heartbeat: %v; want ErrFenced naming the run", err)
	}
}

// clockCanceledContextWritesNothing is the ErrorsAndClock test CanceledContextWritesNothing.
func clockCanceledContextWritesNothing(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "cancel/1", ownerA, t0)
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	if _, err := st.Claim(ctx, claimReq("cancel/2", ownerA, t0)); !errors.Is(err, context.Canceled) {
		t.Errorf("claim with a canceled context: %v; want context.Canceled", err)
	}
	if _, err := st.Run(e.ctx, "cancel/2"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("Run after a canceled claim: %v; want ErrNotFound", err)
	}
	called := false
	err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		called = true
		return tx.PutStep(completed("load", `1`))
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("InTx with a canceled context: %v (function called: %v); want context.Canceled", err, called)
	}
	if got := e.steps(st, "cancel/1"); len(got) != 0 {
		t.Errorf("steps after a canceled transaction = %+v; want none", got)
	}
	// The store is still usable.
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error { return tx.PutStep(completed("load", `1`)) })
}
