package storetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// batch claims up to n runs for owner at now.
func (e *env) batch(q queue, owner string, now time.Time, n int) []checkpoint.Claim {
	e.t.Helper()
	cs, err := q.ClaimBatch(e.ctx, checkpoint.ClaimNextRequest{Owner: owner, Now: now, LeaseFor: lease, Max: n})
	if err != nil {
		e.t.Fatalf("claim a batch of %d at %s: %v", n, now.Format(time.RFC3339Nano), err)
	}
	return cs
}

func claimIDs(cs []checkpoint.Claim) []string {
	var ids []string
	for _, c := range cs {
		ids = append(ids, c.Lease.RunID)
	}
	return ids
}

// checkTaken fails unless every claim in cs holds its run as a first
// claim: fence 1, attempt 1 recorded running under owner, lease until
// now + lease.
func (e *env) checkTaken(st checkpoint.Store, cs []checkpoint.Claim, owner string, now time.Time) {
	e.t.Helper()
	for _, c := range cs {
		info := e.run(st, c.Lease.RunID)
		r := info.Run
		if c.Lease.Fence != 1 || c.Lease.Attempt != 1 || c.Lease.Owner != owner || c.PreviousStatus != checkpoint.RunQueued ||
			r.Status != checkpoint.RunRunning || r.Fence != 1 || r.LeaseOwner != owner || !r.LeaseUntil.Equal(now.Add(lease)) ||
			len(info.Attempts) != 1 || info.Attempts[0].Status != checkpoint.RunRunning || info.Attempts[0].Owner != owner {
			e.t.Errorf("%s: claim %+v, run %+v, attempts %+v; want fence 1, attempt 1 running under %s until %s",
				c.Lease.RunID, c.Lease, r, info.Attempts, owner, now.Add(lease))
		}
	}
}

// queueClaimBatch is the Queue test ClaimBatch: a batch takes up to Max
// due runs in claim order, each as a claim of its own (fence, lease,
// attempt), and honours limits within the batch.
func queueClaimBatch(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	q := capability[queue](t, st, "run queue")
	for i := range 5 {
		e.enqueue(q, enqueueReq(fmt.Sprintf("b/%d", i), t0.Add(time.Duration(i)*time.Second)))
	}
	now := t0.Add(time.Minute)
	first := e.batch(q, ownerA, now, 3)
	if got := claimIDs(first); !slices.Equal(got, []string{"b/0", "b/1", "b/2"}) {
		t.Fatalf("first batch of 3: %v; want [b/0 b/1 b/2], oldest first", got)
	}
	e.checkTaken(st, first, ownerA, now)
	rest := e.batch(q, ownerB, now, 10)
	if got := claimIDs(rest); !slices.Equal(got, []string{"b/3", "b/4"}) {
		t.Fatalf("second batch of up to 10: %v; want the 2 left", got)
	}
	e.checkTaken(st, rest, ownerB, now)
	if cs := e.batch(q, ownerC, now, 4); len(cs) != 0 {
		t.Fatalf("batch on an empty queue: %v; want none", claimIDs(cs))
	}
	// A batch fills a limit and leaves the runs over it queued.
	limit := checkpoint.Limit{Key: "ledger:batch", Max: 2}
	for i := range 4 {
		r := enqueueReq(fmt.Sprintf("l/%d", i), t0.Add(time.Duration(10+i)*time.Second))
		r.Limit = limit
		e.enqueue(q, r)
	}
	e.enqueue(q, enqueueReq("free/1", t0.Add(20*time.Second)))
	got := claimIDs(e.batch(q, ownerA, now, 5))
	slices.Sort(got)
	if want := []string{"free/1", "l/0", "l/1"}; !slices.Equal(got, want) {
		t.Fatalf("batch of 5 with a limit of 2: %v; want %v", got, want)
	}
	if _, err := q.ClaimBatch(e.ctx, checkpoint.ClaimNextRequest{Owner: ownerA, Now: now, LeaseFor: lease, Max: -1}); err == nil {
		t.Error("a batch of -1 was accepted")
	}
}

// queueFinishAndClaim is the Queue test FinishAndClaim: a run's end and
// the next claims commit together, and a fenced finish claims nothing.
func queueFinishAndClaim(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	q := capability[queue](t, st, "run queue")
	for i := range 4 {
		e.enqueue(q, enqueueReq(fmt.Sprintf("f/%d", i), t0.Add(time.Duration(i)*time.Second)))
	}
	now := t0.Add(time.Minute)
	c := e.batch(q, ownerA, now, 1)
	if len(c) != 1 || c[0].Lease.RunID != "f/0" {
		t.Fatalf("claim: %v; want f/0", claimIDs(c))
	}
	next, err := q.FinishAndClaim(e.ctx, c[0].Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: now.Add(time.Second)},
		checkpoint.ClaimNextRequest{Owner: ownerA, Now: now.Add(time.Second), LeaseFor: lease, Max: 2})
	if err != nil {
		t.Fatalf("finish f/0 and claim 2: %v", err)
	}
	if got := claimIDs(next); !slices.Equal(got, []string{"f/1", "f/2"}) {
		t.Fatalf("claimed with the finish: %v; want [f/1 f/2]", got)
	}
	e.checkTaken(st, next, ownerA, now.Add(time.Second))
	info := e.run(st, "f/0")
	if info.Run.Status != checkpoint.RunSucceeded || info.Run.LeaseOwner != "" || len(info.Attempts) != 1 ||
		info.Attempts[0].Status != checkpoint.RunSucceeded || !info.Attempts[0].FinishedAt.Equal(now.Add(time.Second)) {
		t.Fatalf("f/0 after its finish: %+v, attempts %+v; want succeeded, attempt 1 succeeded", info.Run, info.Attempts)
	}
	// B takes f/1 over once A's lease has expired; A's finish is then
	// refused and claims nothing: f/3 stays queued.
	late := now.Add(time.Second + lease)
	cb := e.next(q, ownerB, late)
	if cb.Lease.RunID != "f/2" && cb.Lease.RunID != "f/1" {
		t.Fatalf("takeover after the lease: %q; want f/1 or f/2", cb.Lease.RunID)
	}
	var stale checkpoint.Lease
	for _, c := range next {
		if c.Lease.RunID == cb.Lease.RunID {
			stale = c.Lease
		}
	}
	_, err = q.FinishAndClaim(e.ctx, stale, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: late},
		checkpoint.ClaimNextRequest{Owner: ownerA, Now: late, LeaseFor: lease, Max: 4})
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("finish of %s after the takeover: %v; want ErrFenced", stale.RunID, err)
	}
	if info := e.run(st, "f/3"); info.Run.Status != checkpoint.RunQueued || len(info.Attempts) != 0 {
		t.Fatalf("f/3 after a refused finish: %s with %d attempts; want still queued, no attempt", info.Run.Status, len(info.Attempts))
	}
	if info := e.run(st, stale.RunID); info.Run.Status != checkpoint.RunRunning || info.Run.LeaseOwner != ownerB {
		t.Fatalf("%s after A's refused finish: %s held by %q; want running under B", stale.RunID, info.Run.Status, info.Run.LeaseOwner)
	}
}
