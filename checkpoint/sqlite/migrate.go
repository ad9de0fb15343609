package sqlite

import (
	"context"
	"embed"
	"fmt"

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
	sqlCreateSchemaTable = `CREATE TABLE IF NOT EXISTS stepwise_schema (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
)`
	sqlSchemaVersion = `SELECT COALESCE(MAX(version), 0) FROM stepwise_schema`
	sqlInsertVersion = `INSERT INTO stepwise_schema (version, name) VALUES (?, ?)`
)

// migrate applies every embedded migration newer than the database's
// version, each in its own transaction together with its version row. A
// database newer than the binary is refused with both versions named.
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
	if _, err := s.db.ExecContext(ctx, sqlCreateSchemaTable); err != nil {
		return s.wrap("create schema table", err)
	}
	var current int
	if err := s.db.QueryRowContext(ctx, sqlSchemaVersion).Scan(&current); err != nil {
		return s.wrap("read schema version", err)
	}
	if latest := ms[len(ms)-1].Version; current > latest {
		return fmt.Errorf("%w: %s has schema version %d, this binary knows up to %d; use a newer stepwise",
			checkpoint.ErrTooNew, s.path, current, latest)
	}
	for _, m := range ms {
		if m.Version <= current {
			continue
		}
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return s.wrap("begin migration "+m.Name, err)
		}
		// Another process may have migrated since we read the version;
		// the write lock we now hold makes this read authoritative.
		if err := tx.QueryRowContext(ctx, sqlSchemaVersion).Scan(&current); err != nil {
			tx.Rollback()
			return s.wrap("read schema version", err)
		}
		if m.Version <= current {
			tx.Rollback()
			continue
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			tx.Rollback()
			return s.wrap("apply migration "+m.Name, err)
		}
		if _, err := tx.ExecContext(ctx, sqlInsertVersion, m.Version, m.Name); err != nil {
			tx.Rollback()
			return s.wrap("record migration "+m.Name, err)
		}
		if err := tx.Commit(); err != nil {
			return s.wrap("commit migration "+m.Name, err)
		}
	}
	return nil
}

// checkMigrated is migrate for NoMigrate: it writes nothing, and refuses
// a Stepwise schema older than latest. A file without Stepwise's schema
// (new, or holding only other tables) is left to migrate (done false),
// which creates the tables as for any store.
func (s *Store) checkMigrated(ctx context.Context, latest int) (done bool, err error) {
	var tables int
	if err := s.db.QueryRowContext(ctx, sqlHasSchemaTable).Scan(&tables); err != nil {
		return false, s.wrap("read schema version", err)
	}
	if tables == 0 {
		return false, nil
	}
	var current int
	if err := s.db.QueryRowContext(ctx, sqlSchemaVersion).Scan(&current); err != nil {
		return false, s.wrap("read schema version", err)
	}
	if current > 0 && current < latest {
		return true, fmt.Errorf("%w: %s has schema version %d, this binary's is %d", checkpoint.ErrNeedsMigration, s.path, current, latest)
	}
	return current == latest, nil
}

const sqlHasSchemaTable = `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'stepwise_schema'`
