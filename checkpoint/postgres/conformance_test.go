package postgres_test

import (
	"context"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/checkpoint/storetest"
)

// TestConformance runs the whole store conformance suite against
// PostgreSQL, a schema per test on the server STEPWISE_TEST_PG names.
func TestConformance(t *testing.T) {
	pgtest.URL(t) // without a server, says the PostgreSQL pass was not run
	storetest.Run(t, storetest.Harness{
		NewDatabase: func(t *testing.T) string { return pgtest.Schema(t) },
		Open: func(ctx context.Context, db string) (checkpoint.Store, error) {
			// The suite passes every time; leases use it instead of now().
			return postgres.Open(ctx, postgres.Config{URL: db, CallerClock: true})
		},
		SchemaVersion: postgres.SchemaVersion(),
	})
}
