package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

// sqlReader is what steps.Run.TargetDB asks of an effect target.
type sqlReader interface{ ReadDB() *sql.DB }

func TestReadDBIsReadOnlyAndClosesWithTheStore(t *testing.T) {
	ctx := context.Background()
	st, _ := openFresh(t)
	et, err := st.OpenTarget(ctx, checkpoint.TargetSpec{Table: checkpoint.StateTable})
	if err != nil {
		t.Fatal(err)
	}
	rd, ok := et.(sqlReader)
	if !ok {
		t.Fatalf("same-store target %T has no ReadDB", et)
	}
	db := rd.ReadDB()
	if db != st.ReadDB() {
		t.Error("a same-store target's ReadDB is not the store's")
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM stepwise_state WHERE key = $1`, "k").Scan(&n); err != nil || n != 0 {
		t.Fatalf("read the state table through ReadDB: %d, %v", n, err)
	}
	_, err = db.ExecContext(ctx, `INSERT INTO stepwise_state (key, value, version) VALUES ($1, 1, 1)`, "k")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "25006" {
		t.Errorf("a write through ReadDB: %v; want read_only_sql_transaction (25006)", err)
	}
	et.Close()
	if err := db.PingContext(ctx); err != nil {
		t.Errorf("ReadDB after closing a same-store target (not the store): %v", err)
	}
	st.Close()
	if err := db.PingContext(ctx); err == nil {
		t.Error("ReadDB still works after the store closed")
	}
}

func TestOpenDatabaseTargetWithoutAStore(t *testing.T) {
	ctx := context.Background()
	loc := pgtest.Database(t)
	pgtest.Exec(t, loc, `CREATE TABLE accounts (id text PRIMARY KEY, cents bigint NOT NULL, v bigint NOT NULL)`)
	pgtest.Exec(t, loc, `INSERT INTO accounts VALUES ('a', 500, 1)`)
	table := checkpoint.Table{Name: "accounts", Key: "id", Value: "cents", Version: "v"}
	et, err := postgres.OpenDatabaseTarget(ctx, postgres.Config{ApplicationName: "target-test"}, checkpoint.TargetSpec{Location: loc, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if et.Same() {
		t.Error("OpenDatabaseTarget gave a same-store target")
	}
	db := et.(sqlReader).ReadDB()
	var app string
	if err := db.QueryRowContext(ctx, `SELECT current_setting('application_name')`).Scan(&app); err != nil || app != "target-test" {
		t.Errorf("the target's sessions run as application %q (%v); want the Config's target-test", app, err)
	}
	if err := et.Update(ctx, func(v checkpoint.Target) error {
		return v.Write(ctx, []checkpoint.Write{{Key: "a", OldVersion: 1, OldValue: 500, NewValue: 450}})
	}); err != nil {
		t.Fatal(err)
	}
	var cents int64
	if err := db.QueryRowContext(ctx, `SELECT cents FROM accounts WHERE id = $1`, "a").Scan(&cents); err != nil || cents != 450 {
		t.Errorf("cents after the write = %d, %v; want 450", cents, err)
	}
	if err := et.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.PingContext(ctx); err == nil {
		t.Error("the target's ReadDB still works after Close")
	}

	bad := table
	bad.Value = "balance"
	_, err = postgres.OpenDatabaseTarget(ctx, postgres.Config{}, checkpoint.TargetSpec{Location: loc, Table: bad})
	if err == nil || !strings.Contains(err.Error(), "balance") {
		t.Errorf("a target table lacking its value column: %v; want an error naming the column", err)
	}
}

func TestOpenDB(t *testing.T) {
	ctx := context.Background()
	loc := pgtest.Schema(t)
	db, err := postgres.OpenDB(ctx, postgres.Config{URL: loc})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE seeded (id text PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO seeded VALUES ($1, $2)`, "x", int64(7)); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := db.QueryRowContext(ctx, `SELECT n FROM seeded WHERE id = $1`, "x").Scan(&n); err != nil || n != 7 {
		t.Errorf("read back = %d, %v; want 7", n, err)
	}

	missing := strings.Replace(pgtest.Database(t), "/sw_", "/sw_missing_", 1)
	_, err = postgres.OpenDB(ctx, postgres.Config{URL: missing})
	if !errors.Is(err, postgres.ErrNoDatabase) || !errors.Is(err, checkpoint.ErrNoDatabase) {
		t.Errorf("OpenDB on a missing database: %v; want ErrNoDatabase (both)", err)
	}
	_, err = postgres.OpenDB(ctx, postgres.Config{URL: "postgres://postgres:pw@127.0.0.1:1/test"})
	if !errors.Is(err, postgres.ErrUnavailable) || strings.Contains(err.Error(), ":pw@") {
		t.Errorf("OpenDB with no server: %v; want ErrUnavailable without the password", err)
	}
	if _, err := postgres.OpenDB(ctx, postgres.Config{URL: "/tmp/x.db"}); err == nil {
		t.Error("OpenDB on a file path succeeded")
	}
}
