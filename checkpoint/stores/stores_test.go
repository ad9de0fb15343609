package stores_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/checkpoint/stores"
)

var t0 = time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC)

var ledger = checkpoint.Table{Name: "ledger", Key: "id", Value: "balance", Version: "version"}

// opening is the ledger table's accounts: acct:1 holds the money.
var opening = map[string]int64{"acct:1": 100, "acct:2": 0}

// open opens a store at loc, closed when t ends.
func open(t *testing.T, loc string, s stores.Settings) checkpoint.Backend {
	t.Helper()
	st, err := stores.Open(context.Background(), loc, s)
	if err != nil {
		t.Fatalf("open %s: %v", stores.Redact(loc), err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// sqliteLedger makes a SQLite file holding the ledger table.
func sqliteLedger(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.db")
	checkpointtest.CreateTable(t, path, ledger, opening)
	return path
}

// pgLedger makes a PostgreSQL database holding the ledger table.
func pgLedger(t *testing.T) string {
	t.Helper()
	loc := pgtest.Database(t)
	checkpointtest.CreateTable(t, loc, ledger, opening)
	return loc
}

// transfer moves amount from acct:1 to acct:2 in one Update of et and
// marks effectID applied, as a separate-store effect does.
func transfer(ctx context.Context, et checkpoint.EffectTarget, amount int64, effectID string) error {
	return et.Update(ctx, func(v checkpoint.Target) error {
		cur, err := v.Read(ctx, []string{"acct:1", "acct:2"})
		if err != nil {
			return err
		}
		a, b := cur["acct:1"], cur["acct:2"]
		if err := v.Write(ctx, []checkpoint.Write{
			{Key: "acct:1", OldVersion: a.Version, OldValue: a.Value, NewValue: a.Value - amount},
			{Key: "acct:2", OldVersion: b.Version, OldValue: b.Value, NewValue: b.Value + amount},
		}); err != nil {
			return err
		}
		return v.MarkApplied(ctx, checkpoint.Applied{EffectID: effectID, RunID: "x/1", StepID: "pay", At: t0})
	})
}

// readDB is the database/sql handle job code reads its tables through
// (steps.Run.TargetDB).
func readDB(t *testing.T, et checkpoint.EffectTarget) *sql.DB {
	t.Helper()
	rd, ok := et.(interface{ ReadDB() *sql.DB })
	if !ok {
		t.Fatalf("effect target %T has no ReadDB", et)
	}
	return rd.ReadDB()
}

// balance reads acct's balance through db, with a portable $1.
func balance(t *testing.T, db *sql.DB, acct string) int64 {
	t.Helper()
	var v int64
	if err := db.QueryRow(`SELECT balance FROM ledger WHERE id = $1`, acct).Scan(&v); err != nil {
		t.Fatalf("read %s: %v", acct, err)
	}
	return v
}

// roundTrip applies a transfer to et (the ledger table at loc), checks it
// through ReadDB and IsApplied, then a stale plan's conflict, then the
// ledger.
func roundTrip(t *testing.T, et checkpoint.EffectTarget, loc string) {
	t.Helper()
	ctx := context.Background()
	if et.Same() {
		t.Fatal("a target in another backend's database is the same store")
	}
	if err := transfer(ctx, et, 40, "x/1/pay@1.0"); err != nil {
		t.Fatalf("transfer: %v", err)
	}
	db := readDB(t, et)
	if a, b := balance(t, db, "acct:1"), balance(t, db, "acct:2"); a != 60 || b != 40 {
		t.Errorf("balances after the transfer = %d, %d; want 60, 40", a, b)
	}
	var ok bool
	if err := et.View(ctx, func(v checkpoint.Target) error {
		var err error
		ok, err = v.IsApplied(ctx, "x/1/pay@1.0")
		return err
	}); err != nil || !ok {
		t.Errorf("IsApplied after MarkApplied = %v, %v; want true", ok, err)
	}
	err := et.Update(ctx, func(v checkpoint.Target) error {
		return v.Write(ctx, []checkpoint.Write{{Key: "acct:1", OldVersion: 0, OldValue: 100, NewValue: 0}})
	})
	var vc *checkpoint.VersionConflictError
	if !errors.As(err, &vc) || vc.Found != 1 {
		t.Errorf("a stale plan = %v; want a VersionConflictError finding version 1", err)
	}
	// The transfer applied once, the stale plan not at all.
	checkpointtest.CheckLedger(t, loc, ledger, checkpointtest.LedgerCheck{Opening: opening,
		Applied: []checkpointtest.Transfer{{ID: "x/1/pay@1.0", From: "acct:1", To: "acct:2", Amount: 40}}})
}

func TestPostgresStoreWithSQLiteFileTarget(t *testing.T) {
	st := open(t, pgtest.Schema(t), stores.Settings{CallerClock: true, Synchronous: sqlite.SyncNormal, BusyTimeout: 1234 * time.Millisecond})
	path := sqliteLedger(t)
	et, err := st.OpenTarget(context.Background(), checkpoint.TargetSpec{Location: path, Table: ledger})
	if err != nil {
		t.Fatalf("open a SQLite file target from a PostgreSQL store: %v", err)
	}
	defer et.Close()
	roundTrip(t, et, path)
	// The file is opened with the settings' SQLite durability and lock wait.
	var busy, sync int
	db := readDB(t, et)
	if err := db.QueryRow(`PRAGMA busy_timeout`).Scan(&busy); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`PRAGMA synchronous`).Scan(&sync); err != nil {
		t.Fatal(err)
	}
	if busy != 1234 || sync != 1 {
		t.Errorf("the SQLite target runs with busy_timeout %d, synchronous %d; want 1234 and 1 (NORMAL)", busy, sync)
	}

	_, err = st.OpenTarget(context.Background(), checkpoint.TargetSpec{Location: filepath.Join(t.TempDir(), "nope.db"), Table: ledger})
	if !errors.Is(err, checkpoint.ErrNoDatabase) {
		t.Errorf("a missing SQLite target file: %v; want ErrNoDatabase", err)
	}
}

func TestSQLiteStoreWithPostgresDatabaseTarget(t *testing.T) {
	st := open(t, filepath.Join(t.TempDir(), "stepwise.db"), stores.Settings{Synchronous: sqlite.SyncNormal,
		StatementTimeout: 2500 * time.Millisecond, ApplicationName: "sqlite-store"})
	loc := pgLedger(t)
	et, err := st.OpenTarget(context.Background(), checkpoint.TargetSpec{Location: loc, Table: ledger})
	if err != nil {
		t.Fatalf("open a PostgreSQL database target from a SQLite store: %v", err)
	}
	defer et.Close()
	roundTrip(t, et, loc)
	sessionSettings(t, readDB(t, et), "2500ms", "sqlite-store")

	u, _ := url.Parse(loc)
	u.User = url.UserPassword("postgres", "s3cret-pw")
	u.Path = "/" + pgtest.Name(t)
	_, err = st.OpenTarget(context.Background(), checkpoint.TargetSpec{Location: u.String(), Table: ledger})
	if !errors.Is(err, checkpoint.ErrNoDatabase) || !errors.Is(err, postgres.ErrNoDatabase) {
		t.Errorf("a missing PostgreSQL target database: %v; want checkpoint.ErrNoDatabase and postgres.ErrNoDatabase", err)
	}
	if err != nil && (strings.Contains(err.Error(), "s3cret-pw") || !strings.Contains(err.Error(), strings.TrimPrefix(u.Path, "/"))) {
		t.Errorf("the error %q shows the password or does not name the database", err)
	}
}

// withParams returns loc with more query parameters.
func withParams(t *testing.T, loc string, kv ...string) string {
	t.Helper()
	u, err := url.Parse(loc)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	for i := 0; i < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func TestPostgresOwnDatabaseUnderAnotherSpellingIsTheSameStore(t *testing.T) {
	loc := pgtest.Schema(t)
	st := open(t, loc, stores.Settings{CallerClock: true})
	u, _ := url.Parse(loc)
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	other := *u
	other.Scheme = "postgresql"
	if u.Hostname() == "127.0.0.1" {
		other.Host = "localhost:" + port
	} else {
		other.Host = "127.0.0.1:" + port
	}
	for _, spelling := range []string{
		withParams(t, other.String(), "application_name", "another-name", "connect_timeout", "7"),
		withParams(t, loc, "sslmode", "disable"),
	} {
		et, err := st.OpenTarget(context.Background(), checkpoint.TargetSpec{Location: spelling, Table: checkpoint.StateTable})
		if err != nil {
			t.Fatalf("open the state table at %s: %v", spelling, err)
		}
		if !et.Same() {
			t.Errorf("%s names the store's own database and table; want the same store, got a separate one", spelling)
		}
		et.Close()
	}
}

func TestPostgresSameNamedTableInAnotherSchemaIsSeparate(t *testing.T) {
	loc := pgtest.Schema(t)
	st := open(t, loc, stores.Settings{CallerClock: true, StatementTimeout: 4321 * time.Millisecond, ApplicationName: "store-app"})
	// Another schema of the same database with its own stepwise_state.
	other := pgtest.Schema(t)
	pgtest.Exec(t, other, `CREATE TABLE stepwise_state (key text COLLATE "C" PRIMARY KEY, value bigint NOT NULL, version bigint NOT NULL)`)
	ctx := context.Background()
	et, err := st.OpenTarget(ctx, checkpoint.TargetSpec{Location: other, Table: checkpoint.StateTable})
	if err != nil {
		t.Fatal(err)
	}
	defer et.Close()
	if et.Same() {
		t.Fatal("a same-named table in another schema of the store's database is the same store; want separate (another relation)")
	}
	if err := et.Update(ctx, func(v checkpoint.Target) error {
		return v.Write(ctx, []checkpoint.Write{{Key: "k", NewValue: 9, Insert: true}})
	}); err != nil {
		t.Fatal(err)
	}
	var inOther, inStore int64
	if err := readDB(t, et).QueryRow(`SELECT count(*) FROM stepwise_state WHERE key = 'k'`).Scan(&inOther); err != nil {
		t.Fatal(err)
	}
	own, err := st.OpenTarget(ctx, checkpoint.TargetSpec{Table: checkpoint.StateTable})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if err := readDB(t, own).QueryRow(`SELECT count(*) FROM stepwise_state WHERE key = 'k'`).Scan(&inStore); err != nil {
		t.Fatal(err)
	}
	if inOther != 1 || inStore != 0 {
		t.Errorf("rows of key k: %d in the other schema, %d in the store's; want 1 and 0", inOther, inStore)
	}
	sessionSettings(t, readDB(t, et), "4321ms", "store-app")
}

// sessionSettings checks db's sessions run with the store's statement
// timeout and application name: a separate target is opened with the
// store's settings.
func sessionSettings(t *testing.T, db *sql.DB, timeout, app string) {
	t.Helper()
	var gotTimeout, gotApp string
	if err := db.QueryRow(`SELECT current_setting('statement_timeout'), current_setting('application_name')`).Scan(&gotTimeout, &gotApp); err != nil {
		t.Fatal(err)
	}
	if gotTimeout != timeout || gotApp != app {
		t.Errorf("the target's sessions run with statement_timeout %s, application_name %s; want the store's %s, %s", gotTimeout, gotApp, timeout, app)
	}
}

func TestOpenPicksTheBackendByLocation(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "stepwise.db")
	if _, ok := open(t, path, stores.Settings{}).(*sqlite.Store); !ok {
		t.Errorf("a file path did not open a SQLite store")
	}
	if _, ok := open(t, pgtest.Schema(t), stores.Settings{}).(*postgres.Store); !ok {
		t.Errorf("a postgres:// URL did not open a PostgreSQL store")
	}
	missing := filepath.Join(t.TempDir(), "missing.db")
	if _, err := stores.Open(ctx, missing, stores.Settings{MustExist: true}); !errors.Is(err, checkpoint.ErrNoDatabase) {
		t.Errorf("MustExist on a missing file: %v; want ErrNoDatabase", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("MustExist created %s", missing)
	}
	_, err := stores.Open(ctx, "mysql://root:hunter2@db/x", stores.Settings{})
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("a URL of no backend: %v; want an error without the password", err)
	}
}

func TestIsURLAndRedact(t *testing.T) {
	for loc, want := range map[string]bool{
		"postgres://u@h/db": true, "PostgreSQL://u@h/db": true, "/var/lib/stepwise.db": false,
		"stepwise.db": false, "file:x.db": false, "mysql://h/db": false,
	} {
		if got := stores.IsURL(loc); got != want {
			t.Errorf("IsURL(%q) = %v; want %v", loc, got, want)
		}
	}
	if got := stores.Redact("postgres://u:pw@h:5432/db?sslmode=disable"); strings.Contains(got, "pw@") || !strings.Contains(got, "u:xxxxx@h:5432/db") {
		t.Errorf("Redact of a URL = %q; want the password hidden, the rest kept", got)
	}
	if got := stores.Redact("/tmp/a b/stepwise.db"); got != "/tmp/a b/stepwise.db" {
		t.Errorf("Redact of a path = %q; want it unchanged", got)
	}
}

// A backend's failures of its database server match checkpoint's
// backend-neutral kinds, so cmd tells them apart without importing the
// backend: a server that refuses connections is checkpoint.ErrUnavailable,
// a URL that does not parse checkpoint.ErrBadLocation, and every
// PostgreSQL kind matches its neutral one.
func TestOpenErrorsHaveNeutralKinds(t *testing.T) {
	ctx := context.Background()
	_, err := stores.Open(ctx, "postgres://postgres@127.0.0.1:1/none?connect_timeout=2", stores.Settings{})
	if !errors.Is(err, checkpoint.ErrUnavailable) || !errors.Is(err, postgres.ErrUnavailable) {
		t.Errorf("open on a closed port: %v; want checkpoint.ErrUnavailable and postgres.ErrUnavailable", err)
	}
	_, err = stores.Open(ctx, "postgres://postgres@127.0.0.1:5432/x?sslmode=sometimes", stores.Settings{})
	if !errors.Is(err, checkpoint.ErrBadLocation) || !errors.Is(err, postgres.ErrBadURL) {
		t.Errorf("open with a bad sslmode: %v; want checkpoint.ErrBadLocation and postgres.ErrBadURL", err)
	}
	for kind, neutral := range map[error]error{
		postgres.ErrUnavailable: checkpoint.ErrUnavailable, postgres.ErrAuth: checkpoint.ErrAuth,
		postgres.ErrNoDatabase: checkpoint.ErrNoDatabase, postgres.ErrPermission: checkpoint.ErrPermission,
		postgres.ErrStatementTimeout: checkpoint.ErrStatementTimeout, postgres.ErrTooManyConnections: checkpoint.ErrTooManyConnections,
		postgres.ErrBadURL: checkpoint.ErrBadLocation,
	} {
		err := fmt.Errorf("step post: %w", &postgres.Error{Kind: kind, Where: "server db:5432, database x", Op: "connect", Detail: "no"})
		if !errors.Is(err, neutral) || !errors.Is(err, kind) {
			t.Errorf("%v: errors.Is(%v) = false; want it to match its kind and %v", err, kind, neutral)
		}
		if got := err.Error(); !strings.HasPrefix(got, "step post: "+kind.Error()+": ") {
			t.Errorf("message %q; want it to name the backend's kind first", got)
		}
	}
}
