package steps_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/steps"
)

// These benchmarks measure the per-step durable rate (one steps.Do, one
// committed checkpoint) against the store's raw limit: one hand-written
// BEGIN IMMEDIATE / INSERT / COMMIT of a row of the same shape into an
// identical steps table, with the very same DSN (sqlite.DSN), so both
// sides pay the same fsync per commit. Absolute rates wander on a shared
// machine; the number to read is the ratio from BenchmarkStepVsRaw, whose two
// sides interleave within one run. The goal is ratio >= 0.9 at sync=full.
//
//	go test -run '^$' -bench 'StepVsRaw' -benchtime 3x ./steps/
//	go test -run '^$' -bench 'StepDurable|RawInsert' -benchtime 2s ./steps/
//
// BenchmarkStepDurable and BenchmarkRawInsert count b.N steps or rows, so
// give them a duration, not a tiny count. Benchmarks run only under -bench;
// plain `go test ./...` skips them.

// benchSyncs are the synchronous levels each benchmark runs at: full is the
// default and the goal's level; normal is for reference.
var benchSyncs = []string{sqlite.SyncFull, sqlite.SyncNormal}

const (
	benchRunID  = "bench/1"
	benchOutput = 42 // every benchmark step returns this small int
)

// benchStepIDs returns n distinct step IDs starting at from, built outside
// the timed region so both sides write the very same keys.
func benchStepIDs(from, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = steps.ID("step", strconv.Itoa(from+i))
	}
	return ids
}

// stepBench is a claimed run ready for steps.Do.
type stepBench struct {
	store *sqlite.Store
	run   *steps.Run
}

func openStepBench(b *testing.B, dir, sync string) *stepBench {
	b.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(dir, "stepwise.db"), Synchronous: sync})
	if err != nil {
		b.Fatalf("open store: %v", err)
	}
	b.Cleanup(func() { st.Close() })
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{
		RunID: benchRunID, Job: "bench", RunKey: "1", Params: []byte("{}"), ParamsHash: "bench",
		Owner: "bench:1", Now: time.Now(), LeaseFor: time.Hour,
	})
	if err != nil {
		b.Fatalf("claim: %v", err)
	}
	run, err := steps.Begin(ctx, steps.Config{Store: st, Lease: c.Lease})
	if err != nil {
		b.Fatalf("begin: %v", err)
	}
	return &stepBench{store: st, run: run}
}

func noopStep(context.Context) (int, error) { return benchOutput, nil }

// do runs one no-op step per ID, each with its own durable checkpoint.
func (s *stepBench) do(b *testing.B, ids []string) {
	ctx := context.Background()
	for _, id := range ids {
		out, err := steps.Do(ctx, s.run, id, noopStep)
		if err != nil {
			b.Fatalf("step %s: %v", id, err)
		}
		if out != benchOutput {
			b.Fatalf("step %s returned %d, want %d", id, out, benchOutput)
		}
	}
}

// rawBench is the hand-written baseline: its own database/sql handle on the
// same DSN, one connection like the store, and one prepared INSERT.
type rawBench struct {
	db   *sql.DB
	stmt *sql.Stmt
}

// sqlRawInsert writes the row shape steps.Do writes for a completed step.
const sqlRawInsert = `INSERT INTO steps (run_id, step_id, status, output, input_hash, error, tries, attempt, started_at, finished_at)
VALUES (?, ?, 'completed', ?, '', '', 1, 1, ?, ?)`

// openRawBench creates the raw database in dir. Its steps table is created
// from the very SQL the store's migration left in sqlite_master of schemaFrom,
// so columns, primary key and WITHOUT ROWID are identical by construction.
func openRawBench(b *testing.B, dir, sync string, schemaFrom *sql.DB) *rawBench {
	b.Helper()
	ctx := context.Background()
	rows, err := schemaFrom.QueryContext(ctx,
		`SELECT sql FROM sqlite_master WHERE tbl_name = 'steps' AND sql IS NOT NULL ORDER BY type = 'index'`)
	if err != nil {
		b.Fatalf("read steps schema: %v", err)
	}
	var ddl []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			b.Fatalf("read steps schema: %v", err)
		}
		ddl = append(ddl, s)
	}
	if err := rows.Err(); err != nil || len(ddl) == 0 {
		b.Fatalf("read steps schema: %v (%d statements)", err, len(ddl))
	}
	rows.Close()

	dsn, err := sqlite.DSN(sqlite.Config{Path: filepath.Join(dir, "raw.db"), Synchronous: sync})
	if err != nil {
		b.Fatalf("dsn: %v", err)
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		b.Fatalf("open raw: %v", err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	b.Cleanup(func() { db.Close() })
	for _, s := range ddl {
		if _, err := db.ExecContext(ctx, s); err != nil {
			b.Fatalf("create raw schema: %v", err)
		}
	}
	stmt, err := db.PrepareContext(ctx, sqlRawInsert)
	if err != nil {
		b.Fatalf("prepare raw insert: %v", err)
	}
	b.Cleanup(func() { stmt.Close() })
	return &rawBench{db: db, stmt: stmt}
}

var benchOutputJSON = []byte(strconv.Itoa(benchOutput))

// insert commits one row per ID, each in its own transaction.
func (r *rawBench) insert(b *testing.B, ids []string) {
	ctx := context.Background()
	for _, id := range ids {
		now := time.Now().UTC().Format("2006-01-02T15:04:05.000000Z")
		tx, err := r.db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatalf("begin: %v", err)
		}
		if _, err := tx.StmtContext(ctx, r.stmt).ExecContext(ctx, benchRunID, id, benchOutputJSON, now, now); err != nil {
			b.Fatalf("insert %s: %v", id, err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatalf("commit: %v", err)
		}
	}
}

func countSteps(b *testing.B, db *sql.DB) int {
	b.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM steps`).Scan(&n); err != nil {
		b.Fatalf("count steps: %v", err)
	}
	return n
}

// BenchmarkStepDurable runs b.N no-op steps through steps.Do on a claimed
// run, each committing its checkpoint durably.
func BenchmarkStepDurable(b *testing.B) {
	for _, sync := range benchSyncs {
		b.Run("sync="+sync, func(b *testing.B) {
			s := openStepBench(b, b.TempDir(), sync)
			ids := benchStepIDs(0, b.N)
			b.ResetTimer()
			s.do(b, ids)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "steps/s")
			if n := countSteps(b, s.store.DB()); n != b.N {
				b.Fatalf("%d checkpoints recorded, want %d", n, b.N)
			}
		})
	}
}

// BenchmarkRawInsert commits b.N rows of the checkpoint's shape, one
// BEGIN/INSERT/COMMIT each, through database/sql and a prepared statement.
func BenchmarkRawInsert(b *testing.B) {
	for _, sync := range benchSyncs {
		b.Run("sync="+sync, func(b *testing.B) {
			dir := b.TempDir()
			schema := openStepBench(b, dir, sync) // only for the steps table's SQL
			r := openRawBench(b, dir, sync, schema.store.DB())
			ids := benchStepIDs(0, b.N)
			b.ResetTimer()
			r.insert(b, ids)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
			if n := countSteps(b, r.db); n != b.N {
				b.Fatalf("%d rows, want %d", n, b.N)
			}
		})
	}
}

const (
	// vsPerRound is how many raw rows and how many steps one round commits.
	vsPerRound = 2000
	// vsBlock is how many commits one side makes before the other side
	// takes over, so both see the same machine load within a round.
	vsBlock = 100
)

// BenchmarkStepVsRaw measures both sides in one run, so their ratio is not
// skewed by the machine's drift. One iteration is one round: vsPerRound raw
// rows and vsPerRound steps, interleaved in blocks of vsBlock (raw, step,
// step, raw, ...). Metrics:
//
//   - ratio: the stepwise rate over the raw rate (1.0 means no cost beyond
//     the commit); the goal is >= 0.9 at sync=full;
//   - extra-us/step: wall time per step beyond a raw commit;
//   - extra-cpu-us/step: process CPU time per step beyond a raw commit,
//     which a busy machine inflates far less than wall time.
//
// A round takes about 0.6 s at sync=full on a quiet machine; run it with
// -benchtime 3x or more for several rounds.
func BenchmarkStepVsRaw(b *testing.B) {
	for _, sync := range benchSyncs {
		b.Run("sync="+sync, func(b *testing.B) {
			dir := b.TempDir()
			s := openStepBench(b, dir, sync)
			r := openRawBench(b, dir, sync, s.store.DB())
			var rawTime, stepTime, rawCPU, stepCPU time.Duration
			timed := func(wall, cpu *time.Duration, f func()) {
				c0, start := processCPU(b), time.Now()
				f()
				*wall += time.Since(start)
				*cpu += processCPU(b) - c0
			}
			ids := benchStepIDs(0, b.N*vsPerRound)
			b.ResetTimer()
			for block := 0; block < b.N*vsPerRound/vsBlock; block++ {
				ids := ids[block*vsBlock : (block+1)*vsBlock]
				raw := func() { timed(&rawTime, &rawCPU, func() { r.insert(b, ids) }) }
				step := func() { timed(&stepTime, &stepCPU, func() { s.do(b, ids) }) }
				if block%2 == 0 {
					raw()
					step()
				} else {
					step()
					raw()
				}
			}
			b.StopTimer()
			total := float64(b.N * vsPerRound)
			rawRate, stepRate := total/rawTime.Seconds(), total/stepTime.Seconds()
			b.ReportMetric(rawRate, "raw/s")
			b.ReportMetric(stepRate, "steps/s")
			b.ReportMetric(stepRate/rawRate, "ratio")
			b.ReportMetric((stepTime-rawTime).Seconds()/total*1e6, "extra-us/step")
			b.ReportMetric((stepCPU-rawCPU).Seconds()/total*1e6, "extra-cpu-us/step")
		})
	}
}

// processCPU returns the user and system CPU time the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
