package sqlite_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
)

// A database whose Idempotency-Keys were recorded before keys were scoped
// (schema 11) keeps them through migration 0012, in the empty scope: the
// legacy key answers there and only there, and the same key in a caller's
// scope is a new key; no insert may leave the scope out.
func TestMigrationScopesLegacyIdempotencyKeys(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "stepwise.db")
	ms, err := checkpoint.ReadMigrations(os.DirFS("migrations"), ".")
	if err != nil {
		t.Fatal(err)
	}
	withSQLite(t, path, func(db *sql.DB) {
		if _, err := db.Exec(`CREATE TABLE stepwise_schema (version INTEGER PRIMARY KEY, name TEXT NOT NULL,
    applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))`); err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.Version > 11 {
				break
			}
			if _, err := db.Exec(m.SQL); err != nil {
				t.Fatalf("apply %s: %v", m.Name, err)
			}
			if _, err := db.Exec(`INSERT INTO stepwise_schema (version, name) VALUES (?, ?)`, m.Version, m.Name); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := db.Exec(`INSERT INTO idempotency_keys (key, request_hash, job, params, run_id, state, holder, created_at, updated_at)
VALUES ('nightly', 'h-old', 'settle', '{"date":"2026-11-27"}', 'settle/2026-11-27', 'done', 'x', ?1, ?1)`,
			claimNow.Add(-24*time.Hour).Format("2006-01-02T15:04:05.000000Z")); err != nil {
			t.Fatal(err)
		}
	})
	st, err := sqlite.Open(ctx, sqlite.Config{Path: path})
	if err != nil {
		t.Fatalf("open a schema-11 database: %v", err)
	}
	defer st.Close()
	if got := schemaVersions(t, st.DB()); got[len(got)-1] != sqlite.SchemaVersion() {
		t.Fatalf("versions after open: %v; want up to %d", got, sqlite.SchemaVersion())
	}
	rec, begun, err := st.BeginIdempotency(ctx, checkpoint.IdempotencyKey{Key: "nightly", RequestHash: "h-new", Job: "settle",
		Params: []byte(`{"date":"2026-11-28"}`), RunID: "settle/2026-11-28", CreatedAt: claimNow}, claimNow)
	if err != nil || begun || rec.RunID != "settle/2026-11-27" || rec.State != checkpoint.IdempotencyDone || rec.RequestHash != "h-old" ||
		string(rec.Params) != `{"date":"2026-11-27"}` || !rec.CreatedAt.Equal(claimNow.Add(-24*time.Hour)) {
		t.Fatalf("the legacy key in the empty scope: %+v, begun %v, %v; want the recorded key, done", rec, begun, err)
	}
	rec, begun, err = st.BeginIdempotency(ctx, checkpoint.IdempotencyKey{Scope: "token:ops", Key: "nightly", RequestHash: "h-new", Job: "settle",
		Params: []byte(`{"date":"2026-11-28"}`), RunID: "settle/2026-11-28", CreatedAt: claimNow}, claimNow)
	if err != nil || !begun || rec.RunID != "settle/2026-11-28" {
		t.Fatalf("the legacy key's name in a caller's scope: %+v, begun %v, %v; want a new key, begun", rec, begun, err)
	}
	if _, err := st.DB().Exec(`INSERT INTO idempotency_keys (key, request_hash, job, params, run_id, state, holder, created_at, updated_at)
VALUES ('k', 'h', 'settle', '{}', 'settle/x', 'done', 'x', '', '')`); err == nil {
		t.Errorf("an insert without a scope succeeded; want refused (scope has no default)")
	}
}
