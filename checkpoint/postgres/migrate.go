package postgres

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/stepwise-run/stepwise/checkpoint"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrations returns the embedded migrations in version order.
func migrations() ([]checkpoint.Migration, error) {
	return checkpoint.ReadMigrations(migrationFiles, "migrations")
}

// SchemaVersion is the newest schema version this binary knows.
func SchemaVersion() int {
	ms, err := migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

const (
	// sqlMigrateLock serialises migrations of one schema across every
	// process and host: held until the transaction ends.
	sqlMigrateLock = `SELECT pg_advisory_xact_lock(hashtextextended('stepwise migrate ' || coalesce(current_schema(), ''), 0))`
	// sqlSchemaTable tells whether the version table exists, without
	// needing the CREATE privilege a CREATE TABLE IF NOT EXISTS checks.
	sqlSchemaTable       = `SELECT to_regclass('stepwise_schema') IS NOT NULL`
	sqlCreateSchemaTable = `CREATE TABLE stepwise_schema (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`
	sqlSchemaVersion = `SELECT coalesce(max(version), 0) FROM stepwise_schema`
	sqlInsertVersion = `INSERT INTO stepwise_schema (version, name) VALUES ($1, $2)`
)

// migrate applies every embedded migration newer than the database's
// version, each in its own transaction together with its version row,
// under an advisory lock, so several hosts starting at once migrate once.
// A database newer than the binary is refused with both versions named.
func (s *Store) migrate(ctx context.Context) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	if s.cfg.NoMigrate {
		if done, err := s.checkMigrated(ctx, ms[len(ms)-1].Version); done || err != nil {
			return err
		}
	}
	for {
		more, err := s.migrateNext(ctx, ms)
		if err != nil || !more {
			return err
		}
	}
}

// migrateNext applies the first migration the database lacks, in one
// transaction under the lock; it reports whether it applied one.
func (s *Store) migrateNext(ctx context.Context, ms []checkpoint.Migration) (applied bool, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return false, s.wrap("begin migration", err)
	}
	defer func() {
		if err != nil {
			tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if _, err := tx.Exec(ctx, sqlMigrateLock); err != nil {
		return false, s.wrap("lock for migration", err)
	}
	var exists bool
	if err := tx.QueryRow(ctx, sqlSchemaTable).Scan(&exists); err != nil {
		return false, s.wrap("read schema version", err)
	}
	current := 0
	if exists {
		if err := tx.QueryRow(ctx, sqlSchemaVersion).Scan(&current); err != nil {
			return false, s.wrap("read schema version", err)
		}
	}
	latest := ms[len(ms)-1]
	if current > latest.Version {
		return false, fmt.Errorf("%w: %s has schema version %d, this binary knows up to %d; use a newer stepwise",
			checkpoint.ErrTooNew, s.where, current, latest.Version)
	}
	if current == latest.Version {
		return false, s.wrap("end migration", tx.Commit(ctx))
	}
	if !exists {
		if _, err := tx.Exec(ctx, sqlCreateSchemaTable); err != nil {
			return false, s.wrap("create schema table", err)
		}
	}
	var m checkpoint.Migration
	for _, m = range ms {
		if m.Version > current {
			break
		}
	}
	// The simple protocol runs the file's statements one after another.
	if _, err := tx.Exec(ctx, m.SQL, pgx.QueryExecModeSimpleProtocol); err != nil {
		return false, s.wrap("apply migration "+m.Name, err)
	}
	if _, err := tx.Exec(ctx, sqlInsertVersion, m.Version, m.Name); err != nil {
		return false, s.wrap("record migration "+m.Name, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, s.wrap("commit migration "+m.Name, err)
	}
	return true, nil
}

// checkMigrated is migrate for NoMigrate: it writes nothing (no lock, no
// table), and refuses a Stepwise schema older than latest. A database
// without it is left to migrate (done false), as MustExist decides.
func (s *Store) checkMigrated(ctx context.Context, latest int) (done bool, err error) {
	var exists bool
	if err := s.pool.QueryRow(ctx, sqlSchemaTable).Scan(&exists); err != nil {
		return false, s.wrap("read schema version", err)
	}
	if !exists {
		return false, nil
	}
	var current int
	if err := s.pool.QueryRow(ctx, sqlSchemaVersion).Scan(&current); err != nil {
		return false, s.wrap("read schema version", err)
	}
	if current > 0 && current < latest {
		return true, fmt.Errorf("%w: %s has schema version %d, this binary's is %d", checkpoint.ErrNeedsMigration, s.where, current, latest)
	}
	return current == latest, nil
}
