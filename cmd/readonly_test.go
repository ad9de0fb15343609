package cmd

import (
	"context"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
)

// TestReadOnlyCommandsDoNotMigrate: a database at an older schema than
// this binary's is refused by the commands that only read (runs, show,
// schedules, outbox, a dry run), saying a command that writes migrates
// it, and is left at its version.
func TestReadOnlyCommandsDoNotMigrate(t *testing.T) {
	db, side := testFiles(t)
	createDB(t, db)
	sqlDB := checkpointtest.SQL(t, db)
	ctx := context.Background()
	version := func() int {
		t.Helper()
		var v int
		if err := sqlDB.QueryRowContext(ctx, `SELECT max(version) FROM stepwise_schema`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	latest := version()
	// As a database written by the binary before the latest migration.
	if _, err := sqlDB.ExecContext(ctx, `DELETE FROM stepwise_schema WHERE version = $1`, latest); err != nil {
		t.Fatal(err)
	}
	older := version() // the versions need not be contiguous
	for _, args := range [][]string{
		{"--db", db, "runs"},
		{"--db", db, "show", "crashy/k"},
		{"--db", db, "schedules"},
		{"--db", db, "outbox"},
		append(crashyArgs(db, "k", side), "--dry-run"),
	} {
		var out, errb syncBuffer
		code := Execute(ctx, testRegistry(), args, &out, &errb, Schedules(everySecond(side)))
		msg := errb.String()
		if code != ExitUsage || !strings.Contains(msg, "schema is older than this binary's") ||
			!strings.Contains(msg, "a command that writes (run, resume, serve, worker) migrates it") {
			t.Errorf("%v: exit %d, stderr %q; want %d saying a read does not migrate", args[2:], code, msg, ExitUsage)
		}
		if v := version(); v != older {
			t.Fatalf("%v migrated the database to version %d", args[2:], v)
		}
	}
}
