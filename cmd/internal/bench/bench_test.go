package bench_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/cmd/internal/bench"
	"github.com/stepwise-run/stepwise/runner"
)

// tiny is a configuration that runs every workload in a second or two.
func tiny(db, dir string) bench.Config {
	return bench.Config{DB: db, Dir: dir, Items: 2500, Steps: 20, Accounts: 20, Claims: 40, Drain: 40, Slots: []int{2, 4}}
}

// checkReport asserts the report holds every workload with positive
// figures, ratio = ours/raw and the backend's goals: each side did its
// work (Run itself fails when a side's rows, sums or ledger are wrong).
func checkReport(t *testing.T, rep bench.Report, store string, goals []string) {
	t.Helper()
	if rep.Store != store || rep.Items != 2500 || rep.Steps != 20 || rep.Accounts != 20 || rep.Chunk != 1000 || rep.Synchronous == "" {
		t.Errorf("report header %+v", rep)
	}
	names := []string{
		"per-step durable commit (steps.Do, no-op)",
		"per-step durable commit, one same-store effect (steps.Apply)",
		"chunked transfer posting (settle job, chunk 1000, same store)",
		"rerun of the finished run (forced; every step replays)",
		"rerun, every item done but the post step unmarked",
		"queue claims, 1 claimers (ClaimNext + Finish)",
		"queue claims, 4 claimers (ClaimNext + Finish)",
		"queue claims, 16 claimers (ClaimNext + Finish)",
		"queue drain, 2 slots (runner.Worker)",
		"queue drain, 4 slots (runner.Worker)",
	}
	if len(rep.Results) != len(names) {
		t.Fatalf("%d results, want %d: %+v", len(rep.Results), len(names), rep.Results)
	}
	for i, r := range rep.Results {
		if r.Name != names[i] {
			t.Errorf("result %d is %q, want %q", i, r.Name, names[i])
		}
		if r.Ours <= 0 || r.Raw <= 0 || math.Abs(r.Ratio-r.Ours/r.Raw) > 1e-9*r.Ratio {
			t.Errorf("result %q: ours %v, raw %v, ratio %v; want positive figures and ratio = ours/raw", r.Name, r.Ours, r.Raw, r.Ratio)
		}
		if r.Goal != goals[i] {
			t.Errorf("result %q: goal %q, want %q", r.Name, r.Goal, goals[i])
		}
	}
	if m := rep.Memory; m.Items != 2500 || m.PeakGoHeapMiB <= 0 || m.GoalItems != 1_000_000 {
		t.Errorf("memory %+v", m)
	}
	var out bytes.Buffer
	rep.Print(&out)
	for _, name := range names {
		if !strings.Contains(out.String(), name) {
			t.Errorf("the printed report has no row %q:\n%s", name, out.String())
		}
	}
}

func TestRunSQLite(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var log bytes.Buffer
	cfg := tiny("", dir)
	cfg.Log = &log
	rep, err := bench.Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	checkReport(t, rep, bench.StoreSQLite, []string{">= 0.9", ">= 0.95", ">= 0.6", "<= 1.5", "-", ">= 0.5", ">= 0.5", ">= 0.5", ">= 0.5", ">= 0.5"})
	if rep.Synchronous != "full" {
		t.Errorf("synchronous %q, want full", rep.Synchronous)
	}
	if left, err := os.ReadDir(dir); err != nil || len(left) != 0 {
		t.Errorf("bench left %d files in its directory (%v)", len(left), err)
	}
}

func TestRunPostgres(t *testing.T) {
	t.Parallel()
	db := pgtest.Database(t)
	rep, err := bench.Run(context.Background(), tiny(db, ""))
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, rep, bench.StorePostgres, []string{">= 0.9", ">= 0.8", ">= 0.6", "<= 1.5", "-", ">= 0.5", ">= 0.5", ">= 0.5", ">= 0.8", ">= 0.8"})
	if !strings.Contains(rep.Database, "database sw_") || strings.Contains(rep.Database, "postgres@") {
		t.Errorf("database %q: want the server and database, no user", rep.Database)
	}
	if n := benchSchemas(t, db); n != 0 {
		t.Errorf("bench left %d schemas behind", n)
	}
}

// TestRunPostgresInterrupted cancels a run part-way: it reports an
// interruption and still drops every schema it made.
func TestRunPostgresInterrupted(t *testing.T) {
	t.Parallel()
	db := pgtest.Database(t)
	ctx, cancel := context.WithCancel(context.Background())
	cfg := tiny(db, "")
	cfg.Steps = 1_000_000
	var log lineHook
	log.on = func(line string) {
		if strings.Contains(line, "per-step durable commits:") {
			cancel() // the first workload's sides are open now
		}
	}
	cfg.Log = &log
	_, err := bench.Run(ctx, cfg)
	if !errors.Is(err, runner.ErrInterrupted) {
		t.Fatalf("err = %v, want runner.ErrInterrupted", err)
	}
	if n := benchSchemas(t, db); n != 0 {
		t.Errorf("an interrupted bench left %d schemas behind", n)
	}
}

func TestRunBadConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []bench.Config{
		{Items: 0, Steps: 1, Accounts: 2},
		{Items: 1, Steps: 1, Accounts: 2, Workloads: []string{"nope"}},
		{Items: 1, Steps: 1, Accounts: 2, DB: "mysql://x"},
		{Items: 1, Steps: 1, Accounts: 2, Slots: []int{4, 0}},
	} {
		if _, err := bench.Run(context.Background(), cfg); !errors.Is(err, bench.ErrBadConfig) {
			t.Errorf("%+v: err = %v, want ErrBadConfig", cfg, err)
		}
	}
}

// lineHook calls on for each write (the bench writes one line a call).
type lineHook struct{ on func(string) }

func (l *lineHook) Write(p []byte) (int, error) { l.on(string(p)); return len(p), nil }

// benchSchemas counts the schemas a benchmark made in db.
func benchSchemas(t *testing.T, db string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'stepwise\_bench\_%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
