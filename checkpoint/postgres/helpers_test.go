package postgres_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

// t0 is the fake clock's start in tests on the caller's clock.
var t0 = time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)

// open opens a store on url, closed when t ends.
func open(t testing.TB, cfg postgres.Config) *postgres.Store {
	t.Helper()
	st, err := postgres.Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("open %s: %v", cfg.URL, err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// openFresh opens a store on the caller's clock in a new schema.
func openFresh(t testing.TB) (*postgres.Store, string) {
	t.Helper()
	url := pgtest.Schema(t)
	return open(t, postgres.Config{URL: url, CallerClock: true}), url
}

func claimReq(runID, owner string, now time.Time) checkpoint.ClaimRequest {
	return checkpoint.ClaimRequest{
		RunID: runID, Job: "settle", RunKey: "2026-11-28", Params: []byte(`{"day":"2026-11-28"}`),
		ParamsHash: "h1", Owner: owner, Now: now, LeaseFor: time.Minute,
	}
}

func mustClaim(t testing.TB, st *postgres.Store, req checkpoint.ClaimRequest) checkpoint.Claim {
	t.Helper()
	c, err := st.Claim(context.Background(), req)
	if err != nil {
		t.Fatalf("claim %s by %s: %v", req.RunID, req.Owner, err)
	}
	return c
}

// TestMain says, without STEPWISE_TEST_PG, that the PostgreSQL pass was not
// run, even for `go test ./...` without -v (see pgtest.Main).
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
