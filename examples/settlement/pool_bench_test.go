package settlement_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// BenchmarkProviderWait measures items that wait on an outside call: the
// provider job (pool_test.go), whose every item sleeps 5ms inside its item
// function (a simulated provider; no steps.Call, whose per-call intent
// and lease renewal would measure the store instead), one batch step of
// 8 partitions, chunks of 50, worked by 1, 2, 4 and 8 `stepwise worker`
// processes (--concurrency 1 each) on PostgreSQL, in the same run. The
// workers are started and listening before the run is enqueued; the time
// is from the enqueue to the run's success. It reports items/s for each
// pool size and each one's ratio to one worker (goal: 8 workers at least
// 6x one).
//
//	STEPWISE_TEST_PG=postgres://postgres@127.0.0.1:5432/test go test -run '^$' -bench ProviderWait -benchtime 1x ./examples/settlement/
//
// STEPWISE_BENCH_ITEMS sets the items (default 2400: 300 per partition).
func BenchmarkProviderWait(b *testing.B) {
	pgtest.URL(b)
	items := 2400
	if v := os.Getenv("STEPWISE_BENCH_ITEMS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 8 {
			b.Fatalf("STEPWISE_BENCH_ITEMS=%q: want a number of items, at least 8", v)
		}
		items = n
	}
	pools := []int{1, 2, 4, 8}
	took := map[int]time.Duration{}
	for range b.N {
		for _, n := range pools {
			took[n] += providerRun(b, n, items)
		}
	}
	one := took[1]
	var lines []string
	for _, n := range pools {
		rate := float64(items*b.N) / took[n].Seconds()
		ratio := one.Seconds() / took[n].Seconds()
		b.ReportMetric(rate, fmt.Sprintf("items/s-%dw", n))
		b.ReportMetric(ratio, fmt.Sprintf("ratio-%dw", n))
		lines = append(lines, fmt.Sprintf("%d worker(s): %.0f items/s, %.2fx one worker", n, rate, ratio))
	}
	verdict := "goal met"
	if one.Seconds()/took[8].Seconds() < 6 {
		verdict = "goal missed"
	}
	b.Logf("provider wait, %d items of 5ms, 8 partitions: %s; 8 workers >= 6x one: %s", items, strings.Join(lines, "; "), verdict)
}

// providerRun starts n workers on a fresh schema, enqueues the provider
// job's run of items and returns how long it took to succeed.
func providerRun(b *testing.B, n, items int) time.Duration {
	b.Helper()
	b.StopTimer()
	db := pgtest.Schema(b)
	st := openStore(b, db) // migrated before the workers start
	defer st.Close()
	var ws []*crashtest.Child
	for range n {
		ws = append(ws, crashtest.Start(b, workerSpec(db, 30*time.Second, 1)))
	}
	for _, w := range ws {
		w.WaitFor("the worker's start line", func() bool { return strings.Contains(w.Stdout(), "worker: taking") })
	}
	time.Sleep(200 * time.Millisecond) // listening
	r, err := runner.New(runner.Config{Store: st, Jobs: poolRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	key := fmt.Sprintf("bench-%d", n)
	b.StartTimer()
	start := time.Now()
	if _, err := r.Enqueue(context.Background(), runner.EnqueueRequest{Job: providerJob.Name(), Values: map[string]string{
		"key": key, "items": strconv.Itoa(items), "partitions": "8", "chunk": "50", "delay": "5ms"}}); err != nil {
		b.Fatal(err)
	}
	runID := jobs.RunID(providerJob.Name(), key)
	for runStatus(b, st, runID) != checkpoint.RunSucceeded {
		if time.Since(start) > 5*time.Minute {
			b.Fatalf("%d workers: the run did not succeed within 5 minutes", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	d := time.Since(start)
	b.StopTimer()
	owners := map[string]bool{}
	ps, err := st.Partitions(context.Background(), runID, "call")
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range ps {
		owners[checkpoint.OwnerName(p.Owner)] = true
	}
	for _, w := range ws {
		w.Signal(syscall.SIGTERM)
	}
	for _, w := range ws {
		w.Wait()
	}
	b.Logf("%d worker(s): %d items in %s, partitions worked by %d of them", n, items, d.Round(time.Millisecond), len(owners))
	b.StartTimer()
	return d
}
