package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

type queue = checkpoint.QueueStore

// enqueueReq queues runID ("job/key") at now with the suite's parameters.
func enqueueReq(runID string, now time.Time) checkpoint.EnqueueRequest {
	job, key, _ := strings.Cut(runID, "/")
	return checkpoint.EnqueueRequest{RunID: runID, Job: job, RunKey: key,
		Params: []byte(params), ParamsHash: "sha256:" + params, Now: now}
}

// enqueue queues req and fails the test if it cannot.
func (e *env) enqueue(q queue, req checkpoint.EnqueueRequest) checkpoint.EnqueueResult {
	e.t.Helper()
	res, err := q.Enqueue(e.ctx, req)
	if err != nil {
		e.t.Fatalf("enqueue %s: %v", req.RunID, err)
	}
	return res
}

// next claims the next run for owner at now; "" when none is due.
func (e *env) next(q queue, owner string, now time.Time, queues ...string) checkpoint.Claim {
	e.t.Helper()
	c, ok, err := q.ClaimNext(e.ctx, checkpoint.ClaimNextRequest{Queues: queues, Owner: owner, Now: now, LeaseFor: lease})
	if err != nil {
		e.t.Fatalf("claim next at %s: %v", now.Format(time.RFC3339Nano), err)
	}
	if !ok {
		return checkpoint.Claim{}
	}
	return c
}

// nextIDs claims runs one by one at now until none is due and returns
// their IDs in claim order.
func (e *env) nextIDs(q queue, owner string, now time.Time, queues ...string) []string {
	e.t.Helper()
	var ids []string
	for {
		c := e.next(q, owner, now, queues...)
		if c.Lease.RunID == "" {
			return ids
		}
		ids = append(ids, c.Lease.RunID)
	}
}

func testQueue(t *testing.T, h Harness) {
	callerClock(t, h, "EnqueueDedupes", queueEnqueueDedupes)
	callerClock(t, h, "PriorityAgeNotBefore", queuePriorityAgeNotBefore)
	callerClock(t, h, "ExpiredLeaseReclaimedAndFenced", queueExpiredLeaseReclaimedAndFenced)
	t.Run("ConcurrentClaimersNeverShare", func(t *testing.T) { queueConcurrentClaimersNeverShare(t, h) })
	callerClock(t, h, "Limits", queueLimits)
	t.Run("LimitAcrossHosts", func(t *testing.T) { queueLimitAcrossHosts(t, h) })
	callerClock(t, h, "ClaimBatch", queueClaimBatch)
	callerClock(t, h, "FinishAndClaim", queueFinishAndClaim)
}

// queueEnqueueDedupes is the Queue test EnqueueDedupes.
func queueEnqueueDedupes(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	q := capability[queue](t, st, "run queue")
	res := e.enqueue(q, enqueueReq("report/1", t0))
	if !res.Created || res.Run.Status != checkpoint.RunQueued || res.Run.Queue != checkpoint.DefaultQueue || res.Run.Fence != 0 {
		t.Fatalf("first enqueue: %+v; want created, queued in %q, fence 0", res, checkpoint.DefaultQueue)
	}
	if !sameTime(res.Run.AvailableAt, t0) {
		t.Errorf("available at %s; want the enqueue time %s", res.Run.AvailableAt, t0)
	}
	again := enqueueReq("report/1", t0.Add(time.Second))
	again.Priority = 9
	res = e.enqueue(q, again)
	if res.Created || res.Run.Status != checkpoint.RunQueued || res.Run.Priority != 0 {
		t.Fatalf("second enqueue with the same parameters: %+v; want the run as it was (not created, queued, priority 0)", res)
	}
	other := enqueueReq("report/1", t0)
	other.Params, other.ParamsHash = []byte(`{"date":"2031-03-15"}`), "sha256:other"
	var mismatch *checkpoint.ParamsMismatchError
	if _, err := q.Enqueue(e.ctx, other); !errors.As(err, &mismatch) {
		t.Fatalf("enqueue with other parameters: %v; want *checkpoint.ParamsMismatchError", err)
	}
	// A run started directly is left as it is, and said to be running.
	e.claim(st, "report/2", ownerA, t0)
	if res := e.enqueue(q, enqueueReq("report/2", t0)); res.Created || res.Run.Status != checkpoint.RunRunning {
		t.Fatalf("enqueue of a running run: %+v; want not created, running", res)
	}
	// ClaimNext never takes a run nobody enqueued, even once stale.
	if c := e.next(q, ownerB, t0.Add(2*lease)); c.Lease.RunID != "report/1" {
		t.Fatalf("claimed %q; want report/1 (report/2 was never enqueued)", c.Lease.RunID)
	}
	if c := e.next(q, ownerB, t0.Add(2*lease)); c.Lease.RunID != "" {
		t.Fatalf("claimed %q; want none: report/2 was started directly", c.Lease.RunID)
	}
	if info := e.run(st, "report/1"); len(info.Attempts) != 1 || info.Run.Fence != 1 || info.Attempts[0].Owner != ownerB {
		t.Fatalf("report/1 after its claim: fence %d, attempts %+v; want fence 1, one attempt of %s", info.Run.Fence, info.Attempts, ownerB)
	}
}

// queuePriorityAgeNotBefore is the Queue test PriorityAgeNotBefore.
func queuePriorityAgeNotBefore(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	q := capability[queue](t, st, "run queue")
	e.enqueue(q, enqueueReq("q/old", t0))
	e.enqueue(q, enqueueReq("q/new", t0.Add(time.Second)))
	urgent := enqueueReq("q/urgent", t0.Add(2*time.Second))
	urgent.Priority = 5
	e.enqueue(q, urgent)
	later := enqueueReq("q/later", t0)
	later.NotBefore = t0.Add(30 * time.Second) // before the first claims' leases expire
	later.Priority = 9
	e.enqueue(q, later)
	elsewhere := enqueueReq("q/elsewhere", t0)
	elsewhere.Queue = "other"
	e.enqueue(q, elsewhere)
	got := e.nextIDs(q, ownerA, t0.Add(3*time.Second), checkpoint.DefaultQueue)
	if want := []string{"q/urgent", "q/old", "q/new"}; !slices.Equal(got, want) {
		t.Fatalf("claimed %v from %q; want %v: priority, then age, q/later not before its time", got, checkpoint.DefaultQueue, want)
	}
	if got := e.nextIDs(q, ownerA, t0.Add(30*time.Second-time.Microsecond)); !slices.Equal(got, []string{"q/elsewhere"}) {
		t.Fatalf("claimed %v from any queue just before q/later's time; want [q/elsewhere]", got)
	}
	if got := e.nextIDs(q, ownerA, t0.Add(30*time.Second)); !slices.Equal(got, []string{"q/later"}) {
		t.Fatalf("claimed %v at q/later's time; want [q/later]", got)
	}
	c, ok, err := q.ClaimNext(e.ctx, checkpoint.ClaimNextRequest{Jobs: []string{"nope"}, Owner: ownerA, Now: t0, LeaseFor: lease})
	if err != nil || ok {
		t.Fatalf("claim next of a job with no runs: %+v, %v, %v; want none", c, ok, err)
	}
}

// queueExpiredLeaseReclaimedAndFenced is the Queue test ExpiredLeaseReclaimedAndFenced.
func queueExpiredLeaseReclaimedAndFenced(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	qa, qb := capability[queue](t, a, "run queue"), capability[queue](t, b, "run queue")
	e.enqueue(qa, enqueueReq("w/1", t0))
	ca := e.next(qa, ownerA, t0)
	if ca.Lease.RunID != "w/1" || ca.Lease.Attempt != 1 || ca.PreviousStatus != checkpoint.RunQueued {
		t.Fatalf("first claim: %+v; want w/1, attempt 1, previously queued", ca)
	}
	if c := e.next(qb, ownerB, t0.Add(lease-time.Second)); c.Lease.RunID != "" {
		t.Fatalf("B claimed %s while A's lease is live", c.Lease.RunID)
	}
	cb := e.next(qb, ownerB, t0.Add(lease))
	if cb.Lease.RunID != "w/1" || cb.Lease.Fence <= ca.Lease.Fence || cb.Lease.Attempt != 2 || cb.TookOverFrom != ownerA {
		t.Fatalf("claim after A's lease expired: %+v; want w/1 with a fence above %d, attempt 2, taken over from A", cb, ca.Lease.Fence)
	}
	err := a.InTx(e.ctx, ca.Lease, func(tx checkpoint.Tx) error { return tx.PutStep(completed("load", `1`)) })
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("A's write after the takeover: %v; want ErrFenced", err)
	}
	if err := a.Finish(e.ctx, ca.Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: t0.Add(lease)}); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("A's Finish after the takeover: %v; want ErrFenced", err)
	}
	info := e.run(b, "w/1")
	if st := []string{info.Attempts[0].Status, info.Attempts[1].Status}; !slices.Equal(st, []string{checkpoint.AttemptLost, checkpoint.RunRunning}) {
		t.Errorf("attempts %v; want [lost running]", st)
	}
	e.inTx(b, cb.Lease, func(tx checkpoint.Tx) error { return tx.PutStep(completed("load", `1`)) })
	if err := b.Finish(e.ctx, cb.Lease, checkpoint.Ending{Status: checkpoint.RunInterrupted, At: t0.Add(lease + time.Second)}); err != nil {
		t.Fatal(err)
	}
	// An interrupted queued run is due again; a failed one is not.
	cc := e.next(qa, ownerC, t0.Add(lease+2*time.Second))
	if cc.Lease.RunID != "w/1" || cc.Lease.Attempt != 3 || cc.PreviousStatus != checkpoint.RunInterrupted {
		t.Fatalf("claim of the interrupted run: %+v; want w/1, attempt 3", cc)
	}
	if err := a.Finish(e.ctx, cc.Lease, checkpoint.Ending{Status: checkpoint.RunFailed, Error: "boom", At: t0.Add(lease + 3*time.Second)}); err != nil {
		t.Fatal(err)
	}
	if c := e.next(qb, ownerB, t0.Add(10*lease)); c.Lease.RunID != "" {
		t.Fatalf("claimed the failed run %s; a failed run waits for resume", c.Lease.RunID)
	}
}

// queueConcurrentClaimersNeverShare is the Queue test ConcurrentClaimersNeverShare.
func queueConcurrentClaimersNeverShare(t *testing.T, h Harness) {
	e := newEnv(t, h)
	const runs, hosts, perHost = 40, 4, 2
	var qs []queue
	for range hosts {
		qs = append(qs, capability[queue](t, e.open(), "run queue"))
	}
	for i := range runs {
		e.enqueue(qs[0], enqueueReq(fmt.Sprintf("c/%02d", i), t0.Add(time.Duration(i)*time.Microsecond)))
	}
	var (
		mu      sync.Mutex
		claimed = map[string][]string{}
		taken   atomic.Int32
		wg      sync.WaitGroup
		errs    = make(chan error, hosts*perHost)
	)
	for i := range hosts * perHost {
		q, owner := qs[i%hosts], fmt.Sprintf("host-%d:%d", i%hosts, i)
		wg.Go(func() {
			for misses := 0; taken.Load() < runs && misses < 10_000; {
				c, ok, err := q.ClaimNext(e.ctx, checkpoint.ClaimNextRequest{Owner: owner, Now: t0.Add(time.Second), LeaseFor: lease})
				if err != nil {
					errs <- err
					return
				}
				if !ok {
					misses++
					time.Sleep(time.Millisecond)
					continue
				}
				taken.Add(1)
				mu.Lock()
				claimed[c.Lease.RunID] = append(claimed[c.Lease.RunID], owner)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("claim next: %v", err)
	}
	for id, owners := range claimed {
		if len(owners) != 1 {
			t.Errorf("%s claimed by %v; want one claimer", id, owners)
		}
	}
	if len(claimed) != runs {
		t.Errorf("%d runs claimed; want all %d", len(claimed), runs)
	}
	for id := range claimed {
		if info := e.run(qs[0].(checkpoint.Store), id); info.Run.Fence != 1 || len(info.Attempts) != 1 {
			t.Errorf("%s: fence %d, %d attempts; want 1 and 1", id, info.Run.Fence, len(info.Attempts))
		}
	}
}

// queueLimits is the Queue test Limits.
func queueLimits(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	q := capability[queue](t, st, "run queue")
	limit := checkpoint.Limit{Key: "ledger:main", Max: 1}
	for i := range 3 {
		r := enqueueReq(fmt.Sprintf("settle/%d", i), t0.Add(time.Duration(i)*time.Second))
		r.Limit = limit
		e.enqueue(q, r)
	}
	e.enqueue(q, enqueueReq("free/1", t0.Add(10*time.Second)))
	now := t0.Add(time.Minute)
	var got []string
	for c := e.next(q, ownerA, now); c.Lease.RunID != ""; c = e.next(q, ownerA, now) {
		got = append(got, c.Lease.RunID)
		if c.Lease.RunID == "free/1" {
			if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: now}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if want := []string{"settle/0", "free/1"}; !slices.Equal(got, want) {
		t.Fatalf("claimed %v; want %v: one run of the limit at a time, the others left queued", got, want)
	}
	// A direct claim under the full limit is refused, naming the holder.
	direct := claimReq("settle/9", ownerB, now)
	direct.Limit = limit
	_, err := st.Claim(e.ctx, direct)
	var reached *checkpoint.LimitReachedError
	if !errors.As(err, &reached) || reached.Limit != limit || !slices.Equal(reached.Holders, []string{"settle/0"}) {
		t.Fatalf("direct claim under the full limit: %v; want *checkpoint.LimitReachedError held by [settle/0]", err)
	}
	if _, err := st.Run(e.ctx, "settle/9"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("the refused claim left run settle/9 behind (%v)", err)
	}
	holder := e.run(st, "settle/0").Run
	if holder.Limit != limit {
		t.Errorf("settle/0 records limit %+v; want %+v", holder.Limit, limit)
	}
	if err := st.Finish(e.ctx, checkpoint.Lease{RunID: "settle/0", Fence: holder.Fence, Attempt: 1, Owner: ownerA},
		checkpoint.Ending{Status: checkpoint.RunSucceeded, At: now}); err != nil {
		t.Fatal(err)
	}
	if got := e.nextIDs(q, ownerA, now.Add(time.Second)); !slices.Equal(got, []string{"settle/1"}) {
		t.Fatalf("claimed %v after the holder finished; want [settle/1]", got)
	}
	// A holder whose lease expired holds nothing: a direct claim goes.
	c, err := st.Claim(e.ctx, func() checkpoint.ClaimRequest {
		r := claimReq("settle/9", ownerB, now.Add(2*lease))
		r.Limit = limit
		return r
	}())
	if err != nil {
		t.Fatalf("direct claim once the holder's lease expired: %v", err)
	}
	if c.Run.Limit != limit {
		t.Errorf("the direct claim recorded limit %+v; want %+v", c.Run.Limit, limit)
	}
	// The expired holder settle/1 cannot be reclaimed now; settle/2 waits too.
	if got := e.nextIDs(q, ownerC, now.Add(2*lease)); len(got) != 0 {
		t.Fatalf("claimed %v while settle/9 holds the limit; want none", got)
	}
}

// queueLimitAcrossHosts is the Queue test LimitAcrossHosts.
func queueLimitAcrossHosts(t *testing.T, h Harness) {
	e := newEnv(t, h)
	const runs, hosts, max = 12, 4, 2
	limit := checkpoint.Limit{Key: "job:settle", Max: max}
	var sts []checkpoint.Store
	for range hosts {
		sts = append(sts, e.open())
	}
	for i := range runs / 2 {
		r := enqueueReq(fmt.Sprintf("settle/q%d", i), t0)
		r.Limit = limit
		e.enqueue(capability[queue](t, sts[0], "run queue"), r)
	}
	var (
		started atomic.Int32
		wg      sync.WaitGroup
		errs    = make(chan error, runs*2)
	)
	for i := range hosts {
		st := sts[i]
		q := capability[queue](t, st, "run queue")
		wg.Go(func() {
			for range runs / 2 {
				if _, ok, err := q.ClaimNext(e.ctx, checkpoint.ClaimNextRequest{Owner: fmt.Sprintf("next-%d:1", i), Now: t0, LeaseFor: lease}); err != nil {
					errs <- err
				} else if ok {
					started.Add(1)
				}
			}
		})
		wg.Go(func() {
			for j := range runs / hosts {
				r := claimReq(fmt.Sprintf("settle/d%d-%d", i, j), fmt.Sprintf("direct-%d:1", i), t0)
				r.Limit = limit
				var reached *checkpoint.LimitReachedError
				switch _, err := st.Claim(e.ctx, r); {
				case err == nil:
					started.Add(1)
				case !errors.As(err, &reached):
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, checkpoint.ErrLocked) { // SQLite's busy timeout under this many writers
			t.Fatalf("claim: %v", err)
		}
	}
	if n := started.Load(); n != max {
		t.Fatalf("%d runs started under a limit of %d, claimed from %d hosts at once; want exactly %d", n, max, hosts, max)
	}
}
