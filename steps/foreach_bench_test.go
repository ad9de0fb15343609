package steps_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/steps"
)

// BenchmarkForEachTransfers measures a chunked settlement against the
// store's raw limit, both with the very same DSN (sqlite.DSN: WAL,
// synchronous=FULL, immediate transactions) and one connection each:
//
//   - run: N transfers (two Adds, NotBelow(0)) through one ForEach, 1000
//     items a chunk, on a same-store accounts table of 10,000 accounts;
//     the raw side, hand-written SQL with prepared statements, does per item
//     what the anchors call a settlement transfer (read 2 balances and
//     versions, 2 version-CAS UPDATEs, 1 item checkpoint INSERT into an
//     identical items table), 1000 items a transaction, in its own database.
//     The sides alternate a chunk at a time (ForEach's progress hook runs
//     the next raw chunk), so machine drift hits both alike. Metrics:
//     items/s, raw-items/s, ratio (goal >= 0.6); process CPU per item of
//     each side and cpu-ratio (raw CPU over ForEach CPU); the peak of the Go
//     heap in use and of the Go runtime's total memory (runtime/metrics,
//     sampled every 10 ms during the ForEach) and the process's max RSS.
//     ForEach folds a chunk's operations per account (one read and one CAS
//     per account touched, statements grouped by kind), so it can beat the
//     per-item raw transfer.
//   - rerun: a new attempt over that run, (i) with the step finished
//     (returns the recorded summary: finished-us), and (ii) with every item
//     done but the step left running, as a crash just before the step's
//     finish leaves it (reads every item key, a chunk's range at a time:
//     unfinished-s, mean of 2); raw: read the run's N item keys with one
//     SELECT into a map (raw-load-s, mean of 3, alternating with (ii)).
//     ratio is (ii) over raw (goal <= 1.5); peak-heap-MiB is (ii)'s.
//
// N is STEPWISE_BENCH_ITEMS (default 100,000; the goals are stated for
// 1,000,000). Each iteration settles all N items, so run it once:
//
//	go test -run '^$' -bench '^BenchmarkForEachTransfers$' -benchtime 1x ./steps/
//	STEPWISE_BENCH_ITEMS=1000000 go test -run '^$' -bench '^BenchmarkForEachTransfers$' -benchtime 1x -timeout 30m ./steps/
//
// Max RSS of the run alone (the rerun's raw baseline, a map of N keys,
// would dominate the whole benchmark's):
//
//	go test -c -o /tmp/fe-bench/steps.test ./steps/
//	STEPWISE_BENCH_ITEMS=1000000 /usr/bin/time -v /tmp/fe-bench/steps.test -test.run '^$' \
//	    -test.bench '^BenchmarkForEachTransfers$/^run$' -test.benchtime 1x 2>&1 | grep -E 'items/s|Maximum resident'
//
// A CPU profile of the run: add -test.cpuprofile run.prof, then
// go tool pprof -top -cum -focus 'steps.ForEach' -ignore 'feBenchSettle.func' /tmp/fe-bench/steps.test run.prof.
func BenchmarkForEachTransfers(b *testing.B) {
	n := feBenchItems(b)
	var last *feBenchRun // the latest finished run, kept for the rerun
	b.Cleanup(func() {
		if last != nil {
			last.close()
		}
	})
	settle := func(b *testing.B, report bool) {
		if last != nil {
			last.close()
		}
		last = feBenchSettle(b, n, report)
	}
	b.Run("run", func(b *testing.B) {
		for range b.N {
			settle(b, true)
		}
	})
	b.Run("rerun", func(b *testing.B) {
		if last == nil {
			settle(b, false)
			b.ResetTimer()
		}
		for range b.N {
			last.rerun(b)
		}
	})
}

const (
	feBenchItemsEnv = "STEPWISE_BENCH_ITEMS"
	feBenchAccts    = 10000
	feBenchChunk    = 1000
	feBenchOpening  = int64(1) << 40 // no transfer ever overdraws
	feBenchRunID    = "settle/bench"
	feBenchStep     = "post"
)

func feBenchItems(b *testing.B) int {
	s := os.Getenv(feBenchItemsEnv)
	if s == "" {
		return 100_000
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive item count", feBenchItemsEnv, s)
	}
	return n
}

// feBenchAccounts are the account IDs, built once.
var feBenchAccounts = sync.OnceValue(func() []string {
	ids := make([]string, feBenchAccts)
	for i := range ids {
		ids[i] = fmt.Sprintf("acct%05d", i)
	}
	return ids
})

// feBenchXfer returns transfer i: a deterministic pseudo-random pair of
// distinct accounts and amount, keyed in ascending order.
func feBenchXfer(i int) xfer {
	h := uint64(i)*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019
	h ^= h >> 31
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 29
	from := int(h % feBenchAccts)
	to := (from + 1 + int((h>>20)%(feBenchAccts-1))) % feBenchAccts
	accts := feBenchAccounts()
	return xfer{ID: feBenchKey(i), From: accts[from], To: accts[to], Amount: 1 + int64(h>>40)%1000}
}

// feBenchKey is item i's key: fixed-width so keys ascend with i.
func feBenchKey(i int) string {
	var buf [9]byte
	buf[0] = 'T'
	for j, v := 8, i; j > 0; j-- {
		buf[j] = byte('0' + v%10)
		v /= 10
	}
	return string(buf[:])
}

// feBenchSource streams the n transfers without holding them.
func feBenchSource(n int) steps.Source[xfer] {
	return steps.Seq(func(yield func(string, xfer) bool) {
		for i := range n {
			x := feBenchXfer(i)
			if !yield(x.ID, x) {
				return
			}
		}
	}, int64(n))
}

// feBenchRun is a finished settlement and its raw twin.
type feBenchRun struct {
	n     int
	dir   string
	store *sqlite.Store
	raw   *sql.DB
}

func (r *feBenchRun) close() {
	if r.store != nil {
		r.store.Close()
	}
	if r.raw != nil {
		r.raw.Close()
	}
	os.RemoveAll(r.dir)
}

// feBenchOpenStore opens the checkpoint store in dir and creates the
// accounts table with every account's opening balance.
func feBenchOpenStore(b *testing.B, dir string) *sqlite.Store {
	b.Helper()
	st, err := sqlite.Open(context.Background(), sqlite.Config{Path: filepath.Join(dir, "stepwise.db"), Synchronous: sqlite.SyncFull})
	if err != nil {
		b.Fatal(err)
	}
	feBenchAccountsTable(b, st.DB())
	return st
}

func feBenchAccountsTable(b *testing.B, db *sql.DB) {
	b.Helper()
	tx, err := db.Begin()
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec(createAccounts); err != nil {
		b.Fatal(err)
	}
	for _, id := range feBenchAccounts() {
		if _, err := tx.Exec(`INSERT INTO accounts VALUES (?, ?, 0)`, id, feBenchOpening); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
}

// feBenchOpenRaw opens the raw baseline's database in dir with the store's
// DSN and creates its accounts table and an items table from the very SQL
// the store's migration left in sqlite_master, so both are identical.
func feBenchOpenRaw(b *testing.B, dir string, schemaFrom *sql.DB) *sql.DB {
	b.Helper()
	var ddl string
	if err := schemaFrom.QueryRow(`SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'items'`).Scan(&ddl); err != nil {
		b.Fatalf("read the items table's schema: %v", err)
	}
	dsn, err := sqlite.DSN(sqlite.Config{Path: filepath.Join(dir, "raw.db"), Synchronous: sqlite.SyncFull})
	if err != nil {
		b.Fatal(err)
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		b.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	if _, err := db.Exec(ddl); err != nil {
		b.Fatal(err)
	}
	feBenchAccountsTable(b, db)
	return db
}

// feBenchClaim starts a new attempt of the benchmark run.
func feBenchClaim(b *testing.B, st *sqlite.Store) checkpoint.Lease {
	b.Helper()
	c, err := st.Claim(context.Background(), checkpoint.ClaimRequest{
		RunID: feBenchRunID, Job: "settle", RunKey: "bench", Params: []byte(`{}`), ParamsHash: "bench",
		Owner: "bench:1", Now: time.Now(), LeaseFor: time.Hour, OwnerGone: func(string) bool { return true },
	})
	if err != nil {
		b.Fatal(err)
	}
	return c.Lease
}

// feBenchSettle settles n transfers through ForEach in a fresh directory,
// with the raw baseline interleaved a chunk at a time: after each ForEach
// chunk commits, its progress hook settles the next raw chunk, so both sides
// meet the same machine load. The hook's wall and CPU time are taken out of
// the ForEach's. It reports the metrics of the run when report is set.
func feBenchSettle(b *testing.B, n int, report bool) *feBenchRun {
	b.Helper()
	b.StopTimer()
	ctx := context.Background()
	// Not b.TempDir(): the run outlives this sub-benchmark for the rerun.
	dir, err := os.MkdirTemp("", "stepwise-bench-")
	if err != nil {
		b.Fatal(err)
	}
	r := &feBenchRun{n: n, dir: dir}
	kept := false
	defer func() {
		if !kept { // b.Fatal: nothing to keep for the rerun
			r.close()
		}
	}()
	r.store = feBenchOpenStore(b, dir)
	r.raw = feBenchOpenRaw(b, dir, r.store.DB())
	raw, err := newFeBenchRaw(r.raw)
	if err != nil {
		b.Fatal(err)
	}
	defer raw.close()

	// Between sides a forced, untimed GC settles the heap, so each side
	// pays for the garbage it makes, not for the other's.
	var rawWall, rawCPU, pausedWall, pausedCPU time.Duration
	rawDone := 0
	rawChunk := func() {
		c0, start := feProcessCPU(), time.Now()
		runtime.GC()
		to := min(rawDone+feBenchChunk, n)
		rc0, rstart := feProcessCPU(), time.Now()
		if err := raw.settle(ctx, rawDone, to); err != nil {
			b.Fatalf("raw settlement: %v", err)
		}
		rawWall += time.Since(rstart)
		rawCPU += feProcessCPU() - rc0
		rawDone = to
		runtime.GC()
		pausedWall += time.Since(start)
		pausedCPU += feProcessCPU() - c0
	}
	lease := feBenchClaim(b, r.store)
	run, err := steps.Begin(ctx, steps.Config{Store: r.store, Lease: lease, OnProgress: func(steps.Progress) {
		if rawDone < n {
			b.StopTimer()
			rawChunk()
			b.StartTimer()
		}
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer run.Close()

	runtime.GC()
	mem := feStartMemSampler()
	b.StartTimer()
	c0, start := feProcessCPU(), time.Now()
	sum, err := steps.ForEach(ctx, run, feBenchStep, feBenchSource(n), post,
		steps.WithTarget(steps.Target{Table: accountsTable}), steps.ChunkSize(feBenchChunk))
	wall, cpu := time.Since(start)-pausedWall, feProcessCPU()-c0-pausedCPU
	b.StopTimer()
	peakHeap, peakSys := mem.stop()
	if err != nil {
		b.Fatal(err)
	}
	for rawDone < n {
		rawChunk()
	}
	if sum.Completed != int64(n) || sum.Rejected != 0 {
		b.Fatalf("summary %+v, want %d completed", sum, n)
	}
	feBenchCheck(b, r.store.DB(), n)
	feBenchCheck(b, r.raw, n)
	if report {
		rate, rawRate := float64(n)/wall.Seconds(), float64(n)/rawWall.Seconds()
		b.ReportMetric(rate, "items/s")
		b.ReportMetric(rawRate, "raw-items/s")
		b.ReportMetric(rate/rawRate, "ratio")
		b.ReportMetric(rawCPU.Seconds()/cpu.Seconds(), "cpu-ratio")
		b.ReportMetric(cpu.Seconds()/float64(n)*1e6, "cpu-us/item")
		b.ReportMetric(rawCPU.Seconds()/float64(n)*1e6, "raw-cpu-us/item")
		b.ReportMetric(float64(peakHeap)/(1<<20), "peak-heap-MiB")
		b.ReportMetric(float64(peakSys)/(1<<20), "peak-sys-MiB")
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
			b.ReportMetric(float64(ru.Maxrss)/1024, "maxrss-MiB") // KiB on Linux
		}
	}
	kept = true
	return r
}

// feProcessCPU returns the user and system CPU time the process has used.
func feProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// feBenchCheck asserts db holds n completed items and conserved money.
func feBenchCheck(b *testing.B, db *sql.DB, n int) {
	b.Helper()
	var items, total int64
	if err := db.QueryRow(`SELECT count(*) FROM items WHERE status = 'completed'`).Scan(&items); err != nil {
		b.Fatal(err)
	}
	if err := db.QueryRow(`SELECT sum(balance) FROM accounts`).Scan(&total); err != nil {
		b.Fatal(err)
	}
	if items != int64(n) || total != feBenchAccts*feBenchOpening {
		b.Fatalf("%d items, money %d; want %d items, money %d", items, total, n, feBenchAccts*feBenchOpening)
	}
}

// rerun times (i) a new attempt over the finished step, (ii) a new attempt
// with every item done and the step left running, and the raw load of the
// run's item keys into a map, before and after.
func (r *feBenchRun) rerun(b *testing.B) {
	b.Helper()
	b.StopTimer()
	ctx := context.Background()
	calls := 0
	fn := func(ctx context.Context, x xfer, e *steps.Effects) (int64, error) {
		calls++
		return post(ctx, x, e)
	}
	attempt := func() (steps.BatchSummary, time.Duration) {
		lease := feBenchClaim(b, r.store)
		start := time.Now()
		run, err := steps.Begin(ctx, steps.Config{Store: r.store, Lease: lease})
		if err != nil {
			b.Fatal(err)
		}
		defer run.Close()
		sum, err := steps.ForEach(ctx, run, feBenchStep, feBenchSource(r.n), fn,
			steps.WithTarget(steps.Target{Table: accountsTable}), steps.ChunkSize(feBenchChunk))
		took := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if calls != 0 || sum.Completed != int64(r.n) {
			b.Fatalf("rerun called fn %d times, summary %+v; want no calls, %d completed", calls, sum, r.n)
		}
		return sum, took
	}
	load := func() time.Duration {
		runtime.GC()
		start := time.Now()
		keys, err := feBenchLoadKeys(ctx, r.raw, r.n)
		took := time.Since(start)
		if err != nil || len(keys) != r.n {
			b.Fatalf("raw key load: %d keys, %v", len(keys), err)
		}
		return took
	}

	b.StartTimer()
	_, finished := attempt()
	b.StopTimer()
	// A crash after the last chunk's commit, before the step's finish,
	// leaves every item done and the step running. Raw loads and reruns
	// alternate: load, rerun, load, rerun, load.
	var unfinished, rawLoad time.Duration
	var peakHeap uint64
	const reps = 2
	rawLoad += load()
	for range reps {
		if _, err := r.store.DB().Exec(`UPDATE steps SET status = 'running' WHERE run_id = ? AND step_id = ?`, feBenchRunID, feBenchStep); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		mem := feStartMemSampler()
		b.StartTimer()
		sum, took := attempt()
		b.StopTimer()
		heap, _ := mem.stop()
		peakHeap = max(peakHeap, heap)
		if sum.Executed != 0 {
			b.Fatalf("unfinished rerun executed %d items", sum.Executed)
		}
		unfinished += took
		rawLoad += load()
	}
	unfinished /= reps
	rawLoad /= reps + 1
	b.ReportMetric(float64(finished.Microseconds()), "finished-us")
	b.ReportMetric(unfinished.Seconds(), "unfinished-s")
	b.ReportMetric(rawLoad.Seconds(), "raw-load-s")
	b.ReportMetric(unfinished.Seconds()/rawLoad.Seconds(), "ratio")
	b.ReportMetric(float64(peakHeap)/(1<<20), "peak-heap-MiB") // of the unfinished rerun
}

// feBenchLoadKeys is the raw rerun baseline: the run's item keys and
// statuses with one SELECT into a map.
func feBenchLoadKeys(ctx context.Context, db *sql.DB, n int) (map[string]string, error) {
	rows, err := db.QueryContext(ctx, `SELECT item_key, status FROM items WHERE run_id = ? AND step_id = ?`, feBenchRunID, feBenchStep)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	keys := make(map[string]string, n)
	for rows.Next() {
		var k, s string
		if err := rows.Scan(&k, &s); err != nil {
			return nil, err
		}
		keys[k] = s
	}
	return keys, rows.Err()
}

// feBenchRaw is the hand-written settlement: prepared statements on its own
// handle with the store's DSN.
type feBenchRaw struct {
	db                  *sql.DB
	read, update, items *sql.Stmt
}

func newFeBenchRaw(db *sql.DB) (*feBenchRaw, error) {
	r := &feBenchRaw{db: db}
	var err error
	if r.read, err = db.Prepare(`SELECT balance, version FROM accounts WHERE id = ?`); err != nil {
		return nil, err
	}
	if r.update, err = db.Prepare(`UPDATE accounts SET balance = ?, version = ? WHERE id = ? AND version = ?`); err != nil {
		return nil, err
	}
	r.items, err = db.Prepare(`INSERT INTO items (run_id, step_id, item_key, status, output, error, attempt, chunk)
VALUES (?, ?, ?, 'completed', ?, '', 1, '')`)
	return r, err
}

func (r *feBenchRaw) close() {
	for _, st := range []*sql.Stmt{r.read, r.update, r.items} {
		if st != nil {
			st.Close()
		}
	}
}

// settle posts transfers [from, to), feBenchChunk per transaction: per item
// two reads, the overdraft check, two version-CAS updates and the item's
// checkpoint with its output (the amount, as ForEach records it).
func (r *feBenchRaw) settle(ctx context.Context, from, to int) error {
	var out []byte
	for lo := from; lo < to; lo += feBenchChunk {
		tx, err := r.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		read, update, items := tx.StmtContext(ctx, r.read), tx.StmtContext(ctx, r.update), tx.StmtContext(ctx, r.items)
		for i := lo; i < min(lo+feBenchChunk, to); i++ {
			x := feBenchXfer(i)
			var fromBal, fromVer, toBal, toVer int64
			if err := read.QueryRowContext(ctx, x.From).Scan(&fromBal, &fromVer); err != nil {
				tx.Rollback()
				return err
			}
			if err := read.QueryRowContext(ctx, x.To).Scan(&toBal, &toVer); err != nil {
				tx.Rollback()
				return err
			}
			if fromBal < x.Amount {
				tx.Rollback()
				return fmt.Errorf("%s overdraws %s", x.ID, x.From)
			}
			for _, w := range [2]struct {
				id       string
				val, ver int64
			}{{x.From, fromBal - x.Amount, fromVer}, {x.To, toBal + x.Amount, toVer}} {
				res, err := update.ExecContext(ctx, w.val, w.ver+1, w.id, w.ver)
				if err != nil {
					tx.Rollback()
					return err
				}
				if n, _ := res.RowsAffected(); n != 1 {
					tx.Rollback()
					return fmt.Errorf("version of %s moved", w.id)
				}
			}
			out = strconv.AppendInt(out[:0], x.Amount, 10)
			if _, err := items.ExecContext(ctx, feBenchRunID, feBenchStep, x.ID, out); err != nil {
				tx.Rollback()
				return err
			}
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// feMemSampler records the peak Go heap in use (HeapInuse: heap objects
// plus unused heap spans) and the peak memory the Go runtime holds from the
// OS (Sys), from runtime/metrics, which reads them without stopping the
// world. Memory SQLite allocates outside the Go heap shows in max RSS only.
type feMemSampler struct {
	stopc         chan struct{}
	done          chan struct{}
	peakHeap, sys uint64
}

func feStartMemSampler() *feMemSampler {
	m := &feMemSampler{stopc: make(chan struct{}), done: make(chan struct{})}
	samples := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/total:bytes"},
	}
	sample := func() {
		metrics.Read(samples)
		m.peakHeap = max(m.peakHeap, samples[0].Value.Uint64()+samples[1].Value.Uint64())
		m.sys = max(m.sys, samples[2].Value.Uint64())
	}
	go func() {
		defer close(m.done)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			sample()
			select {
			case <-m.stopc:
				return
			case <-t.C:
			}
		}
	}()
	return m
}

func (m *feMemSampler) stop() (peakHeap, peakSys uint64) {
	close(m.stopc)
	<-m.done
	return m.peakHeap, m.sys
}
