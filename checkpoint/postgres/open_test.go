package postgres_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

// withUser returns u with another user and password.
func withUser(t *testing.T, raw, user, password string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, password)
	return u.String()
}

func assertNames(t *testing.T, err error, want ...string) {
	t.Helper()
	t.Logf("error: %v", err)
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not name %q", err, w)
		}
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %q shows the password", err)
	}
}

// databaseOf is how errors name the database the URL raw selects
// ("database NAME"): whatever database STEPWISE_TEST_PG names.
func databaseOf(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	if name == "" {
		t.Fatalf("the URL %s names no database", raw)
	}
	return "database " + name
}

func TestOpenServerDown(t *testing.T) {
	u, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = "127.0.0.1:1" // nothing listens on port 1
	u.User = url.UserPassword("postgres", "s3cret")
	_, err = postgres.Open(context.Background(), postgres.Config{URL: u.String(), ConnectTimeout: 5 * time.Second})
	if !errors.Is(err, postgres.ErrUnavailable) {
		t.Fatalf("open on a closed port: %v, want ErrUnavailable", err)
	}
	assertNames(t, err, "server 127.0.0.1:1", databaseOf(t, u.String()))
}

func TestOpenDatabaseMissing(t *testing.T) {
	u, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + pgtest.Name(t) // never created
	_, err = postgres.Open(context.Background(), postgres.Config{URL: u.String()})
	if !errors.Is(err, postgres.ErrNoDatabase) {
		t.Fatalf("open a missing database: %v, want ErrNoDatabase", err)
	}
	assertNames(t, err, "database "+strings.TrimPrefix(u.Path, "/"), "server ")
}

func TestOpenSchemaMissing(t *testing.T) {
	u, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", pgtest.Name(t)) // never created
	u.RawQuery = q.Encode()
	_, err = postgres.Open(context.Background(), postgres.Config{URL: u.String()})
	if !errors.Is(err, postgres.ErrNoDatabase) || !strings.Contains(err.Error(), "search_path") {
		t.Fatalf("open with a missing schema: %v, want ErrNoDatabase naming search_path", err)
	}
}

// TestOpenPermissionDenied connects as a role that may connect but not
// create tables: the migration is refused, naming the privilege problem.
func TestOpenPermissionDenied(t *testing.T) {
	url := pgtest.Schema(t)
	role := pgtest.Name(t)
	schema := searchPath(t, url)
	pgtest.Exec(t, url, `CREATE ROLE `+pgx.Identifier{role}.Sanitize()+` LOGIN PASSWORD 's3cret'`)
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.URL(t), `DROP OWNED BY `+pgx.Identifier{role}.Sanitize()+`; DROP ROLE `+pgx.Identifier{role}.Sanitize())
	})
	asRole := withUser(t, url, role, "s3cret")
	// Without USAGE on the schema, the role sees no schema to create in.
	_, err := postgres.Open(context.Background(), postgres.Config{URL: asRole})
	if !errors.Is(err, postgres.ErrNoDatabase) || !strings.Contains(err.Error(), "USAGE") {
		t.Fatalf("open as a role without USAGE: %v, want ErrNoDatabase naming USAGE", err)
	}
	// With USAGE but not CREATE, the migration is refused.
	pgtest.Exec(t, url, `GRANT USAGE ON SCHEMA `+pgx.Identifier{schema}.Sanitize()+` TO `+pgx.Identifier{role}.Sanitize())
	_, err = postgres.Open(context.Background(), postgres.Config{URL: asRole})
	if !errors.Is(err, postgres.ErrPermission) {
		t.Fatalf("open as a role without privileges: %v, want ErrPermission", err)
	}
	assertNames(t, err, databaseOf(t, url), "permission denied")
}

func searchPath(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query().Get("search_path")
}

func TestOpenTooManyConnections(t *testing.T) {
	url := pgtest.Schema(t)
	role := pgtest.Name(t)
	pgtest.Exec(t, url, `CREATE ROLE `+pgx.Identifier{role}.Sanitize()+` LOGIN CONNECTION LIMIT 0`)
	t.Cleanup(func() { pgtest.Exec(t, pgtest.URL(t), `DROP ROLE `+pgx.Identifier{role}.Sanitize()) })
	_, err := postgres.Open(context.Background(), postgres.Config{URL: withUser(t, url, role, "s3cret")})
	if !errors.Is(err, postgres.ErrTooManyConnections) {
		t.Fatalf("open beyond the role's connection limit: %v, want ErrTooManyConnections", err)
	}
	assertNames(t, err, databaseOf(t, url))
}

func TestOpenBadURL(t *testing.T) {
	for _, u := range []string{"", "mysql://root:s3cret@db/x", "stepwise.db"} {
		_, err := postgres.Open(context.Background(), postgres.Config{URL: u})
		if err == nil {
			t.Fatalf("open %q: no error", u)
		}
		assertNames(t, err, "postgres://")
	}
}

// TestStatementTimeout holds the run row locked from another session: the
// write waits, times out, and leaves nothing.
func TestStatementTimeout(t *testing.T) {
	url := pgtest.Schema(t)
	st := open(t, postgres.Config{URL: url, CallerClock: true, StatementTimeout: 200 * time.Millisecond})
	c := mustClaim(t, st, claimReq("settle/2026-11-28", "h:1", t0))
	ctx := context.Background()
	blocker, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close(ctx)
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM runs WHERE id = $1 FOR UPDATE`, c.Lease.RunID); err != nil {
		t.Fatal(err)
	}
	err = st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		return tx.PutStep(checkpoint.Step{ID: "load", Status: checkpoint.StepCompleted, Output: []byte(`1`), StartedAt: t0, FinishedAt: t0})
	})
	if !errors.Is(err, postgres.ErrStatementTimeout) {
		t.Fatalf("write behind a held lock: %v, want ErrStatementTimeout", err)
	}
	assertNames(t, err, databaseOf(t, url))
	tx.Rollback(ctx)
	n := 0
	if err := st.Steps(ctx, c.Lease.RunID, func(checkpoint.Step) error { n++; return nil }); err != nil || n != 0 {
		t.Fatalf("steps after the timeout: %d, %v; want none", n, err)
	}
}
