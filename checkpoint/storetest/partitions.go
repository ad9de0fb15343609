package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// partitionStore returns st's partitions, or fails the test.
func partitionStore(t *testing.T, st checkpoint.Store) checkpoint.PartitionStore {
	t.Helper()
	return capability[checkpoint.PartitionStore](t, st, "partitions")
}

// splitOf is a step's split into n hash partitions.
func splitOf(n int) []checkpoint.Partition {
	ps := make([]checkpoint.Partition, n)
	for i := range ps {
		ps[i] = checkpoint.Partition{Index: i, Count: n, Rule: checkpoint.PartitionHash, Total: int64(10 + i)}
	}
	return ps
}

// partitioned claims runID and records its step "post" split in n.
func (e *env) partitioned(st checkpoint.Store, runID string, n int) checkpoint.Claim {
	e.t.Helper()
	c := e.claim(st, runID, ownerA, t0)
	head := checkpoint.Step{ID: "post", Status: checkpoint.StepRunning, StartedAt: t0, FinishedAt: t0, Tries: 1}
	ps, err := partitionStore(e.t, st).StartPartitioned(e.ctx, c.Lease, head, splitOf(n))
	if err != nil || len(ps) != n {
		e.t.Fatalf("start partitioned step: %d partitions, %v", len(ps), err)
	}
	return c
}

func (e *env) claimPartition(st checkpoint.Store, owner string, now time.Time) (checkpoint.Partition, checkpoint.PartitionLease, bool) {
	e.t.Helper()
	p, l, ok, err := partitionStore(e.t, st).ClaimPartition(e.ctx, checkpoint.PartitionClaim{Owner: owner, Now: now, LeaseFor: lease})
	if err != nil {
		e.t.Fatalf("claim a partition: %v", err)
	}
	return p, l, ok
}

func partitionItem(l checkpoint.PartitionLease, key string) checkpoint.Item {
	return checkpoint.Item{Step: l.Step, Key: key, Status: checkpoint.StepCompleted, Output: []byte(`1`)}
}

func testPartitions(t *testing.T, h Harness) {
	callerClock(t, h, "RecordedOnceNeverSplitAgain", partitionRecordedOnceNeverSplitAgain)
	callerClock(t, h, "ClaimFenceAndProgress", partitionClaimFenceAndProgress)
	callerClock(t, h, "FailedReopenedByTheNextAttempt", partitionFailedReopenedByTheNextAttempt)
	t.Run("FinishedRunRefusesChunks", func(t *testing.T) { partitionFinishedRunRefusesChunks(t, h) })
	callerClock(t, h, "ReleasedAfterTheRunEnded", partitionReleasedAfterTheRunEnded)
	t.Run("ClaimNarrowedByJob", func(t *testing.T) { partitionClaimNarrowedByJob(t, h) })
	t.Run("ClaimNarrowedByQueue", func(t *testing.T) { partitionClaimNarrowedByQueue(t, h) })
	t.Run("ConcurrentClaimersNeverShare", func(t *testing.T) { partitionConcurrentClaimersNeverShare(t, h) })
	t.Run("FenceRace", func(t *testing.T) { partitionFenceRace(t, h) })
	testPartitionsAcrossReset(t, h)
	testResetRacesChunk(t, h)
}

// partitionRecordedOnceNeverSplitAgain is the Partitions test RecordedOnceNeverSplitAgain.
func partitionRecordedOnceNeverSplitAgain(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	e.partitioned(a, "part/1", 3)
	c := e.claim(b, "part/1", ownerB, t0.Add(2*lease)) // a takeover of the run
	head := checkpoint.Step{ID: "post", Status: checkpoint.StepRunning, StartedAt: t0, FinishedAt: t0, Tries: 2}
	ps, err := partitionStore(t, b).StartPartitioned(e.ctx, c.Lease, head, splitOf(5))
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 3 || ps[2].Total != 12 || ps[0].State != checkpoint.PartitionPending {
		t.Errorf("after a takeover the step has partitions %+v; want the 3 recorded first, pending", ps)
	}
	// The stale owner cannot record a split or a head.
	if _, err := partitionStore(t, a).StartPartitioned(e.ctx, checkpoint.Lease{RunID: "part/1", Fence: 1, Attempt: 1, Owner: ownerA}, head, splitOf(2)); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("a stale owner's StartPartitioned = %v; want ErrFenced", err)
	}
}

// partitionClaimFenceAndProgress is the Partitions test ClaimFenceAndProgress.
func partitionClaimFenceAndProgress(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	e.partitioned(a, "part/2", 2)
	p1, l1, ok1 := e.claimPartition(a, ownerA, t0)
	p2, _, ok2 := e.claimPartition(b, ownerB, t0)
	_, _, ok3 := e.claimPartition(b, ownerC, t0)
	if !ok1 || !ok2 || ok3 || p1.Index == p2.Index || l1.Fence != 1 || p1.State != checkpoint.PartitionRunning || l1.Attempt != 1 {
		t.Fatalf("claims: %+v %v, %+v %v, third %v; want two distinct partitions at fence 1, then none", p1, ok1, p2, ok2, ok3)
	}
	// A chunk: items and progress in one transaction, fenced by the
	// partition.
	w := checkpoint.PartitionWrite{Lease: l1, Now: t0.Add(time.Second), LeaseFor: lease,
		Progress: func() checkpoint.PartitionProgress {
			return checkpoint.PartitionProgress{HighWater: "k1", Done: 1, Executed: 1}
		}}
	if err := partitionStore(t, a).InPartitionTx(e.ctx, w, func(tx checkpoint.Tx) error {
		return tx.PutItems([]checkpoint.Item{partitionItem(l1, "k1")})
	}); err != nil {
		t.Fatal(err)
	}
	// No step checkpoint in a partition's transaction.
	err := partitionStore(t, a).InPartitionTx(e.ctx, w, func(tx checkpoint.Tx) error { return tx.PutStep(completed("summary", `1`)) })
	if err == nil {
		t.Error("PutStep in a partition's transaction succeeded; only the run's owner writes steps")
	}
	// A takeover of the run does not fence the partition.
	e.claim(b, "part/2", ownerB, t0.Add(2*lease))
	w.Now = t0.Add(2*lease + time.Second)
	if err := partitionStore(t, a).InPartitionTx(e.ctx, w, func(tx checkpoint.Tx) error {
		return tx.PutItems([]checkpoint.Item{partitionItem(l1, "k2")})
	}); err != nil {
		t.Errorf("a partition chunk after the run's takeover: %v; want it committed (the partition's fence guards it)", err)
	}
	// Its lease passed: claimed again with a higher fence, the old
	// holder is fenced out and writes nothing.
	p, l, ok := e.claimPartition(b, ownerC, w.Now.Add(2*lease))
	if !ok || p.Index != l1.Index || l.Fence != l1.Fence+1 || p.Done != 1 || p.HighWater != "k1" {
		t.Fatalf("reclaim = %+v %v; want partition %d at fence %d keeping its progress", p, ok, l1.Index, l1.Fence+1)
	}
	err = partitionStore(t, a).InPartitionTx(e.ctx, w, func(tx checkpoint.Tx) error {
		return tx.PutItems([]checkpoint.Item{partitionItem(l1, "k3")})
	})
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("the old holder's chunk = %v; want ErrFenced", err)
	}
	if err := partitionStore(t, a).HeartbeatPartition(e.ctx, l1, w.Now, lease); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("the old holder's heartbeat = %v; want ErrFenced", err)
	}
	if n := len(e.items(b, checkpoint.ItemQuery{RunID: "part/2", Step: "post", Keys: []string{"k3"}})); n != 0 {
		t.Errorf("the fenced chunk left %d items", n)
	}
	// Done: the counters stay, the lease goes.
	w2 := checkpoint.PartitionWrite{Lease: l, Now: w.Now.Add(2 * lease), LeaseFor: lease}
	if err := partitionStore(t, b).EndPartition(e.ctx, w2, checkpoint.PartitionProgress{State: checkpoint.PartitionDone, HighWater: "k2", Done: 2, Executed: 1}); err != nil {
		t.Fatal(err)
	}
	ps, err := partitionStore(t, a).Partitions(e.ctx, "part/2", "")
	if err != nil {
		t.Fatal(err)
	}
	got := ps[l.Index]
	if got.State != checkpoint.PartitionDone || got.Done != 2 || got.Executed != 1 || !got.LeaseUntil.IsZero() || checkpoint.OwnerName(got.Owner) != "host-c:303" {
		t.Errorf("done partition = %+v", got)
	}
	if _, _, ok := e.claimPartition(b, ownerA, w2.Now.Add(10*lease)); !ok {
		t.Error("the other partition, its lease long passed, is not claimable")
	}
	if _, _, ok := e.claimPartition(b, ownerA, w2.Now.Add(10*lease)); ok {
		t.Error("a done partition was claimed")
	}
}

// partitionFailedReopenedByTheNextAttempt is the Partitions test FailedReopenedByTheNextAttempt.
func partitionFailedReopenedByTheNextAttempt(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	e.partitioned(st, "part/3", 1)
	_, l, _ := e.claimPartition(st, ownerA, t0)
	w := checkpoint.PartitionWrite{Lease: l, Now: t0, LeaseFor: lease}
	if err := partitionStore(t, st).EndPartition(e.ctx, w, checkpoint.PartitionProgress{State: checkpoint.PartitionFailed, Error: "boom"}); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := e.claimPartition(st, ownerB, t0.Add(10*lease)); ok {
		t.Fatal("a failed partition was claimed before the run's owner reopened it")
	}
	c := e.claim(st, "part/3", ownerB, t0.Add(2*lease))
	head := checkpoint.Step{ID: "post", Status: checkpoint.StepRunning, StartedAt: t0, Tries: 2}
	ps, err := partitionStore(t, st).StartPartitioned(e.ctx, c.Lease, head, nil)
	if err != nil || ps[0].State != checkpoint.PartitionPending || ps[0].Error != "" || ps[0].Fence != l.Fence+1 {
		t.Fatalf("reopened = %+v, %v; want pending, error cleared, fence raised", ps, err)
	}
}

// partitionFinishedRunRefusesChunks is the Partitions test FinishedRunRefusesChunks.
func partitionFinishedRunRefusesChunks(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.partitioned(st, "part/4", 1)
	_, l, _ := e.claimPartition(st, ownerA, t0)
	if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunFailed, At: t0}); err != nil {
		t.Fatal(err)
	}
	err := partitionStore(t, st).InPartitionTx(e.ctx, checkpoint.PartitionWrite{Lease: l, Now: t0, LeaseFor: lease}, func(tx checkpoint.Tx) error {
		return tx.PutItems([]checkpoint.Item{partitionItem(l, "k1")})
	})
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("a chunk of a failed run = %v; want ErrFenced", err)
	}
}

// partitionReleasedAfterTheRunEnded is the Partitions test ReleasedAfterTheRunEnded.
func partitionReleasedAfterTheRunEnded(t *testing.T, h Harness) {
	// A worker stopping as the run's owner is interrupted hands its
	// partition back even though the run is no longer running; a
	// stale holder's release is fenced.
	e := newEnv(t, h)
	st := e.open()
	c := e.partitioned(st, "part/7", 2)
	_, l, _ := e.claimPartition(st, ownerA, t0)
	_, stale, _ := e.claimPartition(st, ownerB, t0)
	ps := partitionStore(t, st)
	if err := ps.HeartbeatPartition(e.ctx, l, t0.Add(lease/2), lease); err != nil {
		t.Fatal(err)
	}
	if _, again, ok := e.claimPartition(st, ownerC, t0.Add(lease+lease/4)); !ok || again.Index != stale.Index {
		t.Fatalf("a lease-expired partition was not claimed again (got %+v, %v)", again, ok)
	}
	if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunInterrupted, At: t0}); err != nil {
		t.Fatal(err)
	}
	release := checkpoint.PartitionProgress{State: checkpoint.PartitionPending, Done: 3, Executed: 3, HighWater: "k3"}
	if err := ps.EndPartition(e.ctx, checkpoint.PartitionWrite{Lease: l, Now: t0, LeaseFor: lease}, release); err != nil {
		t.Fatalf("releasing a partition of an interrupted run: %v", err)
	}
	if err := ps.EndPartition(e.ctx, checkpoint.PartitionWrite{Lease: stale, Now: t0, LeaseFor: lease}, release); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("a stale holder's release = %v; want ErrFenced", err)
	}
	got, err := ps.Partitions(e.ctx, "part/7", "post")
	if err != nil {
		t.Fatal(err)
	}
	if p := got[l.Index]; p.State != checkpoint.PartitionPending || p.Done != 3 || p.HighWater != "k3" || !p.LeaseUntil.IsZero() {
		t.Errorf("released partition: %+v; want pending, its progress kept, no lease", p)
	}
	if p := got[stale.Index]; p.State != checkpoint.PartitionRunning || p.Done != 0 {
		t.Errorf("the re-claimed partition: %+v; want running under its new holder, untouched by the stale release", p)
	}
}

// partitionClaimNarrowedByJob is the Partitions test ClaimNarrowedByJob.
func partitionClaimNarrowedByJob(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	e.partitioned(st, "part/8", 1)
	info, err := st.Run(e.ctx, "part/8")
	if err != nil {
		t.Fatal(err)
	}
	ps := partitionStore(t, st)
	_, _, ok, err := ps.ClaimPartition(e.ctx, checkpoint.PartitionClaim{Owner: ownerB, Jobs: []string{"another-job"}, Now: t0, LeaseFor: lease})
	if err != nil || ok {
		t.Errorf("a claim for another job's partitions = %v, %v; want none", ok, err)
	}
	_, _, ok, err = ps.ClaimPartition(e.ctx, checkpoint.PartitionClaim{Owner: ownerB, Jobs: []string{"another-job", info.Run.Job}, Now: t0, LeaseFor: lease})
	if err != nil || !ok {
		t.Errorf("a claim naming the run's job %q = %v, %v; want its partition", info.Run.Job, ok, err)
	}
}

// partitionClaimNarrowedByQueue is the Partitions test ClaimNarrowedByQueue.
func partitionClaimNarrowedByQueue(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	e.partitioned(st, "part/direct", 1) // started directly: in no queue
	q := capability[checkpoint.QueueStore](t, st, "queue")
	req := enqueueReq("part/queued", t0)
	req.Queue = "nightly"
	e.enqueue(q, req)
	c := e.next(q, ownerA, t0, "nightly")
	if c.Lease.RunID != "part/queued" {
		t.Fatalf("claim next of queue nightly = %q; want part/queued", c.Lease.RunID)
	}
	head := checkpoint.Step{ID: "post", Status: checkpoint.StepRunning, StartedAt: t0, FinishedAt: t0, Tries: 1}
	if _, err := partitionStore(t, st).StartPartitioned(e.ctx, c.Lease, head, splitOf(1)); err != nil {
		t.Fatal(err)
	}
	ps := partitionStore(t, st)
	claim := func(queues ...string) string {
		t.Helper()
		p, _, ok, err := ps.ClaimPartition(e.ctx, checkpoint.PartitionClaim{Owner: ownerB, Queues: queues, Now: t0, LeaseFor: lease})
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return ""
		}
		return p.RunID
	}
	if got := claim("other"); got != "" {
		t.Errorf("a claim for queue other took a partition of %s; want none", got)
	}
	if got := claim("other", "nightly"); got != "part/queued" {
		t.Errorf("a claim for queues other, nightly took a partition of %q; want part/queued's", got)
	}
	if got := claim("nightly"); got != "" {
		t.Errorf("a second claim for queue nightly took a partition of %s; want none (the run started directly is in no queue)", got)
	}
	if got := claim(); got != "part/direct" {
		t.Errorf("a claim for every queue took a partition of %q; want the directly started part/direct's", got)
	}
}

// partitionConcurrentClaimersNeverShare is the Partitions test ConcurrentClaimersNeverShare.
func partitionConcurrentClaimersNeverShare(t *testing.T, h Harness) {
	e := newEnv(t, h)
	const n, claimers = 24, 6
	e.partitioned(e.open(), "part/5", n)
	var mu sync.Mutex
	got := map[int][]string{}
	var wg sync.WaitGroup
	for i := range claimers {
		st := e.open()
		owner := fmt.Sprintf("claimer-%d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				p, _, ok, err := partitionStore(t, st).ClaimPartition(e.ctx, checkpoint.PartitionClaim{Owner: owner, Now: t0, LeaseFor: lease})
				if err != nil {
					t.Errorf("%s: %v", owner, err)
					return
				}
				if !ok {
					return
				}
				mu.Lock()
				got[p.Index] = append(got[p.Index], owner)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for i := range n {
		if len(got[i]) != 1 {
			t.Errorf("partition %d claimed by %v; want exactly one claimer", i, got[i])
		}
	}
}

// partitionFenceRace is the Partitions test FenceRace.
func partitionFenceRace(t *testing.T, h Harness) {
	// A's chunk and B's claim of A's lease-expired partition race:
	// either A commits before B's claim (B then sees A's item), or A
	// is fenced and keeps nothing. A naive store (checking the fence
	// with a plain read) lets A commit after B claimed.
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	rounds := max(h.Rounds/4, 10)
	e.partitioned(a, "part/6", rounds)
	now := t0
	for round := range rounds {
		_, l, ok := e.claimPartition(a, ownerA, now)
		if !ok {
			t.Fatalf("round %d: nothing to claim", round)
		}
		key := fmt.Sprintf("r%03d", round)
		later := now.Add(2 * lease)
		inside := make(chan struct{})
		var aErr error
		done := make(chan struct{})
		go func() {
			defer close(done)
			aErr = partitionStore(t, a).InPartitionTx(e.ctx, checkpoint.PartitionWrite{Lease: l, Now: now, LeaseFor: lease}, func(tx checkpoint.Tx) error {
				if err := tx.PutItems([]checkpoint.Item{partitionItem(l, key)}); err != nil {
					return err
				}
				close(inside)
				time.Sleep(h.BlockFor)
				return nil
			})
		}()
		<-inside
		req := checkpoint.PartitionClaim{RunID: l.RunID, Step: l.Step, Index: l.Index, AtFence: l.Fence, Owner: ownerB, Now: later, LeaseFor: lease}
		_, _, bOK, err := partitionStore(t, b).ClaimPartition(e.ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		if bOK {
			seen = len(e.items(b, checkpoint.ItemQuery{RunID: l.RunID, Step: l.Step, Keys: []string{key}}))
		}
		<-done
		kept := len(e.items(b, checkpoint.ItemQuery{RunID: l.RunID, Step: l.Step, Keys: []string{key}}))
		switch {
		case aErr == nil && kept != 1:
			t.Errorf("round %d: A committed but its item is not kept", round)
		case aErr != nil && (kept != 0 || !errors.Is(aErr, checkpoint.ErrFenced)):
			t.Errorf("round %d: A failed (%v) and %d items kept; want ErrFenced and none", round, aErr, kept)
		case aErr == nil && bOK && seen == 0:
			t.Fatalf("round %d: A committed after B claimed its partition: the partition's fence did not hold to A's commit", round)
		}
	}
}

// testPartitionsAcrossReset checks what a reset of a partitioned step
// leaves for the step's next split.
func testPartitionsAcrossReset(t *testing.T, h Harness) {
	t.Run("ResetRestartsPartitionFence", func(t *testing.T) {
		// A partition's fence names its effects (p<idx>.<fence>.c<chunk>):
		// after a reset of the step it must not repeat a fence used before.
		e := newEnv(t, h)
		st := e.open()
		c := e.partitioned(st, "part/refence", 1)
		_, l1, _ := e.claimPartition(st, ownerA, t0)
		if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunFailed, At: t0}); err != nil {
			t.Fatal(err)
		}
		op := capability[operator](t, st, "operator actions")
		now := t0.Add(time.Second)
		if err := op.ResetSteps(e.ctx, audit("part/refence", "reset", now), now, []string{"post"}); err != nil {
			t.Fatal(err)
		}
		c2 := e.claim(st, "part/refence", ownerB, now)
		head := checkpoint.Step{ID: "post", Status: checkpoint.StepRunning, StartedAt: now, FinishedAt: now, Tries: 1}
		if _, err := partitionStore(t, st).StartPartitioned(e.ctx, c2.Lease, head, splitOf(1)); err != nil {
			t.Fatal(err)
		}
		_, l2, _ := e.claimPartition(st, ownerB, now)
		if l2.Fence <= l1.Fence {
			t.Errorf("after reset partition 0 is claimed at fence %d again (before the reset: %d): its effect IDs repeat the pre-reset ones", l2.Fence, l1.Fence)
		}
	})
}

// testResetRacesChunk checks that a reset of a partitioned step and a
// chunk of it in flight are serialised: the chunk's items do not outlive
// the reset.
func testResetRacesChunk(t *testing.T, h Harness) {
	callerClock(t, h, "ResetRacesChunk", func(t *testing.T, h Harness) {
		// The run's owner is gone (run lease expired) while a partition
		// holder is mid-chunk; an operator resets the batch step. After
		// the reset nothing of the step may remain.
		e := newEnv(t, h)
		a, b := e.open(), e.open()
		e.partitioned(a, "part/review", 1)
		_, l, ok := e.claimPartition(a, ownerA, t0)
		if !ok {
			t.Fatal("nothing to claim")
		}
		g := openTarget(t, e.ctx, a, checkpoint.StateTable)
		inside, done := make(chan struct{}), make(chan struct{})
		var aErr error
		go func() {
			defer close(done)
			aErr = partitionStore(t, a).InPartitionTx(e.ctx, checkpoint.PartitionWrite{Lease: l, Now: t0, LeaseFor: lease}, func(tx checkpoint.Tx) error {
				// As a chunk does: read (lock) its target rows, write them.
				if _, err := g.add(tx, "acct:review", 100); err != nil {
					return err
				}
				if err := tx.PutItems([]checkpoint.Item{partitionItem(l, "k1")}); err != nil {
					return err
				}
				close(inside)
				time.Sleep(200 * time.Millisecond)
				return nil
			})
		}()
		<-inside
		op := capability[operator](t, b, "operator actions")
		now := t0.Add(2 * lease)
		if err := op.ResetSteps(e.ctx, audit("part/review", "reset", now), now, []string{"post"}); err != nil {
			t.Fatalf("reset: %v", err)
		}
		<-done
		left := e.items(b, checkpoint.ItemQuery{RunID: "part/review", Step: "post"})
		ps, _ := partitionStore(t, b).Partitions(e.ctx, "part/review", "post")
		st, _ := g.states("acct:review")
		t.Logf("chunk err=%v; after reset: %d items, %d partitions, target %+v", aErr, len(left), len(ps), st["acct:review"])
		if len(left) != 0 {
			t.Errorf("reset of step post left %d item(s) %v committed by a partition chunk that raced it (chunk err %v); partitions now %d",
				len(left), left[0].Key, aErr, len(ps))
		}
	})
}
