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

// detailsA are ownerA's details: the host and PID namespace a runner on
// it asks HeldLeases about.
const detailsA = "boot=1 pidns=1"

func testTakeover(t *testing.T, h Harness) {
	callerClock(t, h, "HeldLeasesOfOneHost", takeoverHeldLeasesOfOneHost)
	callerClock(t, h, "RunTakenOverAtItsFence", takeoverRunAtItsFence)
	callerClock(t, h, "PartitionTakenOverAtItsFence", takeoverPartitionAtItsFence)
	t.Run("ConcurrentTakeoversNeverShare", func(t *testing.T) { takeoverConcurrentNeverShare(t, h) })
}

// heldSetup records, at t0: queued run q/a claimed by A and q/b by B; run
// d/1 claimed directly by A (never enqueued); run p/1 claimed directly
// by A with step post split in 3, partition 0 claimed by A, 1 by B, 2
// pending.
func (e *env) heldSetup(st checkpoint.Store) (qa, qb checkpoint.Claim, pa checkpoint.PartitionLease) {
	e.t.Helper()
	q := capability[queue](e.t, st, "run queue")
	e.enqueue(q, enqueueReq("q/a", t0))
	qa = e.next(q, ownerA, t0)
	e.enqueue(q, enqueueReq("q/b", t0))
	qb = e.next(q, ownerB, t0)
	if qa.Lease.RunID != "q/a" || qb.Lease.RunID != "q/b" {
		e.t.Fatalf("claims = %s, %s; want q/a, q/b", qa.Lease.RunID, qb.Lease.RunID)
	}
	e.claim(st, "d/1", ownerA, t0)
	e.partitioned(st, "p/1", 3)
	_, pa, okA := e.claimPartition(st, ownerA, t0)
	_, _, okB := e.claimPartition(st, ownerB, t0)
	if !okA || !okB {
		e.t.Fatal("partition claims failed")
	}
	return qa, qb, pa
}

func heldNames(hs []checkpoint.HeldLease) []string {
	var out []string
	for _, h := range hs {
		name := h.RunID
		if !h.IsRun() {
			name = fmt.Sprintf("%s %s#%d", h.RunID, h.Step, h.Index)
		}
		out = append(out, name+" "+checkpoint.OwnerName(h.Owner))
	}
	return out
}

func takeoverHeldLeasesOfOneHost(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	qa, _, pa := e.heldSetup(st)
	ts := capability[checkpoint.TakeoverStore](t, st, "take-over")
	held, err := ts.HeldLeases(e.ctx, detailsA, t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"q/a host-a:101", "p/1 post#0 host-a:101"}
	if got := heldNames(held); !slices.Equal(got, want) {
		t.Fatalf("HeldLeases(%q) = %q; want %q (queued runs, then partitions; not a run never enqueued, not another host's)", detailsA, got, want)
	}
	r, p := held[0], held[1]
	if r.Job != "q" || r.Queue != checkpoint.DefaultQueue || r.Owner != ownerA || r.Fence != qa.Lease.Fence || !sameTime(r.LeaseUntil, t0.Add(lease)) {
		t.Errorf("the run's lease = %+v; want job q, queue %s, owner %q, fence %d, until %s", r, checkpoint.DefaultQueue, ownerA, qa.Lease.Fence, t0.Add(lease))
	}
	if p.Job != "p" || p.Queue != "" || p.Fence != pa.Fence || p.Index != pa.Index || p.Owner != ownerA {
		t.Errorf("the partition's lease = %+v; want job p, no queue, fence %d, index %d, owner %q", p, pa.Fence, pa.Index, ownerA)
	}
	all, err := ts.HeldLeases(e.ctx, "", t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	want = []string{"q/a host-a:101", "q/b host-b:202", "p/1 post#0 host-a:101", "p/1 post#1 host-b:202"}
	if got := heldNames(all); !slices.Equal(got, want) {
		t.Errorf("HeldLeases(\"\") = %q; want %q", got, want)
	}
	for _, details := range []string{"boot=1", "pidns=1", "host-a:101 boot=1 pidns=1", "boot=1 pidns=1 "} {
		if hs, err := ts.HeldLeases(e.ctx, details, t0.Add(time.Second)); err != nil || len(hs) != 0 {
			t.Errorf("HeldLeases(%q) = %q, %v; want none: details match whole", details, heldNames(hs), err)
		}
	}
	if hs, err := ts.HeldLeases(e.ctx, detailsA, t0.Add(lease)); err != nil || len(hs) != 0 {
		t.Errorf("HeldLeases once the leases expired = %q, %v; want none (expired leases are every claim's)", heldNames(hs), err)
	}
}

func takeoverRunAtItsFence(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, c := e.open(), e.open()
	qa, _, _ := e.heldSetup(a)
	ts := capability[checkpoint.TakeoverStore](t, c, "take-over")
	at := t0.Add(time.Second)
	req := checkpoint.TakeOverRequest{RunID: "q/a", AtFence: qa.Lease.Fence, Owner: ownerC, Now: at, LeaseFor: lease}
	for _, bad := range []checkpoint.TakeOverRequest{{RunID: "q/a", Owner: ownerC, Now: at, LeaseFor: lease}, {AtFence: 1, Owner: ownerC, Now: at, LeaseFor: lease}} {
		if _, _, err := ts.TakeOverRun(e.ctx, bad); err == nil {
			t.Errorf("TakeOverRun(%+v) = nil error; want the request refused", bad)
		}
	}
	wrong := req
	wrong.AtFence++
	if _, ok, err := ts.TakeOverRun(e.ctx, wrong); err != nil || ok {
		t.Fatalf("take-over at another fence = %v, %v; want nothing taken", ok, err)
	}
	got, ok, err := ts.TakeOverRun(e.ctx, req)
	if err != nil || !ok {
		t.Fatalf("take-over = %v, %v; want the run taken", ok, err)
	}
	if got.Lease.Fence != qa.Lease.Fence+1 || got.Lease.Attempt != 2 || got.Lease.Owner != ownerC || got.TookOverFrom != ownerA ||
		!sameTime(got.PreviousLeaseUntil, t0.Add(lease)) || got.PreviousStatus != checkpoint.RunRunning ||
		got.Run.LeaseOwner != ownerC || !sameTime(got.Run.LeaseUntil, at.Add(lease)) || got.Run.Queue != checkpoint.DefaultQueue {
		t.Errorf("take-over = %+v; want fence %d, attempt 2, owner C, taken from A whose lease ran to %s, still queued in %s",
			got, qa.Lease.Fence+1, t0.Add(lease), checkpoint.DefaultQueue)
	}
	info := e.run(c, "q/a")
	if st := []string{info.Attempts[0].Status, info.Attempts[1].Status}; !slices.Equal(st, []string{checkpoint.AttemptLost, checkpoint.RunRunning}) {
		t.Errorf("attempts %v; want [lost running]", st)
	}
	if err := a.InTx(e.ctx, qa.Lease, func(tx checkpoint.Tx) error { return tx.PutStep(completed("load", `1`)) }); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("A's write after the take-over: %v; want ErrFenced", err)
	}
	if _, ok, err := ts.TakeOverRun(e.ctx, req); err != nil || ok {
		t.Errorf("a second take-over at the old fence = %v, %v; want nothing taken", ok, err)
	}
	// Only a running queued run is taken: not one started directly, not
	// one that ended, not one that does not exist.
	d := e.run(a, "d/1")
	if _, ok, err := ts.TakeOverRun(e.ctx, checkpoint.TakeOverRequest{RunID: "d/1", AtFence: d.Run.Fence, Owner: ownerC, Now: at, LeaseFor: lease}); err != nil || ok {
		t.Errorf("take-over of a run never enqueued = %v, %v; want nothing taken", ok, err)
	}
	if err := c.Finish(e.ctx, got.Lease, checkpoint.Ending{Status: checkpoint.RunFailed, Error: "boom", At: at}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ts.TakeOverRun(e.ctx, checkpoint.TakeOverRequest{RunID: "q/a", AtFence: got.Lease.Fence, Owner: ownerB, Now: at, LeaseFor: lease}); err != nil || ok {
		t.Errorf("take-over of a failed run = %v, %v; want nothing taken (a failed run waits for resume)", ok, err)
	}
	if _, ok, err := ts.TakeOverRun(e.ctx, checkpoint.TakeOverRequest{RunID: "q/none", AtFence: 1, Owner: ownerB, Now: at, LeaseFor: lease}); err != nil || ok {
		t.Errorf("take-over of no run = %v, %v; want nothing taken", ok, err)
	}
}

func takeoverPartitionAtItsFence(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, c := e.open(), e.open()
	_, _, pa := e.heldSetup(a)
	at := t0.Add(time.Second)
	req := checkpoint.PartitionClaim{RunID: pa.RunID, Step: pa.Step, Index: pa.Index, AtFence: pa.Fence, Owner: ownerC, Now: at, LeaseFor: lease}
	p, l, ok, err := partitionStore(t, c).ClaimPartition(e.ctx, req)
	if err != nil || !ok || l.Fence != pa.Fence+1 || p.Owner != ownerC || p.State != checkpoint.PartitionRunning {
		t.Fatalf("take-over of A's partition = %+v, %+v, %v, %v; want it running for C at fence %d", p, l, ok, err, pa.Fence+1)
	}
	w := checkpoint.PartitionWrite{Lease: pa, Now: at, LeaseFor: lease}
	if err := partitionStore(t, a).InPartitionTx(e.ctx, w, func(tx checkpoint.Tx) error {
		return tx.PutItems([]checkpoint.Item{partitionItem(pa, "k1")})
	}); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("A's chunk after the take-over: %v; want ErrFenced", err)
	}
	if _, _, ok, err := partitionStore(t, c).ClaimPartition(e.ctx, req); err != nil || ok {
		t.Errorf("a second take-over at the old fence = %v, %v; want nothing taken", ok, err)
	}
	held, err := capability[checkpoint.TakeoverStore](t, c, "take-over").HeldLeases(e.ctx, detailsA, at)
	if err != nil {
		t.Fatal(err)
	}
	if got := heldNames(held); !slices.Equal(got, []string{"q/a host-a:101"}) {
		t.Errorf("A's leases after the take-over = %q; want only its run q/a", got)
	}
}

func takeoverConcurrentNeverShare(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	q := capability[queue](t, st, "run queue")
	e.enqueue(q, enqueueReq("q/a", time.Now()))
	qa := e.next(q, ownerA, time.Now())
	const n = 4
	var wg sync.WaitGroup
	got := make([]bool, n)
	errs := make([]error, n)
	for i := range n {
		ts := capability[checkpoint.TakeoverStore](t, e.open(), "take-over")
		wg.Go(func() {
			_, got[i], errs[i] = ts.TakeOverRun(e.ctx, checkpoint.TakeOverRequest{RunID: "q/a", AtFence: qa.Lease.Fence,
				Owner: fmt.Sprintf("host-c:%d boot=3 pidns=3", 400+i), Now: time.Now(), LeaseFor: lease})
		})
	}
	wg.Wait()
	taken := 0
	for i := range n {
		if errs[i] != nil {
			t.Errorf("take-over %d: %v", i, errs[i])
		}
		if got[i] {
			taken++
		}
	}
	if taken != 1 {
		t.Fatalf("%d concurrent take-overs of one run at one fence succeeded; want exactly 1", taken)
	}
	if info := e.run(st, "q/a"); info.Run.Fence != qa.Lease.Fence+1 || len(info.Attempts) != 2 {
		t.Errorf("after the take-overs: fence %d, %d attempts; want fence %d, 2 attempts", info.Run.Fence, len(info.Attempts), qa.Lease.Fence+1)
	}
}
