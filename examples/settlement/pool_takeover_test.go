package settlement_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// takeoverLease is the workers' lease in the take-over test: long, so
// that work moving on within it can only be the take-over of a runner
// known gone. TAKEOVER_LEASE overrides it (to measure with the default
// 30s, say).
func takeoverLease(t *testing.T) time.Duration {
	if v := os.Getenv("TAKEOVER_LEASE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("TAKEOVER_LEASE=%q: %v", v, err)
		}
		return d
	}
	return 60 * time.Second
}

// takeoverLedger is smallLedger with more transfers, so the post step
// lasts long enough for a worker's second slot to claim a partition.
var takeoverLedger = settlement.SeedConfig{Accounts: 50, Transfers: 4000, Date: testDate, Seed: 7, Balance: 10_000}

// held is who holds a run and its partitions, and at which fences.
type held struct {
	runOwner string
	runFence int64
	parts    map[int]checkpoint.Partition // the running ones, by index
}

func readHeld(t *testing.T, st checkpoint.Backend, runID string) held {
	t.Helper()
	info, err := st.Run(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	h := held{runOwner: checkpoint.OwnerName(info.Run.LeaseOwner), runFence: info.Run.Fence, parts: map[int]checkpoint.Partition{}}
	ps, err := st.Partitions(context.Background(), runID, "post")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.State == checkpoint.PartitionRunning {
			h.parts[p.Index] = p
		}
	}
	return h
}

// String shows h briefly.
func (h held) String() string {
	var ps []checkpoint.Partition
	for _, p := range h.parts {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b checkpoint.Partition) int { return a.Index - b.Index })
	return fmt.Sprintf("run held by %s at fence %d; running partitions: %s", h.runOwner, h.runFence, states(ps))
}

// movedOn reports whether everything before held is now held by another
// runner under a higher fence (or done).
func (before held) movedOn(t *testing.T, st checkpoint.Backend, runID string) bool {
	now := readHeld(t, st, runID)
	if now.runFence <= before.runFence {
		return false
	}
	ps, err := st.Partitions(context.Background(), runID, "post")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if b, ok := before.parts[p.Index]; ok && p.Fence <= b.Fence {
			return false
		}
	}
	return true
}

// TestGoneWorkersWorkIsTakenOverAtOnce: a worker (--concurrency 3)
// holding a partitioned settlement's run and both its partitions is
// killed with SIGKILL while three idle workers on the same host wait.
// They take the run and both partitions over at once, well within the
// 60s lease (the owner is surely gone: same boot and PID namespace, PID
// dead), each at a raised fence; while the worker was only stopped
// (SIGSTOP, alive) nothing moved. The run succeeds, every transfer
// exactly once, money conserved.
func TestGoneWorkersWorkIsTakenOverAtOnce(t *testing.T) {
	t.Parallel()
	for _, l := range layouts(t)[:2] {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			lease := takeoverLease(t)
			s := newStore(t, l, takeoverLedger)
			runID := jobs.RunID(settlement.Job.Name(), testDate)
			// Chunks of 5 of ~2,000 transfers a partition: the pause at the
			// 200th lands mid-post, both partitions claimed by then.
			spec := workerSpec(s.db, lease, 3)
			spec.Env = append(spec.Env, crashtest.PauseAt("step:post#200:after-commit"))
			a := crashtest.Start(t, spec)
			enqueue(t, s.db, settlement.Job.Name(), settleParams(s, 5, 2))
			a.WaitStopped()
			st := s.open(t)
			defer st.Close()
			nameA := "?"
			if host, err := os.Hostname(); err == nil {
				nameA = host + ":" + strconv.Itoa(a.Pid())
			}
			before := readHeld(t, st, runID)
			var partsA []int
			for i, p := range before.parts {
				if checkpoint.OwnerName(p.Owner) == nameA {
					partsA = append(partsA, i)
				}
			}
			if before.runOwner != nameA || len(partsA) != 2 {
				t.Fatalf("when A stopped: run held by %q, partitions %v by A (%s); want the run and both partitions A's", before.runOwner, partsA, nameA)
			}
			var ws []*crashtest.Child
			for range 3 {
				ws = append(ws, crashtest.Start(t, workerSpec(s.db, lease, 1)))
			}
			// A stopped is alive: its leases hold.
			time.Sleep(time.Second)
			if before.movedOn(t, st, runID) || readHeld(t, st, runID).runFence != before.runFence {
				t.Fatalf("A's run or partitions were taken while A was stopped, alive, its lease live: %s", readHeld(t, st, runID))
			}
			if err := a.Kill(); err != nil {
				t.Fatal(err)
			}
			a.WantKilled()
			killed := time.Now()
			settleKilled(t, a)
			waitFor(t, lease/2, func() string {
				return fmt.Sprintf("A's work not taken over %s after the kill (lease %s): %s", time.Since(killed).Round(time.Millisecond), lease, readHeld(t, st, runID))
			}, func() bool { return before.movedOn(t, st, runID) })
			took := time.Since(killed)
			t.Logf("A's run and 2 partitions taken over %s after its SIGKILL (lease %s)", took.Round(time.Millisecond), lease)
			waitFor(t, 2*time.Minute, func() string { return "run " + runStatus(t, st, runID) },
				func() bool { return runStatus(t, st, runID) == checkpoint.RunSucceeded })
			stopWorkers(t, ws...)
			for _, p := range partitionInvariants(t, s, testDate) {
				t.Error(p)
			}
			info, err := st.Run(context.Background(), runID)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, at := range info.Attempts {
				got = append(got, at.Status)
			}
			if !slices.Equal(got, []string{checkpoint.AttemptLost, checkpoint.RunSucceeded}) {
				t.Errorf("attempts %v; want [lost succeeded]: A's lost, one take-over", got)
			}
			for _, p := range partitionsOf(t, s, testDate) {
				if p.State != checkpoint.PartitionDone || p.Finished() != p.Total || checkpoint.OwnerName(p.Owner) == nameA {
					t.Errorf("partition %d: %s, %d of %d, by %s; want done by another worker than A", p.Index, p.State, p.Finished(), p.Total, p.Owner)
				}
			}
		})
	}
}
