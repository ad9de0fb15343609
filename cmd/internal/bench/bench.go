// Package bench measures Stepwise against hand-written SQL on the same
// store, in the same run: `stepwise bench` and the `go test -bench`
// wrappers beside the code call it. The workloads (workloads.go) are
// written against the checkpoint.Store contract, steps and runner only;
// each backend has exactly one file of raw baselines (raw_sqlite.go,
// raw_postgres.go) holding what a careful engineer writes by hand on that
// database, with the store's own connection settings and table
// definitions. The absolute rates depend on the disk and the load; the
// ratios are what the goals are stated in.
package bench

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
)

// Store kinds, as Report.Store names them.
const (
	StoreSQLite   = "sqlite"
	StorePostgres = "postgres"
)

// Workloads, as Config.Workloads names them.
const (
	// WorkloadSteps is one no-op steps.Do per durable commit, against one
	// raw single-row insert of the same checkpoint row per transaction.
	WorkloadSteps = "steps"
	// WorkloadEffects is one steps.Apply with one same-store effect per
	// step, against a raw read + version-CAS + checkpoint insert in one
	// transaction.
	WorkloadEffects = "effects"
	// WorkloadChunked is the settle job (ForEach, chunk 1000, same store)
	// against a raw chunked settlement, then reruns of the finished run
	// against a raw load of its item keys.
	WorkloadChunked = "chunked"
	// WorkloadClaims is ClaimNext + Finish of trivial queued runs with 1,
	// 4 and 16 claimers, against a raw FOR UPDATE SKIP LOCKED claim and
	// finish of a minimal queue table.
	WorkloadClaims = "claims"
	// WorkloadDrain is a fresh queue of trivial runs, never analysed,
	// drained by a runner.Worker with 4, 16 and 64 slots, against as many
	// goroutines draining a raw queue table with a SKIP LOCKED claim and a
	// completing UPDATE per job.
	WorkloadDrain = "drain"
)

// AllWorkloads are every workload, in the order they run and report.
var AllWorkloads = []string{WorkloadSteps, WorkloadEffects, WorkloadChunked, WorkloadClaims, WorkloadDrain}

// Config says what Run measures, where.
type Config struct {
	// DB is a postgres:// URL naming an existing database: the benchmark
	// makes fresh schemas in it (one per side per workload) and drops
	// them at the end. Empty measures SQLite, in files in Dir.
	DB string
	// Dir is where the SQLite databases go (a new temporary directory in
	// it, removed at the end); empty is the system's temporary directory.
	Dir string
	// Synchronous is SQLite's durability (sqlite.SyncFull, the default,
	// or sqlite.SyncNormal). PostgreSQL's is the server's.
	Synchronous string
	// Items is the number of transfers the chunked workload settles.
	Items int
	// Steps is the number of steps in each per-step workload.
	Steps int
	// Claims is the number of runs each claimer count of the claims
	// workload claims on each side; 0 means 5000.
	Claims int
	// Drain is the number of queued runs the drain workload drains per
	// slot count on each side; 0 means 5000.
	Drain int
	// Slots are the worker slot counts the drain workload measures; empty
	// means DrainSlots.
	Slots []int
	// Accounts is the number of accounts in the benchmark ledger.
	Accounts int
	// Workloads selects workloads by name (WorkloadSteps, ...); empty
	// means AllWorkloads.
	Workloads []string
	// Log receives progress lines ("bench: ..."); nil discards them.
	Log io.Writer
}

// ErrBadConfig is wrapped by Run's errors about its Config.
var ErrBadConfig = errors.New("bench: bad configuration")

// Goals, as the anchors state them, per backend.
type goals struct {
	perStep, effect, chunked, rerun, claims, drain float64
}

var (
	sqliteGoals   = goals{perStep: 0.9, effect: 0.95, chunked: 0.6, rerun: 1.5, claims: 0.5, drain: 0.5}
	postgresGoals = goals{perStep: 0.9, effect: 0.8, chunked: 0.6, rerun: 1.5, claims: 0.5, drain: 0.8}
)

// The memory goal: peak Go heap of a settlement of GoalMemoryAt items.
const (
	goalMemoryMiB = 100
	goalMemoryAt  = 1_000_000
)

// Shape of the benchmark ledger and run.
const (
	// Chunk is the chunk size of the chunked workload, on both sides.
	Chunk     = 1000
	benchDate = "2026-11-28"
	effKeys   = 100 // keys the per-step effect workload cycles over
)

// Result is one workload: our figure, the raw baseline's, their ratio and
// the goal.
type Result struct {
	Name  string  `json:"name"`
	Unit  string  `json:"unit"` // "steps/s", "items/s" or "s"
	Ours  float64 `json:"ours"`
	Raw   float64 `json:"raw"`
	Ratio float64 `json:"ratio"` // ours/raw
	Goal  string  `json:"goal"`  // e.g. ">= 0.9"; "-" when the workload has none
	Met   bool    `json:"met"`   // true too when there is no goal
	Note  string  `json:"note,omitempty"`
}

// Memory is the peak memory of the chunked posting workload.
type Memory struct {
	Items int `json:"items"`
	// PeakGoHeapMiB is the peak of the Go heap in use (objects plus
	// unused heap spans), sampled every 10 ms.
	PeakGoHeapMiB float64 `json:"peak_go_heap_mib"`
	// PeakGoTotalMiB is the peak of all memory the Go runtime holds.
	PeakGoTotalMiB float64 `json:"peak_go_total_mib"`
	// RSSPeakMiB is the process's peak resident set (VmHWM), which also
	// holds SQLite's page caches; reset before the workload when the
	// kernel allows it (RSSNote says).
	RSSPeakMiB float64 `json:"rss_peak_mib"`
	RSSNote    string  `json:"rss_note"`
	GoalMiB    float64 `json:"goal_mib"`
	GoalItems  int     `json:"goal_items"`
	Met        bool    `json:"met"`
}

// Report is everything Run measured.
type Report struct {
	// Store is StoreSQLite or StorePostgres.
	Store string `json:"store"`
	// Database names the PostgreSQL server and database (no password);
	// empty on SQLite.
	Database string `json:"database,omitempty"`
	Items    int    `json:"items"`
	Steps    int    `json:"steps"`
	Accounts int    `json:"accounts"`
	Chunk    int    `json:"chunk"`
	// Synchronous is SQLite's synchronous pragma, or PostgreSQL's
	// synchronous_commit setting.
	Synchronous string   `json:"synchronous"`
	Results     []Result `json:"results"`
	// Memory is set when the chunked workload ran.
	Memory  Memory  `json:"memory"`
	Seconds float64 `json:"seconds"`
}

// Result returns the result whose name starts with prefix, if any.
func (r Report) Result(prefix string) (Result, bool) {
	for _, res := range r.Results {
		if strings.HasPrefix(res.Name, prefix) {
			return res, true
		}
	}
	return Result{}, false
}

// Run measures the workloads cfg selects on the store cfg names, each
// against its raw baseline, and removes what it created (files, schemas)
// before it returns, whatever happened. An interruption (ctx cancelled)
// returns an error wrapping runner.ErrInterrupted.
func Run(ctx context.Context, cfg Config) (rep Report, err error) {
	if cfg.Items < 1 || cfg.Steps < 1 || cfg.Accounts < 2 || cfg.Claims < 0 || cfg.Drain < 0 || slices.ContainsFunc(cfg.Slots, func(s int) bool { return s < 1 }) {
		return rep, fmt.Errorf("%w: items (%d) and steps (%d) must be at least 1, accounts (%d) at least 2, claims (%d), drain (%d) and slots (%v) not negative",
			ErrBadConfig, cfg.Items, cfg.Steps, cfg.Accounts, cfg.Claims, cfg.Drain, cfg.Slots)
	}
	ws := cfg.Workloads
	if len(ws) == 0 {
		ws = AllWorkloads
	}
	for _, w := range ws {
		if !isWorkload(w) {
			return rep, fmt.Errorf("%w: no workload %q (there are %s)", ErrBadConfig, w, strings.Join(AllWorkloads, ", "))
		}
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	var be backend
	if cfg.DB != "" {
		be, err = newPostgres(ctx, cfg)
	} else {
		be, err = newSQLite(cfg)
	}
	if err != nil {
		return rep, err
	}
	b := &bench{ctx: ctx, cfg: cfg, be: be, log: cfg.Log, goals: be.goals()}
	defer func() {
		// Drop what the benchmark made even when it was interrupted.
		cerr := be.close(context.WithoutCancel(ctx))
		if err == nil && cerr != nil {
			err = fmt.Errorf("bench: clean up: %w", cerr)
		}
	}()
	b.rep = Report{Store: be.kind(), Database: be.where(), Items: cfg.Items, Steps: cfg.Steps, Accounts: cfg.Accounts,
		Chunk: Chunk, Synchronous: be.synchronous(ctx)}
	start := time.Now()
	b.say("stepwise bench in %s: %d steps per per-step workload, %d transfers over %d accounts, %s",
		be.where(), cfg.Steps, cfg.Items, cfg.Accounts, be.durability(b.rep.Synchronous))
	for _, w := range ws {
		var err error
		switch w {
		case WorkloadSteps:
			err = b.perStep(cfg.Steps)
		case WorkloadEffects:
			err = b.perStepEffect(cfg.Steps)
		case WorkloadChunked:
			err = b.chunked(cfg.Items)
		case WorkloadClaims:
			err = b.claims(cmp.Or(cfg.Claims, 5000))
		case WorkloadDrain:
			err = b.drain(cmp.Or(cfg.Drain, 5000))
		}
		if err != nil {
			if ctx.Err() != nil {
				return b.rep, fmt.Errorf("%w: bench stopped", runner.ErrInterrupted)
			}
			return b.rep, fmt.Errorf("bench: %s: %w", w, err)
		}
	}
	b.rep.Seconds = time.Since(start).Seconds()
	return b.rep, nil
}

func isWorkload(w string) bool {
	for _, x := range AllWorkloads {
		if w == x {
			return true
		}
	}
	return false
}

// backend is one store kind: fresh stores for the workloads' own side and
// the raw baselines of the other, in the backend's raw_*.go file.
type backend interface {
	kind() string
	// where names the place the benchmark works in (a directory, or a
	// server and database).
	where() string
	// synchronous is the store's durability setting, and durability its
	// words for the progress line.
	synchronous(ctx context.Context) string
	durability(sync string) string
	goals() goals
	// store opens a fresh checkpoint store for one workload's own side.
	store(ctx context.Context, name string) (*store, error)
	// rawSteps, rawEffects and rawSettle open one workload's raw side:
	// a fresh database (or schema) with the tables made as ours's are.
	rawSteps(ctx context.Context, name string, ours *store) (rawSteps, error)
	rawEffects(ctx context.Context, name string, ours *store, keys []string) (rawEffects, error)
	// settleSides makes two identical ledgers seeded with cfg: one in a
	// fresh store (ours), one for the raw settlement.
	settleSides(ctx context.Context, name string, seed seedFunc) (*store, rawSettler, error)
	// claimSides makes a fresh store whose pool has conns connections
	// (ours) and a raw queue table of n queued jobs on the same settings,
	// analysed when analyze is set.
	claimSides(ctx context.Context, name string, conns, n int, analyze bool) (*store, rawClaims, error)
	// release closes the connections of a workload's sides once it is
	// done with them, so the next ones find the server's slots free.
	release(ours *store, raw rawClaims)
	// chunkNote says what the raw chunked settlement does.
	chunkNote() string
	// close closes and removes everything the backend made.
	close(ctx context.Context) error
}

// store is one workload's checkpoint store.
type store struct {
	checkpoint.Backend
	// db writes and reads the store's database for the benchmark's own
	// set-up and checks (seeding keys, sums); never the backend's own tables.
	db *sql.DB
	// read is the store's read handle, as job code gets it.
	read *sql.DB
}

// seedFunc seeds a ledger on db (settlement.Seed with the benchmark's
// configuration).
type seedFunc func(ctx context.Context, db *sql.DB) error

// rawSteps is the per-step baseline: one checkpoint row per transaction.
type rawSteps interface {
	insert(ctx context.Context, runID, id string, output []byte) error
	count(ctx context.Context, runID string) (int, error)
}

// rawEffects is the per-step effect baseline: read a key of the state
// table, compare-and-set it, insert the checkpoint row, in one
// transaction.
type rawEffects interface {
	step(ctx context.Context, runID, id, key string, output []byte) error
	stateSum(ctx context.Context) (int64, error)
}

// rawSettler is the chunked settlement baseline and the rerun's key load.
type rawSettler interface {
	// chunk settles the next Chunk transfers in one transaction; done
	// once a chunk came short.
	chunk(ctx context.Context) (done bool, err error)
	// loadKeys reads the run's item keys and statuses into a map with one
	// SELECT (a map made for n) and returns how many it read.
	loadKeys(ctx context.Context, runID string, n int) (int, error)
	// rejected counts the items the raw settlement rejected.
	rejected(ctx context.Context) (int, error)
	// balances returns every account's balance as one string.
	balances(ctx context.Context) (string, error)
}

// bench holds one Run's state.
type bench struct {
	ctx   context.Context
	cfg   Config
	be    backend
	log   io.Writer
	goals goals
	rep   Report
}

func (b *bench) say(format string, args ...any) {
	fmt.Fprintf(b.log, "bench: "+format+"\n", args...)
}

// interleave runs ours and raw over n operations in ten alternating
// blocks, so drift in the machine's load hits both sides alike, and
// returns each side's total time.
func interleave(n int, ours, raw func(from, to int) error) (time.Duration, time.Duration, error) {
	var tOurs, tRaw time.Duration
	block := max(1, n/10)
	for from := 0; from < n; from += block {
		to := min(from+block, n)
		start := time.Now()
		if err := ours(from, to); err != nil {
			return 0, 0, err
		}
		tOurs += time.Since(start)
		start = time.Now()
		if err := raw(from, to); err != nil {
			return 0, 0, err
		}
		tRaw += time.Since(start)
	}
	return tOurs, tRaw, nil
}

// rate records a throughput result: n operations on each side.
func (b *bench) rate(name, unit string, n int, ours, raw time.Duration, goal float64, note string) {
	r := Result{Name: name, Unit: unit, Ours: float64(n) / ours.Seconds(), Raw: float64(n) / raw.Seconds(),
		Goal: ">= " + formatGoal(goal), Note: note}
	r.Ratio = r.Ours / r.Raw
	r.Met = r.Ratio >= goal
	b.rep.Results = append(b.rep.Results, r)
}

// duration records a time result; the ratio is ours over raw.
// A goal of 0 means the workload has none: it is reported, not judged.
func (b *bench) duration(name string, ours, raw time.Duration, goal float64, note string) {
	r := Result{Name: name, Unit: "s", Ours: ours.Seconds(), Raw: raw.Seconds(), Goal: "<= " + formatGoal(goal), Note: note}
	r.Ratio = r.Ours / r.Raw
	r.Met = r.Ratio <= goal
	if goal == 0 {
		r.Goal, r.Met = "-", true
	}
	b.rep.Results = append(b.rep.Results, r)
}

// memSampler records the peak of the Go heap in use (objects plus unused
// heap spans) and of all memory the Go runtime holds, from runtime/metrics
// (which reads them without stopping the world), every 10 ms.
type memSampler struct {
	stopc, done      chan struct{}
	peakHeap, peakGo uint64
}

func startMemSampler() *memSampler {
	m := &memSampler{stopc: make(chan struct{}), done: make(chan struct{})}
	samples := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/total:bytes"},
	}
	go func() {
		defer close(m.done)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(samples)
			m.peakHeap = max(m.peakHeap, samples[0].Value.Uint64()+samples[1].Value.Uint64())
			m.peakGo = max(m.peakGo, samples[2].Value.Uint64())
			select {
			case <-m.stopc:
				return
			case <-t.C:
			}
		}
	}()
	return m
}

func (m *memSampler) stop() (peakHeap, peakGo uint64) {
	close(m.stopc)
	<-m.done
	return m.peakHeap, m.peakGo
}

// vmHWM returns the process's peak resident set size from
// /proc/self/status, or 0 where there is none.
func vmHWM() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// Print writes the report as a table: our figure, the raw baseline's, the
// ratio and the goal, one workload a line.
func (r Report) Print(w io.Writer) {
	raw, durability := "raw SQLite", "synchronous="+r.Synchronous
	if r.Store == StorePostgres {
		raw, durability = "raw pgx", "PostgreSQL "+r.Database+", synchronous_commit="+r.Synchronous
	}
	fmt.Fprintf(w, "stepwise bench: %d steps per per-step workload; %d transfers over %d accounts, chunk %d; %s; %.1f s\n\n",
		r.Steps, r.Items, r.Accounts, r.Chunk, durability, r.Seconds)
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintf(tw, "workload\tours\t%s\tratio\tgoal\tverdict\n", raw)
	for _, res := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", res.Name, formatFigure(res.Ours, res.Unit), formatFigure(res.Raw, res.Unit),
			formatRatio(res.Ratio), res.Goal, verdict(res))
	}
	tw.Flush()
	if m := r.Memory; m.Items > 0 {
		fmt.Fprintf(w, "\npeak memory of the chunked posting (%d transfers): Go heap %.1f MiB, Go runtime total %.1f MiB, RSS %.1f MiB (%s); goal <= %.0f MiB at %d transfers: %s\n",
			m.Items, m.PeakGoHeapMiB, m.PeakGoTotalMiB, m.RSSPeakMiB, m.RSSNote, m.GoalMiB, m.GoalItems, metWord(m.Met))
	}
	fmt.Fprintln(w, "\nratios are ours/raw: rates for throughput (higher is better), times for reruns (lower is better).")
	for _, res := range r.Results {
		fmt.Fprintf(w, "  %s: %s\n", res.Name, res.Note)
	}
}

// verdict is a result's word: met, MISSED, or "-" when it has no goal.
func verdict(r Result) string {
	if r.Goal == "-" {
		return "-"
	}
	return metWord(r.Met)
}

func metWord(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// formatRatio renders a ratio with three decimals, or three significant
// digits when it is that small: with two, 0.797 printed as "0.80 >= 0.8
// MISSED".
func formatRatio(r float64) string {
	if r < 0.1 {
		return strconv.FormatFloat(r, 'g', 3, 64)
	}
	return strconv.FormatFloat(r, 'f', 3, 64)
}

// formatGoal renders a goal with one decimal, or two where it has them
// (0.95).
func formatGoal(g float64) string {
	if s := strconv.FormatFloat(g, 'f', 1, 64); s+"0" == strconv.FormatFloat(g, 'f', 2, 64) {
		return s
	}
	return strconv.FormatFloat(g, 'f', 2, 64)
}

// formatFigure renders a rate with a k/M suffix, or a time in seconds.
func formatFigure(v float64, unit string) string {
	if unit == "s" {
		return strconv.FormatFloat(v, 'g', 4, 64) + " s"
	}
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM %s", v/1e6, unit)
	case v >= 1e3:
		return fmt.Sprintf("%.2fk %s", v/1e3, unit)
	}
	return fmt.Sprintf("%.0f %s", v, unit)
}
