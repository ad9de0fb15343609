package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

func schemaVersions(t *testing.T, st *postgres.Store) []int {
	t.Helper()
	rows, err := st.Pool().Query(context.Background(), `SELECT version FROM stepwise_schema ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

// embeddedVersions are the versions of the migration files, in order
// (their numbers may have gaps while branches that each add one are
// merged).
func embeddedVersions(t *testing.T) []int {
	t.Helper()
	ms, err := checkpoint.ReadMigrations(os.DirFS("migrations"), ".")
	if err != nil {
		t.Fatal(err)
	}
	var vs []int
	for _, m := range ms {
		vs = append(vs, m.Version)
	}
	return vs
}

func TestMigrateTwiceIsIdempotent(t *testing.T) {
	url := pgtest.Schema(t)
	first := open(t, postgres.Config{URL: url})
	want := schemaVersions(t, first)
	if fmt.Sprint(want) != fmt.Sprint(embeddedVersions(t)) || want[len(want)-1] != postgres.SchemaVersion() {
		t.Fatalf("versions after the first open = %v, want %v ending at %d", want, embeddedVersions(t), postgres.SchemaVersion())
	}
	first.Close()
	second := open(t, postgres.Config{URL: url})
	if got := schemaVersions(t, second); len(got) != len(want) {
		t.Fatalf("versions after the second open = %v, want %v", got, want)
	}
	// The tables are in the test's schema, not public.
	var n int
	if err := second.Pool().QueryRow(context.Background(),
		`SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = 'runs'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("runs in the current schema: %d, %v", n, err)
	}
}

func TestMigrateConcurrentlyMigratesOnce(t *testing.T) {
	url := pgtest.Schema(t)
	const hosts = 4
	var wg sync.WaitGroup
	errs := make([]error, hosts)
	stores := make([]*postgres.Store, hosts)
	for i := range hosts {
		wg.Go(func() {
			stores[i], errs[i] = postgres.Open(context.Background(), postgres.Config{URL: url, MaxConns: 2})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("host %d: open: %v", i, err)
		}
		defer stores[i].Close()
	}
	got := schemaVersions(t, stores[0])
	if fmt.Sprint(got) != fmt.Sprint(embeddedVersions(t)) {
		t.Fatalf("stepwise_schema holds %v; want each of %v once", got, embeddedVersions(t))
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	url := pgtest.Schema(t)
	st := open(t, postgres.Config{URL: url})
	newer := postgres.SchemaVersion() + 5
	if _, err := st.Pool().Exec(context.Background(), `INSERT INTO stepwise_schema (version, name) VALUES ($1, 'future.sql')`, newer); err != nil {
		t.Fatal(err)
	}
	_, err := postgres.Open(context.Background(), postgres.Config{URL: url})
	if !errors.Is(err, checkpoint.ErrTooNew) {
		t.Fatalf("open a newer database: %v, want ErrTooNew", err)
	}
	for _, want := range []string{"version " + itoa(newer), "up to " + itoa(postgres.SchemaVersion()), databaseOf(t, url)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestKeysCompareBytewise checks item ranges mean what they mean on SQLite
// whatever the database's collation: "B" < "a" < "b" < "é" bytewise.
func TestKeysCompareBytewise(t *testing.T) {
	st, _ := openFresh(t)
	c := mustClaim(t, st, claimReq("settle/2026-11-28", "h:1", t0))
	keys := []string{"b", "é", "B", "a", "a-1", "a_1"}
	err := st.InTx(context.Background(), c.Lease, func(tx checkpoint.Tx) error {
		var items []checkpoint.Item
		for _, k := range keys {
			items = append(items, checkpoint.Item{Step: "post", Key: k, Status: checkpoint.StepCompleted})
		}
		return tx.PutItems(items)
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	if err := st.Items(context.Background(), checkpoint.ItemQuery{RunID: c.Lease.RunID, Step: "post", From: "B", To: "a_1"},
		func(it checkpoint.Item) error { got = append(got, it.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	want := "B a a-1 a_1" // bytewise: 'B'(0x42) < 'a'(0x61); '-'(0x2d) < '_'(0x5f)
	if strings.Join(got, " ") != want {
		t.Fatalf("range B..a_1 = %q, want %q", strings.Join(got, " "), want)
	}
}

// Chunk plans are compressed with lz4 where the server has it (migration
// 0006): a plan recorded through a transaction is stored so.
func TestChunkPlansUseLZ4(t *testing.T) {
	st, _ := openFresh(t)
	ctx := context.Background()
	var lz4 bool
	if err := st.Pool().QueryRow(ctx, `SELECT current_setting('server_version_num')::int >= 140000 AND EXISTS (
    SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals))`).Scan(&lz4); err != nil {
		t.Fatal(err)
	}
	c := mustClaim(t, st, claimReq("lz4/1", "host-a:1", t0))
	plan := []byte(`[` + strings.Repeat(`{"key":"acct:1","old_value":1,"new_value":2},`, 2000) + `{}]`)
	if err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		return tx.PutChunkPlan(checkpoint.ChunkPlan{Step: "post", EffectID: "e1", Status: checkpoint.ChunkApplied, Plan: plan})
	}); err != nil {
		t.Fatal(err)
	}
	var method string
	if err := st.Pool().QueryRow(ctx, `SELECT coalesce(pg_column_compression(plan), 'none') FROM chunk_plans WHERE effect_id = 'e1'`).Scan(&method); err != nil {
		t.Fatal(err)
	}
	want := "pglz"
	if lz4 {
		want = "lz4"
	}
	if method != want {
		t.Errorf("the chunk plan is compressed with %s; want %s", method, want)
	}
}
