package postgres_test

import (
	"context"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/checkpoint/storetest"
)

// TestConformance runs the store conformance suite against PostgreSQL, a
// schema per test on the server STEPWISE_TEST_PG names. The store is not
// complete yet: it has no schedules, so the concepts
// that need them are not run here; the fence race of every write it does have runs
// in TestFenceRace (200 rounds). When the store is complete this becomes
// storetest.Run.
func TestConformance(t *testing.T) {
	pgtest.URL(t) // without a server, says the PostgreSQL pass was not run
	storetest.RunConcepts(t, storetest.Harness{
		NewDatabase: func(t *testing.T) string { return pgtest.Schema(t) },
		Open: func(ctx context.Context, db string) (checkpoint.Store, error) {
			// The suite passes every time; leases use it instead of now().
			return postgres.Open(ctx, postgres.Config{URL: db, CallerClock: true})
		},
		SchemaVersion: postgres.SchemaVersion(),
	}, storetest.Migration, storetest.ClaimAndLease, storetest.Steps, storetest.Items, storetest.ChunkPlans, storetest.Targets, storetest.Outbox, storetest.Operations)
}
