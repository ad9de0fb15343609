// Package checkpointtest opens real checkpoint stores for tests, on the
// store STEPWISE_TEST_STORE names: unset or "sqlite", a SQLite file in the
// test's temporary directory; "postgres", a fresh schema on the server
// STEPWISE_TEST_PG names (see checkpoint/postgres/pgtest). Every store is
// closed, and every schema dropped, when its test ends.
//
// A test that needs the database's location (to open a second handle on
// it, reopen it after a crash, pass it to a child process, or create an
// effect target table in it) takes one from NewLocation and opens it with
// OpenLocation; a location is a file path or a postgres:// URL, and
// OpenLocation tells them apart by their form, so a child process needs no
// STEPWISE_TEST_STORE of its own.
package checkpointtest

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for SQL on a PostgreSQL location

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/checkpoint/stores"
)

// EnvStore is the environment variable choosing the store the suites run
// on: "sqlite" (the default when unset) or "postgres".
const EnvStore = "STEPWISE_TEST_STORE"

// The stores EnvStore may name.
const (
	StoreSQLite   = "sqlite"
	StorePostgres = "postgres"
)

var announce sync.Once

// Store returns the store the suite runs on, StoreSQLite or StorePostgres,
// and fails t if STEPWISE_TEST_STORE names another, or names postgres
// without STEPWISE_TEST_PG. The first call in a test binary says on
// stderr which store the suite runs on.
func Store(t testing.TB) string {
	t.Helper()
	name := os.Getenv(EnvStore)
	switch name {
	case "", StoreSQLite:
		name = StoreSQLite
	case StorePostgres:
		if os.Getenv(pgtest.EnvURL) == "" {
			t.Fatalf("checkpointtest: %s=postgres needs %s, a postgres:// URL of the test server "+
				"(e.g. postgres://postgres@127.0.0.1:5432/test)", EnvStore, pgtest.EnvURL)
		}
	default:
		t.Fatalf("checkpointtest: %s=%q: the stores are %q (the default) and %q", EnvStore, name, StoreSQLite, StorePostgres)
	}
	announce.Do(func() {
		fmt.Fprintf(os.Stderr, "checkpointtest: the suite runs on the %s store (%s=%s)\n", name, EnvStore, name)
	})
	return name
}

// IsPostgres reports whether the suite runs on the PostgreSQL store.
func IsPostgres(t testing.TB) bool {
	t.Helper()
	return Store(t) == StorePostgres
}

// NewLocation returns the location of a fresh, empty database on the
// suite's store: a file path in t.TempDir() for SQLite, the URL of a new
// schema (dropped when t ends) for PostgreSQL.
func NewLocation(t testing.TB) string {
	t.Helper()
	if Store(t) == StorePostgres {
		return pgtest.Schema(t)
	}
	return filepath.Join(t.TempDir(), "stepwise.db")
}

// IsURL reports whether loc is a PostgreSQL location (a postgres:// or
// postgresql:// URL) rather than a SQLite file path.
func IsURL(loc string) bool { return checkpoint.IsPostgresURL(loc) }

// Open returns a store on a fresh database of the suite's store, closed at
// cleanup.
func Open(t testing.TB) checkpoint.Backend {
	t.Helper()
	return OpenLocation(t, NewLocation(t))
}

// OpenNew returns a store on a fresh database of the suite's store and
// that database's location, for a test that opens it again or puts tables
// beside the store's.
func OpenNew(t testing.TB) (checkpoint.Backend, string) {
	t.Helper()
	loc := NewLocation(t)
	return OpenLocation(t, loc), loc
}

// OpenLocation opens the store at loc (a file path or a postgres:// URL,
// as NewLocation gives), closed at cleanup. Opening it twice gives two
// handles on one database. A PostgreSQL store computes leases from the
// caller's clock (Config.CallerClock), as the tests drive fake clocks.
func OpenLocation(t testing.TB, loc string) checkpoint.Backend {
	t.Helper()
	st, err := OpenLocationErr(loc)
	if err != nil {
		t.Fatalf("open checkpoint store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// OpenLocationErr opens the store at loc as OpenLocation does, without a
// test: for a child process's role, which reports errors its own way. The
// caller closes the store.
func OpenLocationErr(loc string) (checkpoint.Backend, error) {
	// Through stores, as the command line opens them: either backend's
	// store can then open effect targets of the other kind.
	return stores.Open(context.Background(), loc, stores.Settings{CallerClock: true})
}

// OpenSQLite returns a fresh SQLite store in t.TempDir(), whatever store
// the suite runs on: for tests about SQLite files themselves.
func OpenSQLite(t testing.TB) *sqlite.Store {
	t.Helper()
	return OpenPath(t, filepath.Join(t.TempDir(), "stepwise.db"))
}

// OpenPath opens the SQLite store at path, closed at cleanup.
func OpenPath(t testing.TB, path string) *sqlite.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), sqlite.Config{Path: path})
	if err != nil {
		t.Fatalf("open checkpoint store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// SeparateLocations returns the locations of a fresh store database and
// of a fresh, separate effect target database beside it (already there,
// empty: a separate target must exist), for tests of separate-store
// effects. On SQLite both are files; on PostgreSQL both are schemas of
// the test database: a table in another schema is another relation, so
// the store opens it as a separate target (its own connections, its own
// transactions: the three-commit protocol), as it would another database,
// without the seconds a CREATE DATABASE costs.
func SeparateLocations(t testing.TB) (storeLoc, targetLoc string) {
	t.Helper()
	if Store(t) == "postgres" {
		return pgtest.Schema(t), pgtest.Schema(t)
	}
	dir := t.TempDir()
	storeLoc, targetLoc = filepath.Join(dir, "stepwise.db"), filepath.Join(dir, "ledger.db")
	db, err := sqlite.OpenTarget(context.Background(), sqlite.Config{Path: targetLoc})
	if err != nil {
		t.Fatalf("checkpointtest: create the separate target %s: %v", targetLoc, err)
	}
	db.Close()
	return storeLoc, targetLoc
}

// SeparateTarget opens a store for a test of separate-store effects and
// returns it with the location of its separate target database, as
// SeparateLocations gives them.
func SeparateTarget(t testing.TB) (checkpoint.Backend, string) {
	t.Helper()
	storeLoc, targetLoc := SeparateLocations(t)
	return OpenLocation(t, storeLoc), targetLoc
}

// SQL opens database/sql on the database at loc (modernc's "sqlite" for a
// file, pgx's "pgx" for a URL, whose search_path then names the test's
// schema), closed at cleanup: for a test to create and change its own
// effect target tables. Write placeholders as $1, $2, ...: both take them.
// It is never for reading a store's own tables, which are the backend's
// private business: read those through the checkpoint contract.
func SQL(t testing.TB, loc string) *sql.DB {
	t.Helper()
	db := openSQL(t, loc)
	t.Cleanup(func() { db.Close() })
	return db
}

// openSQL opens database/sql on loc; the caller closes it.
func openSQL(t testing.TB, loc string) *sql.DB {
	t.Helper()
	var db *sql.DB
	var err error
	if IsURL(loc) {
		db, err = sql.Open("pgx", loc)
	} else {
		var dsn string
		if dsn, err = sqlite.DSN(sqlite.Config{Path: loc}); err == nil {
			db, err = sql.Open("sqlite", dsn)
		}
	}
	if err == nil {
		if err = db.Ping(); err != nil {
			db.Close()
		}
	}
	if err != nil {
		t.Fatalf("checkpointtest: open SQL on %s: %v", redact(loc), err)
	}
	return db
}

// CreateTable creates table (its key TEXT, its value and version 64-bit
// integers) in the database at loc, with the given values at version 0.
func CreateTable(t testing.TB, loc string, table checkpoint.Table, values map[string]int64) {
	t.Helper()
	if err := table.Validate(); err != nil {
		t.Fatalf("checkpointtest: %v", err)
	}
	db := openSQL(t, loc)
	defer db.Close()
	ddl := fmt.Sprintf(`CREATE TABLE %s (%s TEXT PRIMARY KEY, %s BIGINT NOT NULL, %s BIGINT NOT NULL)`,
		table.Name, table.Key, table.Value, table.Version)
	if _, err := db.Exec(ddl); err != nil {
		t.Fatalf("checkpointtest: %s: %v", ddl, err)
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	ins := fmt.Sprintf(`INSERT INTO %s (%s, %s, %s) VALUES ($1, $2, 0)`, table.Name, table.Key, table.Value, table.Version)
	for _, k := range keys {
		if _, err := db.Exec(ins, k, values[k]); err != nil {
			t.Fatalf("checkpointtest: insert %s into %s: %v", k, table.Name, err)
		}
	}
}

// Balances returns every row of table in the database at loc, by key.
func Balances(t testing.TB, loc string, table checkpoint.Table) map[string]checkpoint.State {
	t.Helper()
	if err := table.Validate(); err != nil {
		t.Fatalf("checkpointtest: %v", err)
	}
	db := openSQL(t, loc)
	defer db.Close()
	rows, err := db.Query(fmt.Sprintf(`SELECT %s, %s, %s FROM %s`, table.Key, table.Value, table.Version, table.Name))
	if err != nil {
		t.Fatalf("checkpointtest: read %s: %v", table.Name, err)
	}
	defer rows.Close()
	out := map[string]checkpoint.State{}
	for rows.Next() {
		var k string
		var s checkpoint.State
		if err := rows.Scan(&k, &s.Value, &s.Version); err != nil {
			t.Fatalf("checkpointtest: read %s: %v", table.Name, err)
		}
		s.Exists = true
		out[k] = s
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("checkpointtest: read %s: %v", table.Name, err)
	}
	return out
}

// Balance returns one key's row of table in the database at loc, failing
// t if it is missing.
func Balance(t testing.TB, loc string, table checkpoint.Table, key string) checkpoint.State {
	t.Helper()
	s, ok := Balances(t, loc, table)[key]
	if !ok {
		t.Fatalf("checkpointtest: no key %q in %s", key, table.Name)
	}
	return s
}

func redact(loc string) string {
	if u, err := url.Parse(loc); err == nil && IsURL(loc) {
		return u.Redacted()
	}
	return loc
}
