package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/checkpoint/storetest"
)

// TestConformance runs the store conformance suite against SQLite, a fresh
// file per test. The suite checks the contract, not durability across power
// loss (the crash tests do that), so the files use synchronous=NORMAL: the
// fence race commits thousands of times.
func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		NewDatabase:       func(t *testing.T) string { return filepath.Join(t.TempDir(), "stepwise.db") },
		NewTargetDatabase: sqliteTargetDatabase,
		Open: func(ctx context.Context, db string) (checkpoint.Store, error) {
			return sqlite.Open(ctx, sqlite.Config{Path: db, Synchronous: sqlite.SyncNormal})
		},
		SchemaVersion:  sqlite.SchemaVersion(),
		SchemaVersions: sqliteSchemaVersions,
		// BEGIN IMMEDIATE takes the write lock when A's transaction
		// begins, so B is in its busy wait within a millisecond.
		BlockFor: 2 * time.Millisecond,
		MarkNewer: func(t *testing.T, db string, v int) {
			withSQLite(t, db, func(d *sql.DB) {
				if _, err := d.Exec(`INSERT INTO stepwise_schema (version, name) VALUES (?, 'from a newer binary')`, v); err != nil {
					t.Fatalf("mark %s as schema version %d: %v", db, v, err)
				}
			})
		},
	})
}

// sqliteSchemaVersions reads the versions recorded in the SQLite store's
// schema table.
func sqliteSchemaVersions(t *testing.T, db string) []int {
	var out []int
	withSQLite(t, db, func(d *sql.DB) {
		rows, err := d.Query(`SELECT version FROM stepwise_schema ORDER BY version`)
		if err != nil {
			t.Fatalf("read schema versions of %s: %v", db, err)
		}
		defer rows.Close()
		for rows.Next() {
			var v int
			if err := rows.Scan(&v); err != nil {
				t.Fatal(err)
			}
			out = append(out, v)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	})
	return out
}

// sqliteTargetDatabase is an empty SQLite file beside none of the
// test's stores, for the separate-store effect target tests.
func sqliteTargetDatabase(t *testing.T) storetest.TargetDatabase {
	dir := t.TempDir()
	loc := filepath.Join(dir, "ledger.db")
	if err := os.WriteFile(loc, nil, 0o644); err != nil { // an empty file is an empty database
		t.Fatal(err)
	}
	with := func(fn func(*sql.DB) error) error {
		d, err := sql.Open("sqlite", "file:"+loc+"?_pragma=busy_timeout(5000)")
		if err != nil {
			return err
		}
		defer d.Close()
		return fn(d)
	}
	return storetest.TargetDatabase{
		Location: loc,
		Missing:  filepath.Join(dir, "missing.db"),
		Exec: func(q string, args ...any) error {
			return with(func(d *sql.DB) error { _, err := d.Exec(q, args...); return err })
		},
		QueryInt: func(q string, args ...any) (int64, error) {
			var v int64
			err := with(func(d *sql.DB) error { return d.QueryRow(q, args...).Scan(&v) })
			return v, err
		},
		Tables: func() ([]string, error) {
			var names []string
			err := with(func(d *sql.DB) error {
				rows, err := d.Query(`SELECT name FROM sqlite_master WHERE type = 'table'`)
				if err != nil {
					return err
				}
				defer rows.Close()
				for rows.Next() {
					var n string
					if err := rows.Scan(&n); err != nil {
						return err
					}
					names = append(names, n)
				}
				return rows.Err()
			})
			return names, err
		},
	}
}

// withSQLite calls fn with a plain connection to the database file.
func withSQLite(t *testing.T, db string, fn func(*sql.DB)) {
	t.Helper()
	d, err := sql.Open("sqlite", "file:"+db+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	fn(d)
}

// naiveChildEnv makes TestNaiveStoreChild run: it is the helper process of
// TestFenceRaceCatchesANaiveStore.
const naiveChildEnv = "STEPWISE_STORETEST_NAIVE_CHILD"

// TestFenceRaceCatchesANaiveStore runs the fence race against a store that
// checks the fence when a transaction starts instead of holding it to the
// commit (what a PostgreSQL port that reads the fence without locking the
// run row does), in a child process, and checks the race fails it: a suite
// that passes every store proves nothing.
func TestFenceRaceCatchesANaiveStore(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestNaiveStoreChild$/^FenceRace$/^(Step|Items)$", "-test.count=1", "-test.v", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), naiveChildEnv+"=1", "GORACE=atexit_sleep_ms=0")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("the fence race passed a store that checks the fence only when a transaction starts (err %v):\n%s", err, out)
	}
	for _, want := range []string{"--- FAIL: TestNaiveStoreChild/FenceRace/Step", "--- FAIL: TestNaiveStoreChild/FenceRace/Items", "both:"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("child output lacks %q:\n%s", want, out)
		}
	}
}

// TestNaiveStoreChild is the helper process of
// TestFenceRaceCatchesANaiveStore.
func TestNaiveStoreChild(t *testing.T) {
	if os.Getenv(naiveChildEnv) != "1" {
		t.Skip("helper process for TestFenceRaceCatchesANaiveStore")
	}
	storetest.Run(t, storetest.Harness{
		NewDatabase:       func(t *testing.T) string { return filepath.Join(t.TempDir(), "stepwise.db") },
		NewTargetDatabase: sqliteTargetDatabase,
		Open: func(ctx context.Context, db string) (checkpoint.Store, error) {
			st, err := sqlite.Open(ctx, sqlite.Config{Path: db})
			return naiveStore{st}, err
		},
		SchemaVersion: sqlite.SchemaVersion(),
		// Long enough for B's claim, which nothing blocks, to finish
		// before A commits even under the race detector on a busy machine.
		BlockFor: 100 * time.Millisecond,
		Rounds:   50,
	})
}

// naiveStore checks the lease's fence when a transaction starts and holds
// nothing until it commits: its writes are kept aside and committed at the
// end under the run's fence of that moment.
type naiveStore struct{ *sqlite.Store }

func (s naiveStore) InTx(ctx context.Context, l checkpoint.Lease, fn func(checkpoint.Tx) error) error {
	if f, err := s.Fence(ctx, l.RunID); err != nil || f != l.Fence {
		return fmt.Errorf("%w: fence %d, %v", checkpoint.ErrFenced, f, err)
	}
	var rec laterTx
	if err := fn(&rec); err != nil {
		return err
	}
	f, err := s.Fence(ctx, l.RunID)
	if err != nil {
		return err
	}
	l.Fence = f // the bug: the check above was the only one
	return s.Store.InTx(ctx, l, func(tx checkpoint.Tx) error {
		for _, op := range rec {
			if err := op(tx); err != nil {
				return err
			}
		}
		return nil
	})
}

// laterTx records a transaction's writes to make them later.
type laterTx []func(checkpoint.Tx) error

func (r *laterTx) add(op func(checkpoint.Tx) error) error { *r = append(*r, op); return nil }

func (r *laterTx) PutStep(s checkpoint.Step) error {
	return r.add(func(tx checkpoint.Tx) error { return tx.PutStep(s) })
}
func (r *laterTx) ResetStep(id string) error {
	return r.add(func(tx checkpoint.Tx) error { return tx.ResetStep(id) })
}
func (r *laterTx) PutItems(items []checkpoint.Item) error {
	return r.add(func(tx checkpoint.Tx) error { return tx.PutItems(items) })
}
func (r *laterTx) PutNewItems(items []checkpoint.Item) error {
	return r.add(func(tx checkpoint.Tx) error { return tx.PutNewItems(items) })
}
func (r *laterTx) AcceptItemChanges(a checkpoint.Audit, items []checkpoint.Item, changes []checkpoint.ItemChange) error {
	return r.add(func(tx checkpoint.Tx) error { return tx.AcceptItemChanges(a, items, changes) })
}
func (r *laterTx) RefuseItemChanges(step string, at time.Time, changes []checkpoint.ItemChange) error {
	return r.add(func(tx checkpoint.Tx) error { return tx.RefuseItemChanges(step, at, changes) })
}
func (r *laterTx) PutChunkPlan(p checkpoint.ChunkPlan) error {
	return r.add(func(tx checkpoint.Tx) error { return tx.PutChunkPlan(p) })
}
func (r *laterTx) FinishChunk(step, effectID string) error {
	return r.add(func(tx checkpoint.Tx) error { return tx.FinishChunk(step, effectID) })
}
func (r *laterTx) Enqueue(m checkpoint.Message) error {
	return r.add(func(tx checkpoint.Tx) error { return tx.Enqueue(m) })
}
func (r *laterTx) Target(t checkpoint.Table) (checkpoint.Target, error) {
	return nil, fmt.Errorf("naiveStore: no effect targets in a deferred transaction (%s)", t.Name)
}
