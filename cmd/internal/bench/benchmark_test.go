package bench_test

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/cmd/internal/bench"
)

// The go test -bench wrappers: each runs one workload of package bench
// (the same code, baselines and interleaving as `stepwise bench`) once per
// iteration, on SQLite and, when STEPWISE_TEST_PG is set, on PostgreSQL
// in a database of its own, and reports the figures with b.ReportMetric:
//
//	go test -run '^$' -bench . -benchtime 1x ./bench/
//	STEPWISE_TEST_PG=postgres://postgres@127.0.0.1:5432/test go test -run '^$' -bench 'Chunked/postgres' -benchtime 1x ./bench/
//
// STEPWISE_BENCH_ITEMS sets the chunked workload's transfers (default
// 100,000; the goals are stated at 1,000,000), STEPWISE_BENCH_STEPS the
// per-step workloads' steps (default 2000), STEPWISE_BENCH_CLAIMS the runs
// claimed per claimer count (default 5000), STEPWISE_BENCH_DRAIN the runs
// drained per slot count (default 5000). A CPU profile: add
// -cpuprofile cpu.prof and read it with go tool pprof.

func BenchmarkPerStep(b *testing.B) { benchWorkload(b, bench.WorkloadSteps) }

func BenchmarkEffect(b *testing.B) { benchWorkload(b, bench.WorkloadEffects) }

func BenchmarkChunked(b *testing.B) { benchWorkload(b, bench.WorkloadChunked) }

func BenchmarkClaims(b *testing.B) { benchWorkload(b, bench.WorkloadClaims) }

func BenchmarkDrain(b *testing.B) { benchWorkload(b, bench.WorkloadDrain) }

func benchWorkload(b *testing.B, workload string) {
	cfg := bench.Config{Items: envInt(b, "STEPWISE_BENCH_ITEMS", 100_000), Steps: envInt(b, "STEPWISE_BENCH_STEPS", 2000),
		Claims: envInt(b, "STEPWISE_BENCH_CLAIMS", 5000), Drain: envInt(b, "STEPWISE_BENCH_DRAIN", 5000), Accounts: 10_000,
		Workloads: []string{workload}}
	b.Run("store=sqlite", func(b *testing.B) {
		cfg := cfg
		cfg.Dir = b.TempDir()
		runBench(b, cfg)
	})
	b.Run("store=postgres", func(b *testing.B) {
		cfg := cfg
		cfg.DB = pgtest.Database(b)
		runBench(b, cfg)
	})
}

// runBench runs cfg b.N times and reports the last run's figures: per
// result its ratio (ratio, ratio-rerun, ...), and for rates both sides'.
func runBench(b *testing.B, cfg bench.Config) {
	var rep bench.Report
	for range b.N {
		var err error
		if rep, err = bench.Run(context.Background(), cfg); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	for i, r := range rep.Results {
		suffix := ""
		if i > 0 {
			suffix = "-" + strconv.Itoa(i)
		}
		b.ReportMetric(r.Ratio, "ratio"+suffix)
		if r.Unit != "s" {
			b.ReportMetric(r.Ours, "ours-"+r.Unit+suffix)
			b.ReportMetric(r.Raw, "raw-"+r.Unit+suffix)
		} else {
			b.ReportMetric(r.Ours, "ours-s"+suffix)
			b.ReportMetric(r.Raw, "raw-s"+suffix)
		}
	}
	if rep.Memory.Items > 0 {
		b.ReportMetric(rep.Memory.PeakGoHeapMiB, "peak-heap-MiB")
	}
}

func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive count", name, s)
	}
	return n
}
