package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

// issue 23: a job's own query whose session the server ended (as at a
// server restart) is a transient fault once classified, so a partition
// reading its items from the database is handed back instead of failed;
// a mistake in the query is not.
func TestClassifyErrorOfAJobsOwnQuery(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Schema(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var pid int32
	if err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, url, "SELECT pg_terminate_backend($1)", pid)
	var one int
	qerr := conn.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	if qerr == nil {
		t.Fatal("a query on a session the server ended succeeded")
	}
	if errors.Is(qerr, checkpoint.ErrTransient) {
		t.Fatalf("the driver's own error %v already matches ErrTransient: nothing to classify", qerr)
	}
	if got := postgres.ClassifyError(qerr); !errors.Is(got, checkpoint.ErrTransient) || !errors.Is(got, qerr) {
		t.Errorf("ClassifyError(%v) = %v; want it to match checkpoint.ErrTransient and keep the driver's error", qerr, got)
	}
	_, serr := db.ExecContext(ctx, "SELEC 1")
	if got := postgres.ClassifyError(serr); serr == nil || got != serr {
		t.Errorf("ClassifyError of a syntax error %v = %v; want it unchanged", serr, got)
	}
	if postgres.ClassifyError(nil) != nil {
		t.Error("ClassifyError(nil) is not nil")
	}
}
