package postgres_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

// A schema whose Idempotency-Keys were recorded before keys were scoped
// (schema 9) keeps them through migration 0010, in the empty scope: the
// legacy key answers there and only there, and the same key in a caller's
// scope is a new key; no insert may leave the scope out.
func TestMigrationScopesLegacyIdempotencyKeys(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Schema(t)
	ms, err := checkpoint.ReadMigrations(os.DirFS("migrations"), ".")
	if err != nil {
		t.Fatal(err)
	}
	conn := connectSchema(t, url)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`CREATE TABLE stepwise_schema (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`)
	for _, m := range ms {
		if m.Version > 9 {
			break
		}
		exec(m.SQL, pgx.QueryExecModeSimpleProtocol)
		exec(`INSERT INTO stepwise_schema (version, name) VALUES ($1, $2)`, m.Version, m.Name)
	}
	old := t0.Add(-24 * time.Hour)
	exec(`INSERT INTO idempotency_keys (key, request_hash, job, params, run_id, state, holder, created_at, updated_at)
VALUES ('nightly', 'h-old', 'settle', '{"date":"2026-11-27"}', 'settle/2026-11-27', 'done', 'x', $1, $1)`, old)

	st := open(t, postgres.Config{URL: url, CallerClock: true})
	if got := schemaVersions(t, st); got[len(got)-1] != postgres.SchemaVersion() {
		t.Fatalf("versions after open: %v; want up to %d", got, postgres.SchemaVersion())
	}
	rec, begun, err := st.BeginIdempotency(ctx, checkpoint.IdempotencyKey{Key: "nightly", RequestHash: "h-new", Job: "settle",
		Params: []byte(`{"date":"2026-11-28"}`), RunID: "settle/2026-11-28", CreatedAt: t0}, t0)
	if err != nil || begun || rec.RunID != "settle/2026-11-27" || rec.State != checkpoint.IdempotencyDone || rec.RequestHash != "h-old" ||
		string(rec.Params) != `{"date":"2026-11-27"}` || !rec.CreatedAt.Equal(old) {
		t.Fatalf("the legacy key in the empty scope: %+v, begun %v, %v; want the recorded key, done", rec, begun, err)
	}
	rec, begun, err = st.BeginIdempotency(ctx, checkpoint.IdempotencyKey{Scope: "token:ops", Key: "nightly", RequestHash: "h-new", Job: "settle",
		Params: []byte(`{"date":"2026-11-28"}`), RunID: "settle/2026-11-28", CreatedAt: t0}, t0)
	if err != nil || !begun || rec.RunID != "settle/2026-11-28" {
		t.Fatalf("the legacy key's name in a caller's scope: %+v, begun %v, %v; want a new key, begun", rec, begun, err)
	}
	// The default only filled the old rows.
	if _, err := conn.Exec(ctx, `INSERT INTO idempotency_keys (key, request_hash, job, params, run_id, state, holder, created_at, updated_at)
VALUES ('k', 'h', 'settle', '{}', 'settle/x', 'done', 'x', now(), now())`); err == nil {
		t.Errorf("an insert without a scope succeeded; want refused (scope has no default)")
	}
}
