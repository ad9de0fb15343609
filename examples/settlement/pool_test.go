package settlement_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// The pool tests run `stepwise worker` processes (this test binary
// re-executed as the CLI with poolRegistry's jobs) against one store and
// enqueue partitioned runs for them.

// poolChild makes TestMain act as the stepwise CLI with poolRegistry.
const poolChild = "pool"

var poolLogLevel = cmp.Or(os.Getenv("POOL_LOG"), "warn")

// providerParams are the provider job's parameters.
type providerParams struct {
	Key        string        `param:"key,key" help:"names the run"`
	Items      int           `param:"items" default:"100" help:"items of the batch step"`
	Partitions int           `param:"partitions" default:"8" help:"partitions of the batch step"`
	Chunk      int           `param:"chunk" default:"1000" help:"items per chunk"`
	Delay      time.Duration `param:"delay" default:"5ms" help:"how long each item waits on the simulated provider"`
}

// providerJob is a batch step whose every item waits on an outside call:
// a simulated provider answering after Delay (a sleep inside the item
// function, ended early by the item's context). Its items have no target:
// each is recorded as its item row, exactly once.
var providerJob = jobs.Define("provider", func(ctx context.Context, run *steps.Run, p providerParams) error {
	keys := make([]string, p.Items)
	for i := range keys {
		keys[i] = fmt.Sprintf("item-%06d", i)
	}
	_, err := steps.ForEach(ctx, run, "call", steps.Slice(keys, func(k string) string { return k }),
		func(ctx context.Context, k string, _ *steps.Effects) (string, error) {
			t := time.NewTimer(p.Delay)
			defer t.Stop()
			select {
			case <-t.C:
				return "ok " + k, nil
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}, steps.Partitions(p.Partitions), steps.ChunkSize(p.Chunk))
	return err
}, jobs.Help("test job: a partitioned batch step whose items wait on a simulated provider"))

// poolRegistry is registry's settle job and the provider job.
func poolRegistry() *jobs.Registry {
	var reg jobs.Registry
	reg.MustRegister(settlement.Job, providerJob)
	return &reg
}

// workerSpec is a `stepwise worker` child on db.
func workerSpec(db string, lease time.Duration, concurrency int, extra ...string) crashtest.Spec {
	args := []string{"--db", db, "--log-level", poolLogLevel, "worker", "--poll", "100ms", "--lease", lease.String(),
		"--concurrency", strconv.Itoa(concurrency), "--grace", "0s"}
	return crashtest.Spec{Args: append(args, extra...), Env: []string{childEnv + "=" + poolChild}, Timeout: 5 * time.Minute}
}

// enqueue runs `stepwise enqueue JOB -p ...` in a child and fails unless
// it enqueued a new run.
func enqueue(t *testing.T, db, job string, params map[string]string) {
	t.Helper()
	args := []string{"--db", db, "enqueue", job}
	for k, v := range params {
		args = append(args, "-p", k+"="+v)
	}
	c, exit := crashtest.Run(t, crashtest.Spec{Args: args, Env: []string{childEnv + "=" + poolChild}, Timeout: time.Minute})
	if exit != crashtest.Code(cmd.ExitOK) || !strings.Contains(c.Stdout(), "enqueued") {
		t.Fatalf("enqueue %s: %s\n%s", job, exit, c.Output())
	}
}

// settleParams are the settle job's parameters for s with parts
// partitions.
func settleParams(s store, chunk, parts int) map[string]string {
	v := s.values(testDate, chunk)
	v["partitions"] = strconv.Itoa(parts)
	return v
}

// runStatus reads a run's status ("" when it is not recorded yet).
func runStatus(t testing.TB, st checkpoint.Store, runID string) string {
	t.Helper()
	info, err := st.Run(context.Background(), runID)
	if err != nil {
		return ""
	}
	return info.Run.Status
}

// waitFor polls cond every 20ms until it holds, failing the test with
// what after limit.
func waitFor(t testing.TB, limit time.Duration, what func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", limit, what())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopWorkers sends SIGTERM to each worker and fails unless each exits 0
// saying it stopped.
func stopWorkers(t *testing.T, ws ...*crashtest.Child) {
	t.Helper()
	for _, w := range ws {
		// A worker started a moment ago may not handle SIGTERM yet: its
		// start line comes after the handler is installed.
		w.Until(func() bool { return strings.Contains(w.Stdout(), "worker: taking") })
	}
	for _, w := range ws {
		if err := w.Signal(syscall.SIGTERM); err != nil {
			t.Errorf("SIGTERM: %v", err)
		}
	}
	for i, w := range ws {
		if got := w.Wait(); got != crashtest.Code(cmd.ExitOK) || !strings.Contains(w.Stdout(), "worker: stopped") {
			t.Errorf("worker %d after SIGTERM: %s, want exit 0 and \"worker: stopped\"\n%s", i, got, w.Output())
		}
	}
}

// sharedLedger is smallLedger with ten times its transfers: a run that
// lasts long enough for every worker to take part.
var sharedLedger = settlement.SeedConfig{Accounts: 50, Transfers: 4000, Date: testDate, Seed: 7, Balance: 10_000}

// TestWorkersShareAPartitionedSettlement enqueues a settlement with 8
// partitions for three worker processes: it succeeds, the partitions are
// worked by more than one of them, the invariants hold, and each worker
// stops on SIGTERM with exit 0.
func TestWorkersShareAPartitionedSettlement(t *testing.T) {
	t.Parallel()
	for _, l := range layouts(t)[:2] {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			// Every worker is polling before the run is enqueued, and
			// the run is long enough (200 chunks, one partition at a time
			// in its owner) that the others claim partitions however
			// slowly a loaded machine starts or schedules them: with 800
			// transfers the owner could finish all 8 before they polled.
			s := newStore(t, l, sharedLedger)
			var ws []*crashtest.Child
			pids := map[string]bool{}
			for range 3 {
				spec := workerSpec(s.db, 10*time.Second, 1)
				spec.Args = slices.Replace(spec.Args, 2, 4, "--log-level", "info") // to see "worker started"
				w := crashtest.Start(t, spec)
				ws = append(ws, w)
				pids[strconv.Itoa(w.Pid())] = true
			}
			for _, w := range ws {
				w.WaitFor("worker started", func() bool { return strings.Contains(w.Stderr(), "worker started") })
			}
			enqueue(t, s.db, settlement.Job.Name(), settleParams(s, 20, 8))
			st := s.open(t)
			defer st.Close()
			runID := jobs.RunID(settlement.Job.Name(), testDate)
			waitFor(t, 2*time.Minute, func() string { return "run " + runStatus(t, st, runID) },
				func() bool { return runStatus(t, st, runID) == checkpoint.RunSucceeded })
			stopWorkers(t, ws...)
			for _, p := range partitionInvariants(t, s, testDate) {
				t.Error(p)
			}
			owners := map[string]int{}
			for _, p := range partitionsOf(t, s, testDate) {
				_, pid, _ := strings.Cut(checkpoint.OwnerName(p.Owner), ":")
				if !pids[pid] || p.State != checkpoint.PartitionDone {
					t.Errorf("partition %d is %s, owned by %q: want done by one of the workers %v", p.Index, p.State, p.Owner, pids)
				}
				owners[pid]++
			}
			if len(owners) < 2 {
				t.Errorf("the partitions were worked by %v: want more than one worker", owners)
			}
			t.Logf("partitions by worker PID: %v", owners)
		})
	}
}

// TestWorkerHeartbeatsAndReleasesPartitionsOnSIGTERM has one worker
// (--concurrency 4) work the provider job's 8 partitions, each taking
// longer than the worker's lease in one chunk: only the worker's
// heartbeats keep the partitions its own coordinator would otherwise take
// back, so the first partitions finish at their first fence. SIGTERM in
// the middle (--grace 0s) makes it exit 0, releasing the partitions it
// held (none left running); a second worker then finishes the run, every
// item once.
func TestWorkerHeartbeatsAndReleasesPartitionsOnSIGTERM(t *testing.T) {
	t.Parallel()
	db := newLocation(t, "stepwise.db")
	const lease = 1500 * time.Millisecond
	params := map[string]string{"key": "sigterm", "items": "640", "partitions": "8", "chunk": "1000", "delay": "25ms"}
	runID := jobs.RunID(providerJob.Name(), "sigterm")
	a := crashtest.Start(t, workerSpec(db, lease, 4))
	enqueue(t, db, providerJob.Name(), params)
	st := openStore(t, db)
	defer st.Close()
	parts := func() []checkpoint.Partition {
		ps, err := st.Partitions(context.Background(), runID, "call")
		if err != nil {
			t.Fatal(err)
		}
		return ps
	}
	count := func(state string) int {
		n := 0
		for _, p := range parts() {
			if p.State == state {
				n++
			}
		}
		return n
	}
	waitFor(t, 2*time.Minute, func() string { return fmt.Sprintf("partitions %+v", parts()) },
		func() bool { return count(checkpoint.PartitionDone) >= 1 && count(checkpoint.PartitionRunning) >= 1 })
	firstDone := map[int]bool{}
	for _, p := range parts() {
		if p.State == checkpoint.PartitionDone {
			firstDone[p.Index] = true
			if p.Fence != 1 {
				t.Errorf("partition %d was done at fence %d: it was claimed again while its worker held it (heartbeat missed)", p.Index, p.Fence)
			}
		}
	}
	if err := a.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if got, ok := a.WaitWithin(30 * time.Second); !ok || got != crashtest.Code(cmd.ExitOK) {
		t.Fatalf("worker after SIGTERM: %s (ended %v), want exit 0\n%s", got, ok, a.Output())
	}
	if n := count(checkpoint.PartitionRunning); n != 0 {
		t.Errorf("%d partitions still running after the worker stopped: %s\n%s", n, states(parts()), a.Output())
	}
	if s := runStatus(t, st, runID); s == checkpoint.RunSucceeded {
		t.Fatalf("the run succeeded before the SIGTERM landed; make its items slower")
	}
	b := crashtest.Start(t, workerSpec(db, lease, 4))
	waitFor(t, 2*time.Minute, func() string { return "run " + runStatus(t, st, runID) },
		func() bool { return runStatus(t, st, runID) == checkpoint.RunSucceeded })
	stopWorkers(t, b)
	for _, p := range parts() {
		if p.State != checkpoint.PartitionDone || p.Finished() != p.Total {
			t.Errorf("partition %d: %s, %d of %d finished", p.Index, p.State, p.Finished(), p.Total)
		}
		if firstDone[p.Index] && p.Fence != 1 {
			t.Errorf("partition %d, done before the SIGTERM, is at fence %d now", p.Index, p.Fence)
		}
	}
	counts, err := st.ItemCounts(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	var done int64
	for _, c := range counts {
		if c.Status == checkpoint.StepCompleted {
			done += c.Count
		}
	}
	if done != 640 {
		t.Errorf("%d items completed, want 640: %+v", done, counts)
	}
}

// states shows partitions briefly: index, state, fence, done/total.
func states(ps []checkpoint.Partition) string {
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&b, "#%d %s fence %d %d/%d by %s at %s", p.Index, p.State, p.Fence, p.Finished(), p.Total,
			checkpoint.OwnerName(p.Owner), p.UpdatedAt.Format("15:04:05.000"))
		if p.Error != "" {
			fmt.Fprintf(&b, " (%s)", p.Error)
		}
		b.WriteString("; ")
	}
	return b.String()
}
