package cmd

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5"

	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

// TestDBPostgresServerErrors: --db naming a PostgreSQL server that is
// down, a role it refuses, a database it lacks, a role without the
// privilege to create Stepwise's tables, or a role over its connection
// limit exits 2 with an error naming the server and the database and what
// is wrong, never the password, and creates no file.
func TestDBPostgresServerErrors(t *testing.T) {
	base := pgtest.URL(t)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Chdir(dir)
	role := pgtest.Name(t)
	db := pgtest.Database(t)
	dbName := strings.TrimPrefix(mustParse(t, db).Path, "/")
	pgtest.Exec(t, db, "CREATE ROLE "+role+" LOGIN")
	pgtest.Exec(t, db, "CREATE ROLE "+role+"_full LOGIN CONNECTION LIMIT 0")
	pgtest.Exec(t, db, "CREATE ROLE "+role+"_one LOGIN CONNECTION LIMIT 1")
	pgtest.Exec(t, db, "GRANT CREATE ON SCHEMA public TO "+role+"_one")
	t.Cleanup(func() {
		pgtest.Exec(t, base, "DROP OWNED BY "+role+" CASCADE")
		pgtest.Exec(t, base, "DROP ROLE IF EXISTS "+role)
		pgtest.Exec(t, base, "DROP ROLE IF EXISTS "+role+"_full")
		pgtest.Exec(t, db, "DROP OWNED BY "+role+"_one CASCADE")
		pgtest.Exec(t, base, "DROP ROLE IF EXISTS "+role+"_one")
	})
	as := func(user, database string) string {
		v := *u
		v.User = url.UserPassword(user, "s3cret")
		v.Path = "/" + database
		return v.String()
	}
	for _, tc := range []struct {
		what, db string
		want     []string
	}{
		{"server down", "postgres://ops:s3cret@127.0.0.1:1/stepwise?connect_timeout=3", []string{"server unavailable", "127.0.0.1:1", "stepwise"}},
		{"unknown role", as(role+"_nobody", dbName), []string{"authentication failed", dbName}},
		{"missing database", as("postgres", dbName+"_missing"), []string{"database does not exist", dbName + "_missing"}},
		{"no privilege", as(role, dbName), []string{"permission denied", dbName}},
		{"connection limit", as(role+"_full", dbName), []string{"too many connections", dbName}},
		// One connection opens the store, but a run needs two at once:
		// refused before anything is written, not failed midway.
		{"connection limit 1", as(role+"_one", dbName), []string{"too many connections", dbName, "CONNECTION LIMIT is 1"}},
	} {
		// run writes: on a database without Stepwise's tables it creates
		// them, which needs the privilege.
		o := cliRun(t, []string{"--db", tc.db, "run", "opsledger", "-p", "key=k1", "-p", "side=" + filepath.Join(dir, "side.log")})
		if o.code != ExitUsage {
			t.Errorf("%s: exit %d, want 2\n%s", tc.what, o.code, o)
		}
		for _, w := range tc.want {
			if !strings.Contains(o.stderr, w) {
				t.Errorf("%s: stderr does not say %q\n%s", tc.what, w, o)
			}
		}
		if strings.Contains(o.stderr+o.stdout, "s3cret") {
			t.Errorf("%s: the password is printed\n%s", tc.what, o)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("failing to reach PostgreSQL created %v", ents)
	}
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var tables int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").Scan(&tables); err != nil || tables != 0 {
		t.Errorf("a refused store wrote %d tables (%v)", tables, err)
	}
}

// TestDBPostgresRun: with --db naming a PostgreSQL database, a run is
// recorded there and listed by another invocation, through
// $STEPWISE_DB as through --db.
func TestDBPostgresRun(t *testing.T) {
	db := pgtest.Schema(t)
	side := filepath.Join(t.TempDir(), "side.log")
	if o := cliRun(t, []string{"--db", db, "run", "opsledger", "-p", "key=k1", "-p", "side=" + side}); o.code != ExitOK {
		t.Fatalf("run on PostgreSQL: exit %d\n%s", o.code, o)
	}
	// A rerun skips every step: the side file says each ran once.
	if o := cliRun(t, []string{"--db", db, "run", "opsledger", "-p", "key=k1", "-p", "side=" + side}); o.code != ExitOK {
		t.Fatalf("second run on PostgreSQL: exit %d\n%s", o.code, o)
	}
	if b, err := os.ReadFile(side); err != nil || strings.Count(string(b), "\n") != 3 {
		t.Errorf("side effects after a run and a rerun: %q (%v); want each of the three steps once", b, err)
	}
	t.Setenv("STEPWISE_DB", db)
	o := cliRun(t, []string{"runs"})
	if o.code != ExitOK || !strings.Contains(o.stdout, "opsledger/k1") || !strings.Contains(o.stdout, "succeeded") {
		t.Errorf("runs on PostgreSQL via $STEPWISE_DB: exit %d, want the succeeded run listed\n%s", o.code, o)
	}
}

func mustParse(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestDBPathIsAbsolute: a relative --db path is made absolute when parsed
// (as kong's path type did), and a URL is kept as it is.
func TestDBPathIsAbsolute(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for arg, want := range map[string]string{
		"rel.db":                        filepath.Join(dir, "rel.db"),
		"/abs/x.db":                     "/abs/x.db",
		"postgres://u:p@h/db":           "postgres://u:p@h/db",
		"postgresql://h/db?sslmode=off": "postgresql://h/db?sslmode=off",
	} {
		c := &struct{ Globals }{}
		parser, err := kong.New(c, cliConventions()...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := parser.Parse([]string{"--db", arg}); err != nil {
			t.Fatalf("--db %s: %v", arg, err)
		}
		if c.DB != want {
			t.Errorf("--db %s parsed as %q; want %q", arg, c.DB, want)
		}
	}
}

// TestDBPostgresReadOnlyCreatesNothing: a command that only reads, given
// a PostgreSQL database without Stepwise's tables, exits 2 saying so and
// creates no table there; a command that writes creates them.
func TestDBPostgresReadOnlyCreatesNothing(t *testing.T) {
	db := pgtest.Schema(t)
	for _, args := range [][]string{{"runs"}, {"show", "x/y"}} {
		o := cliRun(t, append([]string{"--db", db}, args...))
		if o.code != ExitUsage || !strings.Contains(o.stderr, "holds no Stepwise tables") {
			t.Errorf("%v on an empty PostgreSQL schema: exit %d, want 2 saying it holds no Stepwise tables\n%s", args, o.code, o)
		}
	}
	if n := tablesIn(t, db); n != 0 {
		t.Fatalf("read-only commands created %d tables", n)
	}
	side := filepath.Join(t.TempDir(), "side.log")
	if o := cliRun(t, []string{"--db", db, "run", "opsledger", "-p", "key=k1", "-p", "side=" + side}); o.code != ExitOK {
		t.Fatalf("run: exit %d\n%s", o.code, o)
	}
	if n := tablesIn(t, db); n == 0 {
		t.Errorf("run created no tables")
	}
}

// tablesIn counts the tables in the schema the URL db's search_path names.
func tablesIn(t *testing.T, db string) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDBBadPostgresURL: a --db URL that does not parse, or that pgx
// refuses, is bad usage (exit 2) naming --db, never the password,
// whether it sits in the user information or in a password= parameter.
func TestDBBadPostgresURL(t *testing.T) {
	t.Chdir(t.TempDir())
	for _, db := range []string{
		"postgres://ops:s3cret%zz@db.example/stepwise",
		"postgres://ops@db.example/stepwise?password=s3cret&sslmode=bogus",
		"postgres://ops:s3cret@db.example/stepwise?sslmode=bogus",
	} {
		o := cliRun(t, []string{"--db", db, "runs"})
		if o.code != ExitUsage || !strings.Contains(o.stderr, "--db") || !strings.Contains(o.stderr, "bad database URL") {
			t.Errorf("--db %s: exit %d, want 2 naming --db and a bad database URL\n%s", db, o.code, o)
		}
		if strings.Contains(o.stdout+o.stderr, "s3cret") {
			t.Errorf("--db %s: the password is printed\n%s", db, o)
		}
	}
}

// TestServerErrorsMidRunFailTheRun: a server error raised once the store
// is open (the server lost mid-run, a statement timeout) fails the run
// (exit 1: resume it), not bad usage; opening the store it is exit 2.
func TestServerErrorsMidRunFailTheRun(t *testing.T) {
	for _, kind := range []error{postgres.ErrUnavailable, postgres.ErrStatementTimeout, postgres.ErrTooManyConnections} {
		err := fmt.Errorf("step post: %w", &postgres.Error{Kind: kind, Where: "server db:5432, database x", Op: "write run r/1", Detail: "gone"})
		if got := ExitCode(err); got != ExitFailed {
			t.Errorf("ExitCode(%v) = %d; want %d (the run failed; a rerun resumes it)", kind, got, ExitFailed)
		}
	}
}
