package runner_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
)

// goneOwner is the owner string of a process of this host and PID
// namespace that exited and was reaped: what a runner killed with SIGKILL
// leaves in its leases.
func goneOwner(t *testing.T) string {
	t.Helper()
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	name, details, ok := strings.Cut(runner.DefaultOwner(), " ")
	if !ok {
		t.Fatalf("this process's owner %q has no boot and PID namespace: no owner can be found gone here", runner.DefaultOwner())
	}
	owner := fmt.Sprintf("%s:%d %s", name[:strings.LastIndexByte(name, ':')], c.Process.Pid, details)
	if !runner.OwnerGone(owner) {
		t.Fatalf("the exited process's owner %q is not found gone", owner)
	}
	return owner
}

// TestWorkerTakesOverAGoneRunnersPartitionAtOnce: a partition held under
// an hour's lease by a runner of this host whose process is gone is taken
// over and worked by an idle worker at once, at a raised fence, while the
// run's owner (alive) is still busy in its own partition: before, it
// waited for the lease or for the owner's review.
func TestWorkerTakesOverAGoneRunnersPartitionAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	gate, ownerIn := h.gatedPartitions(1)
	owner := h.runner(func(c *runner.Config) { c.Owner = "owner"; c.PartitionSlots = 1 })
	ownerDone := make(chan error, 1)
	go func() {
		res, err := owner.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
		if err == nil && res.Status != checkpoint.RunSucceeded {
			err = fmt.Errorf("run ended %s", res.Status)
		}
		ownerDone <- err
	}()
	defer func() {
		close(gate)
		if err := <-ownerDone; err != nil {
			t.Errorf("the owner's run: %v", err)
		}
	}()
	<-ownerIn
	gone := goneOwner(t)
	p, _, ok, err := h.st.ClaimPartition(context.Background(), checkpoint.PartitionClaim{Owner: gone, Now: time.Now(), LeaseFor: time.Hour})
	if err != nil || !ok || p.Index != 1 {
		t.Fatalf("claim of partition 1 for the gone runner: %+v, %v, %v", p, ok, err)
	}
	w, err := runner.NewWorker(runner.WorkerConfig{Runner: runner.Config{Store: h.st, Jobs: h.reg, Owner: "worker"}, Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	workerDone := make(chan error, 1)
	go func() { workerDone <- w.Run(ctx) }()
	defer func() {
		stop()
		if err := <-workerDone; err != nil {
			t.Errorf("worker: %v", err)
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ps, err := h.st.Partitions(context.Background(), p.RunID, "items")
		if err != nil {
			t.Fatal(err)
		}
		if q := ps[1]; q.State == checkpoint.PartitionDone {
			if q.Owner != "worker" || q.Fence != p.Fence+1 || q.Finished() != 10 {
				t.Errorf("partition 1 done as %+v; want by the worker at fence %d, 10 items", q, p.Fence+1)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition 1, its runner gone, not taken over within 30s of an hour's lease: %+v", ps[1])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
