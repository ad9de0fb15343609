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

// queueFinishAndClaim is the Queue test FinishAndClaim: runs' ends and
// the next claims commit together, and a fenced end writes nothing, its
// run left to the attempt holding it.
func queueFinishAndClaim(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	q := capability[queue](t, st, "run queue")
	for i := range 6 {
		e.enqueue(q, enqueueReq(fmt.Sprintf("f/%d", i), t0.Add(time.Duration(i)*time.Second)))
	}
	now := t0.Add(time.Minute)
	first := e.batch(q, ownerA, now, 2)
	if got := claimIDs(first); !slices.Equal(got, []string{"f/0", "f/1"}) {
		t.Fatalf("claim: %v; want [f/0 f/1]", got)
	}
	at := now.Add(time.Second)
	ends := []checkpoint.Finished{
		{Lease: first[0].Lease, Ending: checkpoint.Ending{Status: checkpoint.RunSucceeded, At: at}},
		{Lease: first[1].Lease, Ending: checkpoint.Ending{Status: checkpoint.RunFailed, Error: "boom", At: at}},
	}
	next, results, err := q.FinishAndClaim(e.ctx, ends, checkpoint.ClaimNextRequest{Owner: ownerA, Now: at, LeaseFor: lease, Max: 2})
	if err != nil || len(results) != 2 || results[0] != nil || results[1] != nil {
		t.Fatalf("finish f/0 and f/1 and claim 2: %v, results %v", err, results)
	}
	if got := claimIDs(next); !slices.Equal(got, []string{"f/2", "f/3"}) {
		t.Fatalf("claimed with the ends: %v; want [f/2 f/3]", got)
	}
	e.checkTaken(st, next, ownerA, at)
	for i, want := range []string{checkpoint.RunSucceeded, checkpoint.RunFailed} {
		info := e.run(st, ends[i].Lease.RunID)
		if info.Run.Status != want || info.Run.LeaseOwner != "" || len(info.Attempts) != 1 ||
			info.Attempts[0].Status != want || !info.Attempts[0].FinishedAt.Equal(at) {
			t.Fatalf("%s after its end: %+v, attempts %+v; want %s, attempt 1 %s", ends[i].Lease.RunID, info.Run, info.Attempts, want, want)
		}
	}
	// B takes f/2 over once A's lease has expired; A's end of it is then
	// refused and writes nothing, while A's end of f/3 and the claim go on.
	late := at.Add(lease)
	cb := e.next(q, ownerB, late)
	if cb.Lease.RunID != "f/2" {
		t.Fatalf("takeover after the lease: %q; want f/2", cb.Lease.RunID)
	}
	ends = []checkpoint.Finished{
		{Lease: next[0].Lease, Ending: checkpoint.Ending{Status: checkpoint.RunSucceeded, At: late}},
		{Lease: next[1].Lease, Ending: checkpoint.Ending{Status: checkpoint.RunSucceeded, At: late}},
	}
	more, results, err := q.FinishAndClaim(e.ctx, ends, checkpoint.ClaimNextRequest{Owner: ownerA, Now: late, LeaseFor: lease, Max: 1})
	if err != nil || len(results) != 2 || !errors.Is(results[0], checkpoint.ErrFenced) || results[1] != nil {
		t.Fatalf("ends of f/2 (taken over) and f/3: %v, results %v; want ErrFenced for f/2 only", err, results)
	}
	if got := claimIDs(more); !slices.Equal(got, []string{"f/4"}) {
		t.Fatalf("claimed with them: %v; want [f/4]", got)
	}
	if info := e.run(st, "f/2"); info.Run.Status != checkpoint.RunRunning || info.Run.LeaseOwner != ownerB ||
		len(info.Attempts) != 2 || info.Attempts[1].Status != checkpoint.RunRunning {
		t.Fatalf("f/2 after A's refused end: %s held by %q, attempts %+v; want running under B, its attempt open",
			info.Run.Status, info.Run.LeaseOwner, info.Attempts)
	}
	if info := e.run(st, "f/3"); info.Run.Status != checkpoint.RunSucceeded {
		t.Fatalf("f/3 after its end: %s; want succeeded", info.Run.Status)
	}
}
