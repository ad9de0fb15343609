package settlement_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// healTerminationsEnv sets how many write transactions of the workers
// TestPoolHealsTerminatedSessions ends (default healTerminations).
const healTerminationsEnv = "STEPWISE_HEAL_TERMINATIONS"

// healTerminations is how many sessions the short version ends.
const healTerminations = 8

// sqlWritingSessions lists the sessions named by $1 that are inside a
// write transaction (they hold a transaction ID): committing a chunk, a
// step, a partition's progress or a claim.
const sqlWritingSessions = `SELECT pid, state, left(query, 60) FROM pg_stat_activity
WHERE application_name = ANY ($1::text[]) AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()`

// TestPoolHealsTerminatedSessions is issue 23's first point: four worker
// processes share a partitioned settlement while the test ends, at random
// moments, the server session of a worker that is inside a write
// transaction (pg_terminate_backend, as an administrator or a failover
// would). Every run must succeed with no operator action, on both ledger
// layouts, and audit exactly: balances, items, partitions, summary, and
// on a separate ledger every chunk plan applied once. Without the
// transient-fault handling a terminated commit fails the partition and
// the run for good. STEPWISE_HEAL_TERMINATIONS=20 (or more) runs the
// longer version.
func TestPoolHealsTerminatedSessions(t *testing.T) {
	t.Parallel()
	pgtest.URL(t) // skips, saying why, without PostgreSQL
	n := healTerminations
	if v := os.Getenv(healTerminationsEnv); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("%s=%q: want a number of sessions to end", healTerminationsEnv, v)
		}
	}
	server := pgtest.Database(t)
	for _, separate := range []bool{false, true} {
		name := "same store"
		if separate {
			name = "separate database"
		}
		t.Run(name, func(t *testing.T) {
			s := store{db: pgtest.Schema(t)}
			if separate {
				s.ledger = schemaIn(t, server)
			}
			ledger := poolLedger
			ledger.Transfers = max(ledger.Transfers, 400*n) // long enough to end n sessions inside it, even on an idle machine
			seed(t, s.ledgerLoc(), ledger)
			healCase(t, s, n, ledger.Transfers)
		})
	}
}

// healCase runs the settlement on s under four workers, ending n writing
// sessions of theirs, and audits it.
func healCase(t *testing.T, s store, n, transfers int) {
	workers := make([]*crashtest.Child, poolWorkers)
	names := make([]string, poolWorkers)
	for i := range workers {
		workers[i] = crashtest.Start(t, workerSpec(s.db, 5*time.Second, 2))
		names[i] = workers[i].SessionName()
	}
	enqueue(t, s.db, settlement.Job.Name(), settleParams(s, 10, 8))
	st := s.open(t)
	defer st.Close()
	runID := jobs.RunID(settlement.Job.Name(), testDate)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 23))
	var ended []string
	started := time.Now()
	deadline := started.Add(2 * time.Minute)
	for runStatus(t, st, runID) != checkpoint.RunSucceeded {
		if status := runStatus(t, st, runID); status == checkpoint.RunFailed {
			t.Fatalf("the run failed after %s (ended: %s): an operator would be needed; partitions %s\nworker 0:\n%s",
				time.Since(started), strings.Join(ended, "; "), states(partitionsOf(t, s, testDate)), tail(workers[0].Stderr(), 3000))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run is %s after 2 minutes (ended: %s); partitions %s", runStatus(t, st, runID),
				strings.Join(ended, "; "), states(partitionsOf(t, s, testDate)))
		}
		time.Sleep(time.Duration(rng.Int64N(int64(40 * time.Millisecond))))
		if len(ended) >= n {
			continue
		}
		if what := terminateWriter(t, names, rng); what != "" {
			ended = append(ended, what)
		}
	}
	took := time.Since(started)
	stopWorkers(t, workers...)
	for _, p := range poolAuditOf(t, s, transfers) {
		t.Error(p)
	}
	if len(ended) < n/2 {
		t.Errorf("only %d sessions were ended (want %d): the run was over too soon to test anything", len(ended), n)
	}
	t.Logf("run succeeded in %s with %d sessions ended and no operator action: %s", took.Round(time.Millisecond), len(ended), strings.Join(ended, "; "))
}

// terminateWriter ends, with pg_terminate_backend, one of the sessions
// named by names that is inside a write transaction, chosen by rng, and
// says which ("" when none was).
func terminateWriter(t *testing.T, names []string, rng *rand.Rand) string {
	t.Helper()
	return terminateWriterOn(t, pgtest.URL(t), names, rng)
}

// terminateWriterOn is terminateWriter on the server of adminURL.
func terminateWriterOn(t *testing.T, adminURL string, names []string, rng *rand.Rand) string {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	rows, err := admin.Query(ctx, sqlWritingSessions, names)
	if err != nil {
		t.Fatal(err)
	}
	type session struct {
		pid          int32
		state, query string
	}
	found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (session, error) {
		var x session
		return x, r.Scan(&x.pid, &x.state, &x.query)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		return ""
	}
	x := found[rng.IntN(len(found))]
	var ok bool
	if err := admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", x.pid).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	if !ok {
		return ""
	}
	return fmt.Sprintf("%s: %q", x.state, x.query)
}
