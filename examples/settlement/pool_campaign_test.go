package settlement_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// The pool campaign: four `stepwise worker` processes (this test binary
// re-executed as the CLI) share a settlement enqueued with 8 partitions
// on PostgreSQL, ledger in the checkpoint database (same store) or in a
// schema of another database (separate store). While it runs the test
// SIGKILLs random workers and the run's owner (the worker driving the
// run) and restarts them, ends the server session of a worker inside a
// write transaction (pg_terminate_backend: a dropped connection, healed
// with no operator, issue 23), and SIGSTOPs a worker holding a partition past
// its lease, then SIGCONTs it: the partition is claimed by another worker
// meanwhile (its fence raised), and the woken worker must write nothing
// more (it stops itself, self-fenced, or its commit is fenced out). Once
// the run succeeds every case checks partitionInvariants (money
// conserved, no balance below zero, every transfer exactly one finished
// item, every balance its opening plus its posted transfers' effects, so
// the item table and the target agree), the partitions and the summary,
// and on a separate store that every chunk plan was applied exactly once.
//
// It needs PostgreSQL (STEPWISE_TEST_PG); without it, it is skipped saying
// so. In the PostgreSQL pass (STEPWISE_TEST_STORE=postgres) it runs
// poolCasesPostgres cases, in the SQLite pass one per layout. A failure
// prints the seed, which replays the case's random choices (the timing of
// the processes is not replayed):
//
//	STEPWISE_CAMPAIGN=30 go test -run TestPoolCampaign ./examples/settlement/     # 30 cases
//	STEPWISE_CAMPAIGN_SEED=1234 go test -run TestPoolCampaign ./examples/settlement/

const (
	poolCasesPostgres = 4
	poolWorkers       = 4
	poolLease         = 2 * time.Second
	// poolEvents is how many kills and pauses a case makes at most.
	poolEvents = 6
)

// poolLedger makes a run of some seconds with 8 partitions of a dozen
// chunks each, so kills and pauses land inside the partitioned step.
var poolLedger = settlement.SeedConfig{Accounts: 40, Transfers: 1200, Date: testDate, Seed: 13, Balance: 3_000}

// poolTally counts what a campaign did, over its cases.
type poolTally struct {
	kills, ownerKills, pauses, takenOver, fencedOut, terminated atomic.Int64
	// restarts counts server restarts (poolFaults.restart), violations
	// the audit's findings, operator what an operator would have had to
	// do (start a worker that exited by itself; a run that does not
	// succeed by itself fails its case at once).
	restarts, violations, operator atomic.Int64
	// longest is the longest time, in nanoseconds, from a case's last
	// fault to its run's success.
	longest atomic.Int64
}

func TestPoolCampaign(t *testing.T) {
	t.Parallel()
	base := pgtest.URL(t) // skips, saying why, without PostgreSQL
	campaignSeed := uint64(time.Now().UnixNano())
	if v := os.Getenv(campaignSeedEnv); v != "" {
		var err error
		if campaignSeed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", campaignSeedEnv, v, err)
		}
	}
	cases := 2
	if os.Getenv(storeEnv) == "postgres" {
		cases = poolCasesPostgres
	}
	if v := os.Getenv(campaignEnv); v != "" {
		var err error
		if cases, err = strconv.Atoi(v); err != nil || cases < 1 {
			t.Fatalf("%s=%q: want a number of cases", campaignEnv, v)
		}
	}
	t.Logf("pool campaign seed %d, %d cases, on %s (replay with %s=%d)", campaignSeed, cases, redactURL(base), campaignSeedEnv, campaignSeed)
	server := pgtest.Database(t) // the separate ledgers' database
	var tally poolTally
	t.Cleanup(func() {
		t.Logf("pool campaign seed %d: %d cases, %d SIGKILLs (%d of the run's owner), %d sessions ended by the server, "+
			"%d SIGSTOP pauses past the lease (%d with the partition claimed by another worker meanwhile, %d of those seen fenced out after SIGCONT); "+
			"operator actions needed 0 (a run that needed one fails its case), longest recovery from the last fault %s",
			campaignSeed, cases, tally.kills.Load(), tally.ownerKills.Load(), tally.terminated.Load(), tally.pauses.Load(),
			tally.takenOver.Load(), tally.fencedOut.Load(), time.Duration(tally.longest.Load()).Round(time.Millisecond))
		if t.Failed() {
			t.Logf("FAILED pool campaign seed %d: replay with %s=%d go test -run TestPoolCampaign ./examples/settlement/", campaignSeed, campaignSeedEnv, campaignSeed)
		}
	})
	for i := range cases {
		separate := i%2 == 1
		name := "same store"
		if separate {
			name = "separate store"
		}
		caseSeed := campaignSeed ^ uint64(i+1)<<32
		t.Run(fmt.Sprintf("%s/case %d", name, i), func(t *testing.T) {
			s := store{db: pgtest.Schema(t)}
			if separate {
				s.ledger = schemaIn(t, server)
			}
			seed(t, s.ledgerLoc(), poolLedger)
			poolCase(t, s, rand.New(rand.NewPCG(caseSeed, 0x9001)), &tally, campaignSeed)
		})
	}
}

// poolFaults is where a case's faults go besides its processes: the
// server whose sessions it ends (a superuser URL) and, if set, a
// restart of that server, saying how it restarted it.
type poolFaults struct {
	admin   string
	restart func(rng *rand.Rand) string
}

// poolCase runs one case of the campaign on s, on the suite's server.
func poolCase(t *testing.T, s store, rng *rand.Rand, tally *poolTally, campaignSeed uint64) {
	poolCaseWith(t, s, rng, tally, campaignSeed, poolFaults{admin: pgtest.URL(t)})
}

// poolCaseWith is poolCase with the faults of f.
func poolCaseWith(t *testing.T, s store, rng *rand.Rand, tally *poolTally, campaignSeed uint64, f poolFaults) {
	workers := make([]*crashtest.Child, poolWorkers)
	start := func(i int) { workers[i] = crashtest.Start(t, workerSpec(s.db, poolLease, 2)) }
	for i := range workers {
		start(i)
	}
	enqueue(t, s.db, settlement.Job.Name(), settleParams(s, 10, 8))
	st := s.open(t)
	defer st.Close()
	runID := jobs.RunID(settlement.Job.Name(), testDate)
	byPID := func(pid string) int {
		return slices.IndexFunc(workers, func(w *crashtest.Child) bool { return strconv.Itoa(w.Pid()) == pid })
	}
	pidOf := func(owner string) string {
		_, pid, _ := strings.Cut(checkpoint.OwnerName(owner), ":")
		return pid
	}
	kill := func(i int) {
		workers[i].Signal(syscall.SIGKILL)
		workers[i].Wait()
		time.Sleep(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
		start(i)
	}
	var log []string
	var lastFault time.Time
	succeeded := func() bool { return runStatus(t, st, runID) == checkpoint.RunSucceeded }
	deadline := time.Now().Add(3 * time.Minute)
	for events := 0; !succeeded(); {
		if time.Now().After(deadline) {
			var logs strings.Builder
			for i, w := range workers {
				fmt.Fprintf(&logs, "\nworker %d:\n%s", i, tail(w.Stderr(), 3000))
			}
			t.Fatalf("the run did not succeed within 3 minutes (%s); run %s; partitions: %s (seed %d)%s",
				strings.Join(log, "; "), runStatus(t, st, runID), states(partitionsOf(t, s, testDate)), campaignSeed, logs.String())
		}
		time.Sleep(50*time.Millisecond + time.Duration(rng.Int64N(int64(400*time.Millisecond))))
		if events >= poolEvents || succeeded() {
			continue
		}
		lastFault = time.Now()
		kinds := 12
		if f.restart != nil {
			kinds = 15
		}
		k := rng.IntN(kinds)
		if f.restart != nil && events == 0 {
			k = 12 // every case restarts the server once at least
		}
		switch {
		case k >= 12: // restart the server
			tally.restarts.Add(1)
			log = append(log, "restarted the server: "+f.restart(rng))
		case k >= 10: // end a worker's session inside a write transaction
			names := make([]string, len(workers))
			for i, w := range workers {
				names[i] = w.SessionName()
			}
			if what := terminateWriterOn(t, f.admin, names, rng); what != "" {
				tally.terminated.Add(1)
				log = append(log, "ended a session "+what)
			}
		case k < 4: // a random worker
			i := rng.IntN(len(workers))
			kill(i)
			tally.kills.Add(1)
			log = append(log, fmt.Sprintf("killed worker %d", i))
		case k < 7: // the run's owner
			info, err := st.Run(context.Background(), runID)
			if err != nil || info.Run.Status != checkpoint.RunRunning {
				continue
			}
			i := byPID(pidOf(info.Run.LeaseOwner))
			if i < 0 {
				continue
			}
			kill(i)
			tally.kills.Add(1)
			tally.ownerKills.Add(1)
			log = append(log, fmt.Sprintf("killed the run's owner, worker %d", i))
		default: // pause a worker holding a partition past its lease
			ps := partitionsOf(t, s, testDate)
			j := slices.IndexFunc(ps, func(p checkpoint.Partition) bool {
				return p.State == checkpoint.PartitionRunning && byPID(pidOf(p.Owner)) >= 0
			})
			if j < 0 {
				continue
			}
			held := ps[j]
			i := byPID(pidOf(held.Owner))
			w := workers[i]
			if err := w.Signal(syscall.SIGSTOP); err != nil {
				continue
			}
			tally.pauses.Add(1)
			time.Sleep(poolLease + 800*time.Millisecond)
			var taken bool
			for _, p := range partitionsOf(t, s, testDate) {
				taken = taken || (p.Index == held.Index && p.Fence > held.Fence)
			}
			before := len(w.Stderr())
			w.Signal(syscall.SIGCONT)
			what := "not claimed by another meanwhile"
			if taken {
				tally.takenOver.Add(1)
				what = "claimed by another meanwhile"
				// Woken, the worker stops working it: self-fenced (its
				// heartbeat is overdue) or fenced out at its next write.
				if fencedOut(w, before) {
					tally.fencedOut.Add(1)
					what += ", then fenced out"
				} else {
					// Not an invariant (the audit is): a worker woken in
					// the middle of claiming may find out only later.
					t.Logf("worker %d, paused holding partition %d at fence %d past its lease while another claimed it, "+
						"logged nothing of being fenced within 20s of SIGCONT; partitions now: %s\nits log:\n%s",
						i, held.Index, held.Fence, states(partitionsOf(t, s, testDate)), tail(w.Stderr(), 4000))
				}
			}
			log = append(log, fmt.Sprintf("paused worker %d holding partition %d (%s)", i, held.Index, what))
		}
		events++
	}
	if !lastFault.IsZero() {
		took := time.Since(lastFault)
		for old := tally.longest.Load(); int64(took) > old && !tally.longest.CompareAndSwap(old, int64(took)); old = tally.longest.Load() {
		}
	}
	for i, w := range workers {
		if w.Exited() {
			tally.operator.Add(1)
			t.Errorf("worker %d exited by itself: an operator would have to start it again; its log:\n%s", i, tail(w.Stderr(), 3000))
		}
	}
	stopWorkers(t, workers...)
	for _, p := range poolAudit(t, s) {
		tally.violations.Add(1)
		t.Error(p)
	}
	if t.Failed() {
		t.Logf("case: %s (campaign seed %d)", strings.Join(log, "; "), campaignSeed)
		return
	}
	t.Logf("%s; audit passed", strings.Join(log, "; "))
}

// poolAudit returns every way a finished pooled settlement in s breaks
// what it must hold.
func poolAudit(t *testing.T, s store) []string {
	t.Helper()
	return poolAuditOf(t, s, poolLedger.Transfers)
}

// poolAuditOf is poolAudit of a ledger seeded with transfers transfers.
func poolAuditOf(t *testing.T, s store, transfers int) []string {
	t.Helper()
	bad := partitionInvariants(t, s, testDate)
	st := s.open(t)
	defer st.Close()
	info, err := st.Run(context.Background(), jobs.RunID(settlement.Job.Name(), testDate))
	if err != nil {
		t.Fatal(err)
	}
	if info.Run.Status != checkpoint.RunSucceeded {
		bad = append(bad, "run is "+info.Run.Status+", want succeeded")
	}
	var fin int64
	for _, p := range partitionsOf(t, s, testDate) {
		fin += p.Finished()
		if p.State != checkpoint.PartitionDone || p.Finished() != p.Total {
			bad = append(bad, fmt.Sprintf("partition %d is %s with %d of %d finished", p.Index, p.State, p.Finished(), p.Total))
		}
	}
	if sum := s.summary(t, testDate); fin != int64(transfers) || sum.Transfers != fin || sum.Posted+sum.Rejected != fin {
		bad = append(bad, fmt.Sprintf("partitions finished %d, summary %+v; want %d transfers", fin, sum, transfers))
	}
	if s.ledger != "" {
		plans := s.plans(t, testDate)
		ids := make([]string, 0, len(plans))
		for id := range plans {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		if len(ids) == 0 {
			bad = append(bad, "a separate ledger settled with no chunk plans recorded")
		}
		applied := s.applied(t, ids)
		for _, id := range ids {
			switch status := plans[id]; {
			case status == checkpoint.ChunkApplied && !applied[id]:
				bad = append(bad, "chunk plan "+id+" is marked applied but its effect ID is not in the ledger")
			case status == checkpoint.ChunkSuperseded && applied[id]:
				bad = append(bad, "chunk plan "+id+" was superseded, yet its effect ID is in the ledger")
			case status != checkpoint.ChunkApplied && status != checkpoint.ChunkSuperseded:
				bad = append(bad, fmt.Sprintf("chunk plan %s is %q after the run succeeded", id, status))
			}
		}
	}
	return bad
}

// fencedOut waits up to 20s for the worker to log, after the first
// before bytes of its standard error, that it was fenced out or fenced
// itself, and reports whether it did.
func fencedOut(w *crashtest.Child, before int) bool {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && !w.Exited() {
		if strings.Contains(w.Stderr()[before:], "fenced") {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return strings.Contains(w.Stderr()[before:], "fenced")
}

// redactURL hides a URL's password, for logs.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return "the test server"
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
