package settlement_test

import (
	"context"
	"fmt"
	"math/rand/v2"
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

// takeoverWorker is workerSpec with the take-over test's lease; its
// poll is TAKEOVER_POLL when set (1s, the default, to measure as a pool
// runs), else workerSpec's.
func takeoverWorker(t *testing.T, db string, concurrency int) crashtest.Spec {
	return withPoll(workerSpec(db, takeoverLease(t), concurrency), os.Getenv("TAKEOVER_POLL"))
}

// withPoll is spec with its worker's --poll set to poll, if not empty.
func withPoll(spec crashtest.Spec, poll string) crashtest.Spec {
	if poll != "" {
		spec.Args[slices.Index(spec.Args, "--poll")+1] = poll
	}
	return spec
}

// takeoverLedger is smallLedger with more transfers, so the post step
// lasts long enough for a worker's second slot to claim a partition.
var takeoverLedger = settlement.SeedConfig{Accounts: 50, Transfers: 4000, Date: testDate, Seed: 7, Balance: 10_000}

// held is who holds a run and its partitions, and at which fences.
type held struct {
	runOwner string
	runFence int64
	runUntil time.Time
	parts    map[int]checkpoint.Partition // the running ones, by index
}

func readHeld(t *testing.T, st checkpoint.Backend, runID string) held {
	t.Helper()
	info, err := st.Run(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	h := held{runOwner: checkpoint.OwnerName(info.Run.LeaseOwner), runFence: info.Run.Fence, runUntil: info.Run.LeaseUntil, parts: map[int]checkpoint.Partition{}}
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

// allBy reports whether every running partition of h is owner's.
func (h held) allBy(owner string) bool {
	for _, p := range h.parts {
		if checkpoint.OwnerName(p.Owner) != owner {
			return false
		}
	}
	return true
}

// latestUntil is when the last of h's partition leases, and the run's,
// expires.
func (h held) latestUntil() time.Time {
	last := h.runUntil
	for _, p := range h.parts {
		if p.LeaseUntil.After(last) {
			last = p.LeaseUntil
		}
	}
	return last
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
// killed with SIGKILL while three idle workers wait. On the same host
// they take the run and both partitions over at once, well within the
// 60s lease (the owner is surely gone: same boot and PID namespace, PID
// dead), each at a raised fence, while the worker only stopped (SIGSTOP,
// alive) kept everything. From another PID namespace (unshare: as good as
// another host) nothing moves before its lease expires. Either way the
// run succeeds, every transfer exactly once, money conserved.
func TestGoneWorkersWorkIsTakenOverAtOnce(t *testing.T) {
	t.Parallel()
	for i, l := range layouts(t)[:2] {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			takeoverScenario(t, l, false)
		})
		if i == 0 {
			t.Run("other PID namespace", func(t *testing.T) {
				t.Parallel()
				takeoverScenario(t, l, true)
			})
		}
	}
}

// takeoverScenario is one case of TestGoneWorkersWorkIsTakenOverAtOnce:
// the killed worker on this host, or in another PID namespace.
func takeoverScenario(t *testing.T, l layout, otherNS bool) {
	lease := takeoverLease(t)
	if otherNS && os.Getenv("TAKEOVER_LEASE") == "" {
		lease = 5 * time.Second // the lease decides: the test waits it out
	}
	s := newStore(t, l, takeoverLedger)
	runID := jobs.RunID(settlement.Job.Name(), testDate)
	st := s.open(t)
	defer st.Close()
	// A polls often: its second slot claims the second partition at once.
	spec := withPoll(workerSpec(s.db, lease, 3), "20ms")
	var before held
	var a *crashtest.Child
	if otherNS {
		// sh is the namespace's init, the worker its child: a SIGKILL of
		// unshare (--kill-child) kills them both.
		spec.Wrap = []string{"unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", `"$@"; exit $?`, "sh"}
		a = crashtest.Start(t, spec)
		enqueue(t, s.db, settlement.Job.Name(), settleParams(s, 5, 2))
		waitFor(t, time.Minute, func() string { return "A holds " + readHeld(t, st, runID).String() }, func() bool {
			before = readHeld(t, st, runID)
			return before.runOwner != "" && len(before.parts) == 2 && before.allBy(before.runOwner)
		})
	} else {
		// Chunks of 5 of ~2,000 transfers a partition: the pause at the
		// 200th lands mid-post, both partitions claimed by then.
		spec.Env = append(spec.Env, crashtest.PauseAt("step:post#200:after-commit"))
		a = crashtest.Start(t, spec)
		enqueue(t, s.db, settlement.Job.Name(), settleParams(s, 5, 2))
		a.WaitStopped()
		nameA := "?"
		if host, err := os.Hostname(); err == nil {
			nameA = host + ":" + strconv.Itoa(a.Pid())
		}
		before = readHeld(t, st, runID)
		if before.runOwner != nameA || len(before.parts) != 2 || !before.allBy(nameA) {
			t.Fatalf("when A (%s) stopped: %s; want the run and both partitions A's", nameA, before)
		}
	}
	var ws []*crashtest.Child
	for range 3 {
		ws = append(ws, crashtest.Start(t, takeoverWorker(t, s.db, 1)))
	}
	if !otherNS {
		// A stopped is alive: its leases hold. (A second and a bit, so
		// the workers' polls are not in step with the kill.)
		time.Sleep(time.Second + rand.N(time.Second))
		if now := readHeld(t, st, runID); now.runFence != before.runFence || before.movedOn(t, st, runID) {
			t.Fatalf("A's run or partitions were taken while A was stopped, alive, its lease live: %s", now)
		}
	}
	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	a.WantKilled()
	killed := time.Now()
	settleKilled(t, a)
	limit := lease / 2
	if otherNS {
		limit = 3 * lease
	}
	waitFor(t, limit, func() string {
		return fmt.Sprintf("A's work not taken over %s after the kill (lease %s): %s", time.Since(killed).Round(time.Millisecond), lease, readHeld(t, st, runID))
	}, func() bool { return before.movedOn(t, st, runID) })
	took := time.Since(killed)
	if otherNS {
		// Each lease moved only once expired.
		if early := time.Until(before.latestUntil()); early > 100*time.Millisecond {
			t.Errorf("A's work in another PID namespace was taken %s before its last lease expired: its owner was guessed gone", early)
		}
	}
	t.Logf("A's run and 2 partitions taken over %s after its SIGKILL (lease %s, other PID namespace %v)", took.Round(time.Millisecond), lease, otherNS)
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
		if p.State != checkpoint.PartitionDone || p.Finished() != p.Total || checkpoint.OwnerName(p.Owner) == before.runOwner {
			t.Errorf("partition %d: %s, %d of %d, by %s; want done by another worker than A", p.Index, p.State, p.Finished(), p.Total, p.Owner)
		}
	}
}
