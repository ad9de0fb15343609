package sqlite

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/stepwise-run/stepwise/checkpoint"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns the embedded migrations in version order. Files are
// named NNNN_what.sql.
func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("checkpoint: migration file %s is not named NNNN_name.sql", e.Name())
		}
		b, err := migrationFiles.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: e.Name(), sql: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

// SchemaVersion is the newest schema version this binary knows.
func SchemaVersion() int {
	ms, err := migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].version
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
	if _, err := s.db.ExecContext(ctx, sqlCreateSchemaTable); err != nil {
		return s.wrap("create schema table", err)
	}
	var current int
	if err := s.db.QueryRowContext(ctx, sqlSchemaVersion).Scan(&current); err != nil {
		return s.wrap("read schema version", err)
	}
	if latest := ms[len(ms)-1].version; current > latest {
		return fmt.Errorf("%w: %s has schema version %d, this binary knows up to %d; use a newer stepwise",
			checkpoint.ErrTooNew, s.path, current, latest)
	}
	for _, m := range ms {
		if m.version <= current {
			continue
		}
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return s.wrap("begin migration "+m.name, err)
		}
		// Another process may have migrated since we read the version;
		// the write lock we now hold makes this read authoritative.
		if err := tx.QueryRowContext(ctx, sqlSchemaVersion).Scan(&current); err != nil {
			tx.Rollback()
			return s.wrap("read schema version", err)
		}
		if m.version <= current {
			tx.Rollback()
			continue
		}
		if _, err := tx.ExecContext(ctx, m.sql); err != nil {
			tx.Rollback()
			return s.wrap("apply migration "+m.name, err)
		}
		if _, err := tx.ExecContext(ctx, sqlInsertVersion, m.version, m.name); err != nil {
			tx.Rollback()
			return s.wrap("record migration "+m.name, err)
		}
		if err := tx.Commit(); err != nil {
			return s.wrap("commit migration "+m.name, err)
		}
	}
	return nil
}
