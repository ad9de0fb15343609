package settlement_test

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// separateRunsEnv sets how many runs TestSeparateLedgerPartitionsNeverFailEachOther
// makes in a row (default 3; the trial is 30).
const separateRunsEnv = "STEPWISE_SEPARATE_RUNS"

// TestSeparateLedgerPartitionsNeverFailEachOther is issue 23's second
// point: with no fault at all, four workers with --concurrency 2 settle
// 8 partitions of 50-transfer chunks into a ledger in a separate
// PostgreSQL database. Two partitions' applies used to lock the accounts
// they share in the join's order and deadlock (40P01), or a chunk ran out
// of re-plans; now rows are locked in key order and re-plans are bounded
// by time, so every run succeeds with no operator action and audits
// exact (balances, items, partitions, summary, every chunk plan applied
// once). The re-planning warnings come once per chunk.
func TestSeparateLedgerPartitionsNeverFailEachOther(t *testing.T) {
	t.Parallel()
	pgtest.URL(t) // skips, saying why, without PostgreSQL
	runs := 3
	if v := os.Getenv(separateRunsEnv); v != "" {
		var err error
		if runs, err = strconv.Atoi(v); err != nil || runs < 1 {
			t.Fatalf("%s=%q: want a number of runs", separateRunsEnv, v)
		}
	}
	server := pgtest.Database(t)
	runID := jobs.RunID(settlement.Job.Name(), testDate)
	for i := range runs {
		t.Run("run "+strconv.Itoa(i), func(t *testing.T) {
			s := store{db: pgtest.Schema(t), ledger: schemaIn(t, server)}
			seed(t, s.ledger, poolLedger)
			workers := make([]*crashtest.Child, poolWorkers)
			for w := range workers {
				workers[w] = crashtest.Start(t, workerSpec(s.db, 10*time.Second, 2))
			}
			enqueue(t, s.db, settlement.Job.Name(), settleParams(s, 50, 8))
			st := s.open(t)
			defer st.Close()
			deadline := time.Now().Add(2 * time.Minute)
			for status := runStatus(t, st, runID); status != checkpoint.RunSucceeded; status = runStatus(t, st, runID) {
				if status == checkpoint.RunFailed || time.Now().After(deadline) {
					info, _ := st.Run(t.Context(), runID)
					t.Fatalf("run is %s (%s): an operator would be needed; partitions %s\nworker 0:\n%s", status, info.Run.Error,
						states(partitionsOf(t, s, testDate)), tail(workers[0].Stderr(), 3000))
				}
				time.Sleep(20 * time.Millisecond)
			}
			stopWorkers(t, workers...)
			for _, p := range poolAudit(t, s) {
				t.Error(p)
			}
			warned := 0
			for _, w := range workers {
				warned += strings.Count(w.Stderr(), "re-planning")
			}
			if chunks := poolLedger.Transfers/50 + 8; warned > chunks {
				t.Errorf("%d re-planning warnings for at most %d chunks: want one per chunk at most", warned, chunks)
			}
		})
	}
}
