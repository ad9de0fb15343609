package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/checkpoint/storetest"
)

// TestConformance runs the whole store conformance suite against
// PostgreSQL, a schema per test on the server STEPWISE_TEST_PG names, in
// the production clock mode (leases and run times from the server's
// now()), but for the tests that steer time past a lease or read back the
// times they gave, which run on the caller's clock (Config.CallerClock).
func TestConformance(t *testing.T) {
	pgtest.URL(t) // without a server, says the PostgreSQL pass was not run
	storetest.Run(t, storetest.Harness{
		NewDatabase:       func(t *testing.T) string { return pgtest.Schema(t) },
		NewTargetDatabase: func(t *testing.T) storetest.TargetDatabase { return pgtest.TargetDatabase(t) },
		Open: func(ctx context.Context, db string) (checkpoint.Store, error) {
			return postgres.Open(ctx, postgres.Config{URL: db})
		},
		ServerClock: true,
		OpenCallerClock: func(ctx context.Context, db string) (checkpoint.Store, error) {
			// The suite passes every time; leases use it instead of now().
			return postgres.Open(ctx, postgres.Config{URL: db, CallerClock: true})
		},
		SchemaVersion: postgres.SchemaVersion(),
		SchemaVersions: func(t *testing.T, db string) []int {
			conn := connectSchema(t, db)
			rows, err := conn.Query(context.Background(), `SELECT version FROM stepwise_schema ORDER BY version`)
			if err != nil {
				t.Fatalf("read schema versions: %v", err)
			}
			vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
			if err != nil {
				t.Fatalf("read schema versions: %v", err)
			}
			return vs
		},
		MarkNewer: func(t *testing.T, db string, v int) {
			pgtest.Exec(t, db, `INSERT INTO stepwise_schema (version, name) VALUES ($1, 'newer.sql')`, v)
		},
	})
}

// connectSchema opens one connection on the schema URL db, closed when t
// ends.
func connectSchema(t *testing.T, db string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatalf("connect %s: %v", db, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
