package runner_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// unrenewable is a real store whose partition heartbeats fail as if the
// database were unreachable: the partition's holder cannot renew its
// lease, and its chunks (which would renew it too) never get to commit.
type unrenewable struct {
	checkpoint.Backend
}

func (unrenewable) HeartbeatPartition(context.Context, checkpoint.PartitionLease, time.Time, time.Duration) error {
	return errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
}

// partitionKeys are the partitioned test step's items: with two
// partitions split by key range, k00..k09 and k10..k19.
func partitionKeys() []string {
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%02d", i)
	}
	return keys
}

// TestPartitionHolderSelfFences has a worker claim a partition and then
// fail every heartbeat, on a fake clock: at the claim time plus the lease
// less the self-fence margin, and not before, its items' context ends
// with a *steps.PartitionLeaseLostError, it releases the partition, and
// the run's owner then works that partition too: the run succeeds with
// every item finished.
func TestPartitionHolderSelfFences(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	gate := make(chan struct{})     // the owner's first item waits for it
	ownerIn := make(chan struct{})  // closed: the owner is in its first item
	workerIn := make(chan struct{}) // closed: the worker is in its first item
	seen := make(chan observed, 1)  // what the worker's item saw as its context ended
	var ownerOnce sync.Once
	var workerFirst atomic.Bool
	clock := newSleepClock(time.Now())
	h.body = func(ctx context.Context, run *steps.Run, _ jobParams) error {
		_, err := steps.ForEach(ctx, run, "items", steps.Slice(partitionKeys(), func(k string) string { return k }),
			func(ctx context.Context, k string, _ *steps.Effects) (string, error) {
				switch {
				case k == "k00": // partition 0: the owner's (it claims first)
					ownerOnce.Do(func() { close(ownerIn) })
					<-gate
				case k == "k10" && workerFirst.CompareAndSwap(false, true): // partition 1: the worker's
					close(workerIn)
					<-ctx.Done()
					seen <- observed{at: clock.Now(), cause: context.Cause(ctx)}
					return "", ctx.Err()
				}
				return k, nil
			}, steps.Partitions(2), steps.ChunkSize(1))
		return err
	}
	owner, err := runner.New(runner.Config{Store: h.st, Jobs: h.reg, Owner: "owner", PartitionSlots: 1})
	if err != nil {
		t.Fatal(err)
	}
	type ended struct {
		res runner.Result
		err error
	}
	ownerDone := make(chan ended, 1)
	go func() {
		res, err := owner.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
		ownerDone <- ended{res, err}
	}()
	select {
	case <-ownerIn:
	case e := <-ownerDone:
		t.Fatalf("the owner ended before working its partition: %q, %v", e.res.Status, e.err)
	}

	w, err := runner.New(runner.Config{Store: unrenewable{h.st}, Jobs: h.reg, Owner: "worker", Clock: clock, Lease: fenceLease})
	if err != nil {
		t.Fatal(err)
	}
	start := clock.Now()
	workerDone := make(chan error, 1)
	go func() {
		worked, err := w.WorkPartition(context.Background(), "")
		if !worked && err == nil {
			err = errors.New("no partition claimed")
		}
		workerDone <- err
	}()
	select {
	case <-workerIn:
	case err := <-workerDone:
		t.Fatalf("the worker ended before working partition 1: %v", err)
	}
	stopWaking := make(chan struct{})
	waking := make(chan struct{})
	go func() {
		defer close(waking)
		for {
			if _, ok := clock.wakeNext(t, stopWaking); !ok {
				return
			}
		}
	}()
	var obs observed
	select {
	case obs = <-seen:
	case <-time.After(30 * time.Second):
		t.Fatal("the worker's item was not cancelled within 30s of real time")
	}
	close(stopWaking)
	<-waking

	margin := fenceLease / 3 // runner.Config.SelfFenceMargin's default
	var lost *steps.PartitionLeaseLostError
	switch {
	case !errors.As(obs.cause, &lost):
		t.Fatalf("the worker's item ended with %v, want a *steps.PartitionLeaseLostError", obs.cause)
	case !obs.at.Equal(start.Add(fenceLease - margin)):
		t.Errorf("the worker stopped at %s after its claim, want %s (the lease less the margin)", obs.at.Sub(start), fenceLease-margin)
	case !lost.Expiry.Equal(start.Add(fenceLease)) || lost.Margin != margin || lost.Failures < 1 || lost.LastErr == nil || lost.Index != 1:
		t.Errorf("lease lost: %+v; want partition 1, expiry at the claim plus %s, margin %s, failed renewals", lost, fenceLease, margin)
	}
	if err := <-workerDone; !errors.Is(err, steps.ErrPartitionLeaseLost) {
		t.Errorf("WorkPartition returned %v, want steps.ErrPartitionLeaseLost", err)
	}
	ps, err := h.st.Partitions(context.Background(), testRunID, "items")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[1].State != checkpoint.PartitionPending || ps[1].Owner != "worker" || ps[1].Done != 0 {
		t.Fatalf("partitions after the self-fence: %+v; want partition 1 released (pending), nothing of it done", ps)
	}

	close(gate)
	e := <-ownerDone
	if e.err != nil || e.res.Status != checkpoint.RunSucceeded {
		t.Fatalf("owner: %q, %v", e.res.Status, e.err)
	}
	counts, err := h.st.ItemCounts(context.Background(), testRunID)
	if err != nil {
		t.Fatal(err)
	}
	var done int64
	for _, c := range counts {
		if c.Step == "items" && c.Status == checkpoint.StepCompleted {
			done += c.Count
		}
	}
	if done != 20 {
		t.Errorf("%d items completed, want 20: %+v", done, counts)
	}
}

// TestPartitionWorkerReportsProgress: a partition worker's replay gets the
// runner's hooks as the run's owner does (one steps.Config), so the
// chunks of the partition it works report progress to Config.OnProgress:
// the partition's items, a chunk at a time, up to all of them.
func TestPartitionWorkerReportsProgress(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	gate, ownerIn := h.gatedPartitions(2)
	owner, err := runner.New(runner.Config{Store: h.st, Jobs: h.reg, Owner: "owner", PartitionSlots: 1})
	if err != nil {
		t.Fatal(err)
	}
	ownerDone := make(chan error, 1)
	go func() {
		_, err := owner.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
		ownerDone <- err
	}()
	select {
	case <-ownerIn:
	case err := <-ownerDone:
		t.Fatalf("the owner ended before working its partition: %v", err)
	}
	var (
		mu   sync.Mutex
		seen []steps.Progress
	)
	w, err := runner.New(runner.Config{Store: h.st, Jobs: h.reg, Owner: "worker", OnProgress: func(p steps.Progress) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, p)
	}})
	if err != nil {
		t.Fatal(err)
	}
	worked, err := w.WorkPartition(context.Background(), "")
	close(gate)
	if !worked || err != nil {
		t.Fatalf("WorkPartition = %v, %v; want partition 1 worked", worked, err)
	}
	if err := <-ownerDone; err != nil {
		t.Fatalf("owner: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) < 5 {
		t.Fatalf("the worker's partition reported progress %d times (%+v); want once per chunk of its 10 items, 5 chunks of 2", len(seen), seen)
	}
	for i, p := range seen {
		if p.Step != "items" || p.Total != 10 || (i > 0 && p.Done < seen[i-1].Done) {
			t.Errorf("report %d = %+v; want step items, total 10 (partition 1's), done never going back", i, p)
		}
	}
	if last := seen[len(seen)-1]; last.Done != 10 {
		t.Errorf("the last report = %+v; want all 10 of the partition's items done", last)
	}
}

// gatedPartitions makes h's job one batch step over partitionKeys in two
// partitions of chunk items a chunk, whose first item of partition 0 (the
// run's owner's: it claims first) closes ownerIn and waits for gate to be
// closed; the other items pass at once.
func (h *harness) gatedPartitions(chunk int) (gate, ownerIn chan struct{}) {
	gate, ownerIn = make(chan struct{}), make(chan struct{})
	var ownerOnce sync.Once
	h.body = func(ctx context.Context, run *steps.Run, _ jobParams) error {
		_, err := steps.ForEach(ctx, run, "items", steps.Slice(partitionKeys(), func(k string) string { return k }),
			func(ctx context.Context, k string, _ *steps.Effects) (string, error) {
				if k == "k00" {
					ownerOnce.Do(func() { close(ownerIn) })
					<-gate
				}
				return k, nil
			}, steps.Partitions(2), steps.ChunkSize(chunk))
		return err
	}
	return gate, ownerIn
}
