package settlement_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// partitionInvariants returns every way a partitioned settlement of date
// breaks what holds whatever order partitions committed in: money
// conserved, no balance below zero, every transfer exactly one finished
// item, every balance its opening plus the effects of its posted
// transfers (so the items and the target agree), bad amounts rejected.
// (settlement.Check replays in ID order, which partitions do not promise
// for credits.)
func partitionInvariants(t *testing.T, s store, date string) []string {
	t.Helper()
	var bad []string
	db := openLedger(t, s.ledgerLoc())
	defer db.Close()
	ctx := context.Background()
	opening := map[string]int64{}
	rows, err := db.QueryContext(ctx, `SELECT account_id, balance FROM opening_balances WHERE business_date = $1`, date)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var b int64
		if err := rows.Scan(&id, &b); err != nil {
			t.Fatal(err)
		}
		opening[id] = b
	}
	rows.Close()
	items := s.items(t, date)
	rows, err = db.QueryContext(ctx, `SELECT id, from_account, to_account, amount FROM transfers WHERE business_date = $1`, date)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	var posted []checkpointtest.Transfer
	for rows.Next() {
		var tr settlement.Transfer
		if err := rows.Scan(&tr.ID, &tr.From, &tr.To, &tr.Amount); err != nil {
			t.Fatal(err)
		}
		n++
		switch st := items[tr.ID]; {
		case st == checkpoint.StepCompleted && tr.Amount > 0:
			posted = append(posted, checkpointtest.Transfer{ID: tr.ID, From: tr.From, To: tr.To, Amount: tr.Amount})
		case st == checkpoint.StepRejected:
		default:
			bad = append(bad, fmt.Sprintf("transfer %s (amount %d) is %q, want one finished item", tr.ID, tr.Amount, st))
		}
		delete(items, tr.ID)
	}
	rows.Close()
	for k, st := range items {
		bad = append(bad, fmt.Sprintf("item %s (%s) is no transfer of %s", k, st, date))
	}
	got := map[string]checkpoint.State{}
	for id, a := range readAccounts(t, s.ledgerLoc()) {
		got[id] = checkpoint.State{Value: a[0], Version: a[1], Exists: true}
		if a[0] < 0 {
			bad = append(bad, fmt.Sprintf("account %s is below zero: %d", id, a[0]))
		}
	}
	// Chunks merge transfers into one write per account, in whatever
	// order partitions commit: versions follow no count the test keeps.
	bad = append(bad, checkpointtest.LedgerCheck{Opening: opening, Applied: posted, SkipVersions: true}.Problems(got)...)
	if n == 0 {
		bad = append(bad, "no transfers")
	}
	return bad
}

// settleWith runs the settle job with partitions in this process.
func (s store) settleWith(t testing.TB, date string, chunk, parts int, cfg runner.Config, force bool) (runner.Result, error) {
	t.Helper()
	st := s.open(t)
	defer st.Close()
	cfg.Store, cfg.Jobs = st, registry()
	r, err := runner.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v := s.values(date, chunk)
	v["partitions"] = strconv.Itoa(parts)
	return r.Run(context.Background(), runner.Request{Job: settlement.Job.Name(), Values: v, Force: force})
}

func partitionsOf(t testing.TB, s store, date string) []checkpoint.Partition {
	t.Helper()
	st := s.open(t)
	defer st.Close()
	ps, err := st.Partitions(context.Background(), jobs.RunID(settlement.Job.Name(), date), "")
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// TestPartitionedSettlement settles with 4 and 8 partitions on every
// layout, the run's own process working every partition.
func TestPartitionedSettlement(t *testing.T) {
	t.Parallel()
	for _, l := range layouts(t) {
		for _, parts := range []int{4, 8} {
			t.Run(fmt.Sprintf("%s/%d", l.name, parts), func(t *testing.T) {
				t.Parallel()
				s := newStore(t, l, smallLedger)
				res, err := s.settleWith(t, testDate, 50, parts, runner.Config{}, false)
				if err != nil || res.Status != checkpoint.RunSucceeded {
					t.Fatalf("settle: %q, %v", res.Status, err)
				}
				for _, p := range partitionInvariants(t, s, testDate) {
					t.Error(p)
				}
				ps := partitionsOf(t, s, testDate)
				if len(ps) != parts {
					t.Fatalf("%d partitions recorded, want %d", len(ps), parts)
				}
				var fin, total int64
				for _, p := range ps {
					if p.State != checkpoint.PartitionDone || p.Finished() != p.Total || p.Rule != checkpoint.PartitionHash {
						t.Errorf("partition %+v: want done, every one of its items finished, by hash", p)
					}
					fin += p.Finished()
					total += p.Total
				}
				sum := s.summary(t, testDate)
				if fin != int64(smallLedger.Transfers) || total != fin || sum.Transfers != fin {
					t.Errorf("partitions finished %d of %d; summary %d; want %d", fin, total, sum.Transfers, smallLedger.Transfers)
				}
				// A rerun of the succeeded run changes nothing.
				before := readAccounts(t, s.ledgerLoc())
				if res, err := s.settleWith(t, testDate, 50, parts, runner.Config{}, true); err != nil || res.Status != checkpoint.RunSucceeded {
					t.Fatalf("rerun: %q, %v", res.Status, err)
				}
				if after := readAccounts(t, s.ledgerLoc()); !mapsEqual(before, after) {
					t.Error("a rerun of the succeeded run moved balances")
				}
			})
		}
	}
}

// TestPartitionedSettlementReportsProgress: the run's owner reports the
// partitioned post step's progress, summed over its partitions, ending
// with one final report of every transfer finished; the count never goes
// back.
func TestPartitionedSettlementReportsProgress(t *testing.T) {
	t.Parallel()
	l := layouts(t)[0]
	s := newStore(t, l, smallLedger)
	var (
		mu   sync.Mutex
		seen []steps.Progress
	)
	cfg := runner.Config{OnProgress: func(p steps.Progress) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, p)
	}}
	res, err := s.settleWith(t, testDate, 50, 4, cfg, false)
	if err != nil || res.Status != checkpoint.RunSucceeded {
		t.Fatalf("settle: %q, %v", res.Status, err)
	}
	mu.Lock()
	defer mu.Unlock()
	var post []steps.Progress
	for _, p := range seen {
		if p.Step == "post" {
			post = append(post, p)
		}
	}
	if len(post) < 2 {
		t.Fatalf("progress reports of the partitioned post step: %+v; want a first one and a final one at least", post)
	}
	want := int64(smallLedger.Transfers)
	finals := 0
	for i, p := range post {
		if p.Total != want {
			t.Errorf("report %d: total %d, want %d", i, p.Total, want)
		}
		if i > 0 && p.Done < post[i-1].Done {
			t.Errorf("report %d: done %d after %d: progress went back", i, p.Done, post[i-1].Done)
		}
		if p.Final {
			finals++
		}
	}
	last := post[len(post)-1]
	if finals != 1 || !last.Final || last.Done != want || last.Replayed != 0 || last.Rejected == 0 {
		t.Errorf("last report %+v, %d final; want one final report, last, with all %d transfers done, none replayed, some rejected", last, finals, want)
	}
}

// TestPartitionWorkers has three more runners, each on its own store
// handle, work partitions while the run's own process does: every
// partition is worked by someone, and the invariants hold.
func TestPartitionWorkers(t *testing.T) {
	t.Parallel()
	for _, l := range layouts(t) {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, l, smallLedger)
			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			worked := make([]int, 3)
			for i := range worked {
				st := s.open(t)
				t.Cleanup(func() { st.Close() })
				w, err := runner.New(runner.Config{Store: st, Jobs: registry(), Owner: fmt.Sprintf("worker-%d", i)})
				if err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						ok, err := w.WorkPartition(ctx, "")
						if err != nil && ctx.Err() == nil {
							t.Errorf("worker %d: %v", i, err)
						}
						if ok {
							worked[i]++
						} else {
							time.Sleep(5 * time.Millisecond)
						}
					}
				}()
			}
			res, err := s.settleWith(t, testDate, 20, 8, runner.Config{}, false)
			stop()
			wg.Wait()
			if err != nil || res.Status != checkpoint.RunSucceeded {
				t.Fatalf("settle: %q, %v", res.Status, err)
			}
			for _, p := range partitionInvariants(t, s, testDate) {
				t.Error(p)
			}
			owners := map[string]int{}
			for _, p := range partitionsOf(t, s, testDate) {
				owners[checkpoint.OwnerName(p.Owner)]++
				if p.State != checkpoint.PartitionDone {
					t.Errorf("partition %d is %s", p.Index, p.State)
				}
			}
			t.Logf("partitions by owner: %v; worked by the workers: %v", owners, worked)
		})
	}
}

// TestPartitionedSettlementSurvivesSIGKILL kills the run's process in the
// middle of the partitioned step, then resumes it: the partitions are not
// split again, done ones stay done, and the invariants hold.
func TestPartitionedSettlementSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	for _, l := range layouts(t) {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			// The run stops itself (SIGSTOP) once the first of its
			// partitions has committed its third chunk of 20, and is
			// killed there: mid-step however fast it runs (watching for
			// items committed and killing then let a loaded machine's
			// child finish every partition in between).
			s := newStore(t, l, smallLedger)
			args := []string{"--db", s.db, "--log-level", "error", "run", "settle", "--progress", "none", "-p", "partitions=4"}
			for k, v := range s.values(testDate, 20) {
				args = append(args, "-p", k+"="+v)
			}
			c := crashtest.Start(t, crashtest.Spec{Args: args, Timeout: 2 * time.Minute,
				Env: []string{childEnv + "=1", steps.PauseEnv + "=step:post#2:after-commit"}})
			c.WaitStopped()
			if err := c.Kill(); err != nil {
				t.Fatal(err)
			}
			c.Wait()
			settleKilled(t, c)
			before := partitionsOf(t, s, testDate)
			if len(before) != 4 {
				t.Fatalf("%d partitions recorded before the kill, want 4", len(before))
			}
			if !slices.ContainsFunc(before, func(p checkpoint.Partition) bool { return p.State != checkpoint.PartitionDone }) {
				t.Fatal("every partition was done before the kill; it did not land mid-step")
			}
			c = crashtest.Start(t, crashtest.Spec{Args: args, Env: []string{childEnv + "=1"}, Timeout: 2 * time.Minute})
			c.WantCode(cmd.ExitOK)
			for _, p := range partitionInvariants(t, s, testDate) {
				t.Error(p)
			}
			after := partitionsOf(t, s, testDate)
			for i, p := range after {
				if p.Rule != before[i].Rule || p.Total != before[i].Total || p.State != checkpoint.PartitionDone {
					t.Errorf("partition %d: %+v after resume, was %+v", i, p, before[i])
				}
			}
		})
	}
}

// TestCheckRecorded audits a partitioned settlement against its recorded
// outcomes: it passes, and it names a transfer posted twice, a posted
// transfer recorded as rejected and a transfer with no outcome.
func TestCheckRecorded(t *testing.T) {
	t.Parallel()
	s := newStore(t, sameStoreLayout, smallLedger)
	if res, err := s.settleWith(t, testDate, 50, 8, runner.Config{}, false); err != nil || res.Status != checkpoint.RunSucceeded {
		t.Fatalf("settle: %q, %v", res.Status, err)
	}
	db := openLedger(t, s.ledgerLoc())
	defer db.Close()
	ctx := context.Background()
	outcome := s.items(t, testDate)
	rep, err := settlement.CheckRecorded(ctx, db, testDate, outcome)
	if err != nil || !rep.OK() || !rep.Recorded || rep.Posted+rep.Rejected != smallLedger.Transfers {
		t.Fatalf("CheckRecorded of a good partitioned settlement: %v\n%s", err, rep)
	}
	var posted string
	for k, st := range outcome {
		if st == checkpoint.StepCompleted && (posted == "" || k < posted) {
			posted = k
		}
	}
	changed := maps.Clone(outcome)
	changed[posted] = checkpoint.StepRejected
	var missing string
	for k := range changed {
		if k != posted {
			missing = k
			break
		}
	}
	delete(changed, missing)
	rep, err = settlement.CheckRecorded(ctx, db, testDate, changed)
	if err != nil || rep.OK() || len(rep.Mismatches) == 0 || !slices.ContainsFunc(rep.Problems, func(p string) bool { return strings.Contains(p, missing) }) {
		t.Errorf("CheckRecorded with %s recorded rejected and %s unrecorded: %v\n%s", posted, missing, err, rep)
	}
	from, to := applyTwice(t, s)
	rep, err = settlement.CheckRecorded(ctx, db, testDate, outcome)
	if err != nil || rep.OK() || !slices.ContainsFunc(rep.Mismatches, func(m settlement.Mismatch) bool { return m.Account == from || m.Account == to }) {
		t.Errorf("CheckRecorded after a transfer from %s to %s was applied twice: %v\n%s", from, to, err, rep)
	}
}

// TestPartitionedResetReposts resets the post step of a partitioned
// settlement whose ledger is a store of its own, as an operator does who
// took the day's postings back out of the ledger (a reset undoes no
// effects), and settles again: the new split's effects are applied, not
// taken for the reset ones already in the ledger's applied effects, so
// every balance is its opening plus the posted transfers' effects.
func TestPartitionedResetReposts(t *testing.T) {
	t.Parallel()
	for _, l := range layouts(t) {
		if !l.separate() {
			continue // the reset deletes the items with the effects' record
		}
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, l, smallLedger)
			if res, err := s.settleWith(t, testDate, 50, 4, runner.Config{}, false); err != nil || res.Status != checkpoint.RunSucceeded {
				t.Fatalf("settle: %q, %v", res.Status, err)
			}
			db := openLedger(t, s.ledgerLoc())
			_, err := db.Exec(`UPDATE accounts SET balance = coalesce((SELECT o.balance FROM opening_balances AS o
WHERE o.account_id = accounts.id AND o.business_date = $1), 0)`, testDate)
			db.Close()
			if err != nil {
				t.Fatalf("take the postings back out: %v", err)
			}
			st := s.open(t)
			now := time.Now()
			runID := jobs.RunID(settlement.Job.Name(), testDate)
			err = st.ResetSteps(context.Background(), checkpoint.Audit{RunID: runID, At: now, Operator: "test", Command: "reset",
				Reason: "postings taken back out of the ledger"}, now, []string{"post"})
			st.Close()
			if err != nil {
				t.Fatalf("reset post: %v", err)
			}
			if res, err := s.settleWith(t, testDate, 50, 4, runner.Config{}, false); err != nil || res.Status != checkpoint.RunSucceeded {
				t.Fatalf("settle after the reset: %q, %v", res.Status, err)
			}
			for _, p := range partitionInvariants(t, s, testDate) {
				t.Error(p)
			}
		})
	}
}
