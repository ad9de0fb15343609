package bench_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/checkpoint/stores"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
)

// BenchmarkPartitions settles a CPU-bound day with hot keys (10,000
// accounts, every chunk touching many of them) on PostgreSQL, same store,
// with 4 partitions (goroutines of one process, each chunk locking its
// accounts in key order) and with 1, alternating, in the same run, and
// reports ratio = 1-partition time / 4-partition time (above 1: faster)
// and the aborts: version conflicts and re-plans (on the same store a
// collision waits for the row lock, so both stay 0; a deadlock or a
// serialisation failure would fail the run).
//
//	STEPWISE_TEST_PG=postgres://postgres@127.0.0.1:5432/test go test -run '^$' -bench Partitions -benchtime 1x ./bench/
//
// STEPWISE_BENCH_ITEMS sets the transfers (default 40,000).
func BenchmarkPartitions(b *testing.B) {
	items := envInt(b, "STEPWISE_BENCH_ITEMS", 40_000)
	base := pgtest.Database(b)
	var one, four time.Duration
	var aborts int
	for i := range b.N * 2 {
		parts := 1
		if i%2 == 1 {
			parts = 4
		}
		d, stats := settleOnce(b, base, items, parts)
		aborts += stats.Conflicts + stats.Replans
		if parts == 1 {
			one += d
		} else {
			four += d
		}
	}
	b.ReportMetric(one.Seconds()/four.Seconds(), "ratio")
	b.ReportMetric(one.Seconds()/float64(b.N), "s-1-partition")
	b.ReportMetric(four.Seconds()/float64(b.N), "s-4-partitions")
	b.ReportMetric(float64(aborts), "aborts")
	if aborts != 0 {
		b.Errorf("%d conflicts and re-plans with partitions on the same store; want 0 (collisions wait for the row lock)", aborts)
	}
}

// settleOnce seeds a fresh schema of base and settles it with parts
// partitions, returning how long the run took and its stats.
func settleOnce(b *testing.B, base string, items, parts int) (time.Duration, runnerStats) {
	b.Helper()
	ctx := context.Background()
	name := pgtest.Name(b)
	pgtest.Exec(b, base, "CREATE SCHEMA "+name)
	b.Cleanup(func() { pgtest.Exec(b, base, "DROP SCHEMA "+name+" CASCADE") })
	loc := base + "?search_path=" + name
	if strings.Contains(base, "?") {
		loc = base + "&search_path=" + name
	}
	db, err := postgres.OpenDB(ctx, postgres.Config{URL: loc})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	const date = "2031-03-14"
	if err := settlement.Seed(ctx, db, settlement.SeedConfig{Accounts: 10_000, Transfers: items, Date: date, Seed: 11, Balance: 50_000}); err != nil {
		b.Fatal(err)
	}
	st, err := stores.Open(ctx, loc, stores.Settings{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	var reg jobs.Registry
	reg.MustRegister(settlement.Job)
	r, err := runner.New(runner.Config{Store: st, Jobs: &reg})
	if err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	start := time.Now()
	res, err := r.Run(ctx, runner.Request{Job: settlement.Job.Name(),
		Values: map[string]string{"date": date, "chunk": "1000", "partitions": strconv.Itoa(parts)}})
	took := time.Since(start)
	b.StopTimer()
	if err != nil || res.Status != checkpoint.RunSucceeded {
		b.Fatalf("settle with %d partitions: %q, %v", parts, res.Status, err)
	}
	if parts > 1 {
		ps, err := st.Partitions(ctx, res.RunID, "post")
		if err != nil || len(ps) != parts {
			b.Fatalf("%d partitions recorded (%v), want %d", len(ps), err, parts)
		}
	}
	b.Logf("%s: %d partitions, %d transfers in %s", res.RunID, parts, items, took.Round(time.Millisecond))
	return took, runnerStats{Conflicts: res.Stats.Conflicts, Replans: res.Stats.Replans}
}

type runnerStats struct{ Conflicts, Replans int }
