package steps_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/steps"
)

// BenchmarkEffectSeparateVsSame puts separate-store effect steps (plan,
// apply, record: three commits in two files) beside same-store ones
// (steps.Apply on steps.State). Both sides alternate within one run, so
// the ratio is not skewed by the machine's drift; read the ratio. The
// same-store side against hand-written SQL is package bench's effects
// workload (go test -bench Effect ./bench/, or stepwise bench).
//
//	go test -run '^$' -bench 'EffectSeparateVsSame' -benchtime 6x -count 3 ./steps/
//
// One iteration is one round of fxPerRound steps per side.

// fxBenchSyncs are the synchronous levels each benchmark runs at: full is
// the default and the goal's level; normal shows the CPU cost undiluted by
// fsync.
var fxBenchSyncs = []string{sqlite.SyncFull, sqlite.SyncNormal}

const (
	fxBenchOutput = 42 // every step returns it
	fxPerRound    = 500
	fxBenchKeys   = 64 // distinct keys the steps cycle through
)

func fxKeyName(i int) string { return "acct:" + strconv.Itoa(i%fxBenchKeys) }

// fxCPU is the process's user+system CPU time so far.
func fxCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// fxSide is one side of a benchmark: a name and a function committing the
// steps with the given IDs, key i%fxBenchKeys for the i-th.
type fxSide struct {
	name      string
	run       func(b *testing.B, ids []string)
	wall, cpu time.Duration
}

// fxAlternate runs b.N rounds of fxPerRound steps on each side, the side
// that goes first alternating by round, and reports each side's rate, the
// ratio of the second side's rate to the first's, and the second side's
// extra wall and CPU time per step.
func fxAlternate(b *testing.B, base, other *fxSide) {
	ids := make([]string, b.N*fxPerRound)
	for i := range ids {
		ids[i] = steps.ID("post", strconv.Itoa(i))
	}
	timed := func(s *fxSide, ids []string) {
		w0, c0 := time.Now(), fxCPU(b)
		s.run(b, ids)
		s.wall += time.Since(w0)
		s.cpu += fxCPU(b) - c0
	}
	b.ResetTimer()
	for round := 0; round < b.N; round++ {
		ids := ids[round*fxPerRound : (round+1)*fxPerRound]
		if round%2 == 0 {
			timed(base, ids)
			timed(other, ids)
		} else {
			timed(other, ids)
			timed(base, ids)
		}
	}
	b.StopTimer()
	n := float64(len(ids))
	baseRate, otherRate := n/base.wall.Seconds(), n/other.wall.Seconds()
	b.ReportMetric(baseRate, base.name+"/s")
	b.ReportMetric(otherRate, other.name+"/s")
	b.ReportMetric(otherRate/baseRate, "ratio")
	b.ReportMetric((other.wall-base.wall).Seconds()/n*1e6, "extra-us/step")
	b.ReportMetric((other.cpu-base.cpu).Seconds()/n*1e6, "extra-cpu-us/step")
}

// fxBenchStore opens a checkpoint store in dir, seeds fxBenchKeys keys of the
// built-in state table at 0 and claims a run on it.
func fxBenchStore(b *testing.B, dir, sync string) (*sqlite.Store, *steps.Run) {
	b.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(dir, "stepwise.db"), Synchronous: sync})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	for i := range fxBenchKeys {
		if _, err := st.DB().Exec(`INSERT INTO stepwise_state (key, value, version) VALUES (?, 0, 0)`, fxKeyName(i)); err != nil {
			b.Fatal(err)
		}
	}
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{
		RunID: "bench/effects", Job: "bench", RunKey: "effects", Params: []byte("{}"), ParamsHash: "bench",
		Owner: "bench:1", Now: time.Now(), LeaseFor: time.Hour,
	})
	if err != nil {
		b.Fatal(err)
	}
	run, err := steps.Begin(ctx, steps.Config{Store: st, Lease: c.Lease})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { run.Close() })
	return st, run
}

// fxApplySteps runs one steps.Apply per ID on target, each adding 1 to one
// key.
func fxApplySteps(run *steps.Run, target steps.Target) func(b *testing.B, ids []string) {
	return func(b *testing.B, ids []string) {
		ctx := context.Background()
		for _, id := range ids {
			key := fxKeyName(fxStepNumber(b, id))
			out, err := steps.Apply(ctx, run, id, target, func(ctx context.Context, e *steps.Effects) (int, error) {
				e.Add(key, 1)
				return fxBenchOutput, nil
			})
			if err != nil || out != fxBenchOutput {
				b.Fatalf("step %s: %d, %v", id, out, err)
			}
		}
	}
}

func fxStepNumber(b *testing.B, id string) int {
	n, err := strconv.Atoi(id[strings.LastIndexByte(id, '/')+1:])
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// fxCheckState fails the benchmark unless the state table holds n additions
// in all, each with its version bump.
func fxCheckState(b *testing.B, db *sql.DB, n int) {
	b.Helper()
	var sum, versions int
	if err := db.QueryRow(`SELECT sum(value), sum(version) FROM stepwise_state`).Scan(&sum, &versions); err != nil {
		b.Fatal(err)
	}
	if sum != n || versions != n {
		b.Fatalf("state holds %d added in %d versions; want %d", sum, versions, n)
	}
}

// BenchmarkEffectSeparateVsSame: separate-store effect steps (an accounts
// table in another SQLite file) beside same-store ones (ratio =
// separate/same). Each separate step commits three times in two files.
func BenchmarkEffectSeparateVsSame(b *testing.B) {
	for _, sync := range fxBenchSyncs {
		b.Run("sync="+sync, func(b *testing.B) {
			ctx := context.Background()
			dir := b.TempDir()
			st, run := fxBenchStore(b, dir, sync)
			path := filepath.Join(dir, "ledger.db")
			db, err := sqlite.OpenTarget(ctx, sqlite.Config{Path: path, Synchronous: sync})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { db.Close() })
			if _, err := db.Exec(createAccounts); err != nil {
				b.Fatal(err)
			}
			for i := range fxBenchKeys {
				if _, err := db.Exec(`INSERT INTO accounts VALUES (?, 0, 0)`, fxKeyName(i)); err != nil {
					b.Fatal(err)
				}
			}
			// The two sides must not share step IDs: prefix the separate ones.
			separate := fxApplySteps(run, steps.Target{Location: path, Table: accountsTable})
			same := &fxSide{name: "same", run: fxApplySteps(run, steps.State)}
			sep := &fxSide{name: "separate", run: func(b *testing.B, ids []string) {
				sepIDs := make([]string, len(ids))
				for i, id := range ids {
					sepIDs[i] = "sep/" + id
				}
				separate(b, sepIDs)
			}}
			fxAlternate(b, same, sep)
			fxCheckState(b, st.DB(), b.N*fxPerRound)
			var sum, versions, applied int
			if err := db.QueryRow(`SELECT sum(balance), sum(version), (SELECT count(*) FROM stepwise_applied) FROM accounts`).Scan(&sum, &versions, &applied); err != nil {
				b.Fatal(err)
			}
			if n := b.N * fxPerRound; sum != n || versions != n || applied != n {
				b.Fatalf("ledger holds %d in %d versions, %d applied effects; want %d each", sum, versions, applied, n)
			}
		})
	}
}
