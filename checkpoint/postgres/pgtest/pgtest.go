// Package pgtest gives tests a fresh, private PostgreSQL schema or
// database on the server named by STEPWISE_TEST_PG, dropped when the test
// ends, so test packages running at once never share tables.
//
// Without STEPWISE_TEST_PG the helpers skip the test with a message saying
// the PostgreSQL pass was not run: the one case a skip is right. With it
// set, a server that cannot be reached fails the test.
//
//	func TestClaim(t *testing.T) {
//		url := pgtest.Schema(t) // a postgres:// URL whose search_path is a new schema
//		st, err := postgres.Open(ctx, postgres.Config{URL: url})
//		...
//	}
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stepwise-run/stepwise/checkpoint/storetest"
)

// EnvURL is the environment variable naming the test server and database,
// e.g. postgres://postgres@127.0.0.1:5432/test. The database is created if
// it does not exist.
const EnvURL = "STEPWISE_TEST_PG"

// SkipMessage is what a test skipped for want of a server says.
const SkipMessage = EnvURL + " is not set: the PostgreSQL pass was not run " +
	"(set it to a postgres:// URL, e.g. postgres://postgres@127.0.0.1:5432/test)"

// URL returns the server URL from STEPWISE_TEST_PG, skipping t when it is
// not set.
func URL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(EnvURL)
	if u == "" {
		t.Skip(SkipMessage)
	}
	return u
}

// Schema creates a new schema in the STEPWISE_TEST_PG database and returns
// a URL whose search_path is that schema, so a store opened with it keeps
// its tables there. The schema is dropped, with its tables, when t ends.
func Schema(t testing.TB) string {
	t.Helper()
	base := URL(t)
	conn := connect(t, base, true)
	defer conn.Close(context.Background())
	name := Name(t)
	if _, err := conn.Exec(context.Background(), "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create schema %s: %v", name, err)
	}
	t.Cleanup(func() {
		c := connect(t, base, false)
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("pgtest: drop schema %s: %v", name, err)
		}
	})
	return withParam(t, base, "search_path", name)
}

// Database creates a new database on the STEPWISE_TEST_PG server and
// returns its URL; it is dropped (its sessions ended) when t ends. For
// tests that need a whole database: a separate effect target, or a store
// beside another one.
func Database(t testing.TB) string {
	t.Helper()
	base := URL(t)
	conn := connect(t, base, true)
	defer conn.Close(context.Background())
	name := Name(t)
	if _, err := conn.Exec(context.Background(), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		c := connect(t, base, false)
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("pgtest: %s is not a URL: %v", EnvURL, err)
	}
	u.Path = "/" + name
	return u.String()
}

// Exec runs SQL on the database of url (as the URL's role), for tests
// that set up roles, grants or rows.
func Exec(t testing.TB, dbURL, sql string, args ...any) {
	t.Helper()
	conn := connect(t, dbURL, false)
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// Name returns a fresh lower-case identifier derived from the test's name,
// for schemas, databases and roles.
func Name(t testing.TB) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("pgtest: random name: %v", err)
	}
	var sb strings.Builder
	for _, r := range strings.ToLower(t.Name()) {
		if sb.Len() >= 40 {
			break
		}
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			sb.WriteRune(r)
		} else {
			sb.WriteByte('_')
		}
	}
	return "sw_" + sb.String() + "_" + hex.EncodeToString(b[:])
}

// withParam returns dbURL with one more query parameter.
func withParam(t testing.TB, dbURL, key, value string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("pgtest: %s is not a URL: %v", EnvURL, err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// connect opens one connection to dbURL; with create, a database that
// does not exist yet is created first (from the server's postgres
// database).
func connect(t testing.TB, dbURL string, create bool) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	var pe *pgconn.PgError
	if create && errors.As(err, &pe) && pe.Code == "3D000" {
		u, perr := url.Parse(dbURL)
		if perr != nil {
			t.Fatalf("pgtest: %s is not a URL: %v", EnvURL, perr)
		}
		name := strings.TrimPrefix(u.Path, "/")
		u.Path = "/postgres"
		admin, aerr := pgx.Connect(ctx, u.String())
		if aerr != nil {
			t.Fatalf("pgtest: connect to %s to create database %s: %v", u.Redacted(), name, aerr)
		}
		_, cerr := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		admin.Close(ctx)
		if cerr != nil && !(errors.As(cerr, &pe) && pe.Code == "42P04") { // created meanwhile
			t.Fatalf("pgtest: create database %s: %v", name, cerr)
		}
		conn, err = pgx.Connect(ctx, dbURL)
	}
	if err != nil {
		t.Fatalf("pgtest: connect to %s (%s): %v", redact(dbURL), EnvURL, err)
	}
	return conn
}

func redact(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return "the server"
}

// TargetDatabase creates a new database (as Database does) for the
// conformance suite's separate-store effect target tests, and says how to
// reach and inspect it. Its Missing location names a database the server
// does not have, with a password in the URL that no error may show.
func TargetDatabase(t testing.TB) storetest.TargetDatabase {
	t.Helper()
	loc := Database(t)
	u, err := url.Parse(loc)
	if err != nil {
		t.Fatalf("pgtest: %s is not a URL: %v", loc, err)
	}
	user := "postgres"
	if u.User != nil {
		user = u.User.Username()
	}
	u.User = url.UserPassword(user, "pgtest-secret-pw")
	u.Path = "/" + Name(t) + "_missing"
	return storetest.TargetDatabase{
		Location: loc,
		Missing:  u.String(),
		Exec: func(sql string, args ...any) error {
			return withConn(loc, func(c *pgx.Conn) error {
				_, err := c.Exec(context.Background(), sql, args...)
				return err
			})
		},
		QueryInt: func(sql string, args ...any) (int64, error) {
			var v int64
			err := withConn(loc, func(c *pgx.Conn) error {
				return c.QueryRow(context.Background(), sql, args...).Scan(&v)
			})
			return v, err
		},
		Tables: func() ([]string, error) {
			var names []string
			err := withConn(loc, func(c *pgx.Conn) error {
				rows, err := c.Query(context.Background(), `SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema()`)
				if err != nil {
					return err
				}
				names, err = pgx.CollectRows(rows, pgx.RowTo[string])
				return err
			})
			return names, err
		},
	}
}

// withConn calls fn with one connection to dbURL.
func withConn(dbURL string, fn func(*pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	return fn(c)
}
