// Package stores opens a checkpoint store by its location, whatever its
// backend: a postgres:// or postgresql:// URL is a PostgreSQL database,
// anything else a SQLite file path. It is the one package that imports
// both backends, so each can open effect targets of the other kind
// (Config.Targets): a PostgreSQL store's target may be a SQLite file and a
// SQLite store's a PostgreSQL database, each opened with the settings the
// store was opened with.
//
// Import rule: stores imports checkpoint and its backends, never steps,
// jobs, runner or cmd.
package stores

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
)

// Settings are a store's settings, for either backend; each backend takes
// the ones that concern it, and a separate effect target is opened with
// the same ones (a SQLite file target with the SQLite settings, a
// PostgreSQL database target with the PostgreSQL settings). Zero values
// are the backends' defaults.
type Settings struct {
	// MustExist refuses to create a missing SQLite file
	// (sqlite.Config.MustExist), and refuses a PostgreSQL database without
	// Stepwise's tables instead of creating them (postgres.Config.MustExist;
	// a PostgreSQL database itself is never created): for commands that
	// only read.
	MustExist bool
	// NoMigrate refuses a database whose schema is older than this
	// binary's (checkpoint.ErrNeedsMigration) instead of migrating it: for
	// commands that only read, which must not change it.
	NoMigrate bool
	// Synchronous is the SQLite durability level (sqlite.SyncFull or sqlite.SyncNormal).
	Synchronous string
	// BusyTimeout is how long a SQLite write waits for another process's.
	BusyTimeout time.Duration

	// MaxConns is the PostgreSQL store's pool size (postgres.Config.MaxConns);
	// a separate PostgreSQL target keeps its own pool of 2.
	MaxConns int32
	// StatementTimeout cancels a PostgreSQL statement that runs longer.
	StatementTimeout time.Duration
	// IdleInTxTimeout ends a PostgreSQL session idle inside a transaction.
	IdleInTxTimeout time.Duration
	// Lease is the runners' lease, when known: a PostgreSQL store's
	// session timeouts follow it (postgres.Config.Lease).
	Lease time.Duration
	// ConnectTimeout bounds establishing one PostgreSQL connection.
	ConnectTimeout time.Duration
	// ApplicationName is shown in PostgreSQL's pg_stat_activity.
	ApplicationName string
	// CallerClock makes a PostgreSQL store compute leases from the times
	// the caller passes (tests with a fake clock).
	CallerClock bool
	// OwnTargetCredentials makes PostgreSQL effect target databases take
	// their password from their own URL only, never from the environment
	// or a passfile (postgres.Config.OwnTargetCredentials).
	OwnTargetCredentials bool
}

// Open opens the checkpoint store at location (a postgres:// or
// postgresql:// URL, or a SQLite file path) with s, able to open effect
// targets of either kind. Its errors are the backend's (a missing
// database wraps checkpoint.ErrNoDatabase in both) and never show a
// password.
func Open(ctx context.Context, location string, s Settings) (checkpoint.Backend, error) {
	if IsURL(location) {
		cfg := s.postgres(location)
		cfg.MustExist, cfg.NoMigrate = s.MustExist, s.NoMigrate
		cfg.Targets = s.fileTargets
		st, err := postgres.Open(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return st, nil
	}
	if _, ok := otherScheme(location); ok {
		return nil, fmt.Errorf("stores: %s: no store for this kind of URL; use a postgres:// URL or a SQLite file path", Redact(location))
	}
	cfg := s.sqlite(location)
	cfg.MustExist, cfg.NoMigrate = s.MustExist, s.NoMigrate
	cfg.Targets = s.databaseTargets
	st, err := sqlite.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// OpenDB opens the database at location (a postgres:// or postgresql://
// URL, which must exist, or a SQLite file path) as a *sql.DB for tools that
// write tables of their own, such as the example ledger's seed: not the
// checkpoint store, whose schema is not touched. A SQLite file is created
// unless s.MustExist (then a missing one wraps checkpoint.ErrNoDatabase);
// a PostgreSQL database is connected to once, its failures of
// checkpoint's backend-neutral kinds (checkpoint.ErrUnavailable, ...).
func OpenDB(ctx context.Context, location string, s Settings) (*sql.DB, error) {
	if IsURL(location) {
		return postgres.OpenDB(ctx, postgres.Config{URL: location, MaxConns: s.MaxConns, ConnectTimeout: s.ConnectTimeout,
			ApplicationName: s.ApplicationName})
	}
	if _, ok := otherScheme(location); ok {
		return nil, fmt.Errorf("stores: %s: no backend opens this kind of URL; use a postgres:// URL or a SQLite file path", Redact(location))
	}
	cfg := s.sqlite(location)
	cfg.MustExist = s.MustExist
	return sqlite.OpenTarget(ctx, cfg)
}

// postgres is s for a PostgreSQL store or target at url.
func (s Settings) postgres(url string) postgres.Config {
	return postgres.Config{
		URL: url, MaxConns: s.MaxConns, StatementTimeout: s.StatementTimeout, IdleInTxTimeout: s.IdleInTxTimeout, Lease: s.Lease,
		ConnectTimeout: s.ConnectTimeout, ApplicationName: s.ApplicationName, CallerClock: s.CallerClock,
		OwnTargetCredentials: s.OwnTargetCredentials,
	}
}

// sqlite is s for a SQLite store or target at path.
func (s Settings) sqlite(path string) sqlite.Config {
	return sqlite.Config{Path: path, Synchronous: s.Synchronous, BusyTimeout: s.BusyTimeout}
}

// fileTargets opens a PostgreSQL store's effect targets that are not
// PostgreSQL URLs: SQLite files.
func (s Settings) fileTargets(ctx context.Context, spec checkpoint.TargetSpec) (checkpoint.EffectTarget, error) {
	if _, ok := otherScheme(spec.Location); ok {
		return nil, fmt.Errorf("stores: effect target %s in %s: no backend opens this kind of URL; use a postgres:// URL or a SQLite file path",
			spec.Table.Name, Redact(spec.Location))
	}
	return sqlite.OpenFileTarget(ctx, s.sqlite(spec.Location), spec)
}

// databaseTargets opens a SQLite store's effect targets that are URLs:
// PostgreSQL databases.
func (s Settings) databaseTargets(ctx context.Context, spec checkpoint.TargetSpec) (checkpoint.EffectTarget, error) {
	if !IsURL(spec.Location) {
		return nil, fmt.Errorf("stores: effect target %s in %s: no backend opens this kind of URL; use a postgres:// URL or a SQLite file path",
			spec.Table.Name, Redact(spec.Location))
	}
	return postgres.OpenDatabaseTarget(ctx, s.postgres(spec.Location), spec)
}

// IsURL reports whether loc is a PostgreSQL database's URL (postgres:// or
// postgresql://, in any case); anything else is a SQLite file path.
func IsURL(loc string) bool { return postgres.IsURL(loc) }

// otherScheme returns the scheme of loc when loc is a URL of a scheme no
// backend opens (mysql://...): such a location is no file path either.
func otherScheme(loc string) (string, bool) {
	scheme, _, ok := strings.Cut(loc, "://")
	if !ok || scheme == "" || IsURL(loc) || strings.EqualFold(scheme, "file") {
		return "", false
	}
	for i, r := range scheme {
		letter := (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
		if !letter && (i == 0 || !(r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.')) {
			return "", false
		}
	}
	return scheme, true
}

// Redact returns loc for messages: a URL with its password hidden, a file
// path as it is.
func Redact(loc string) string { return checkpoint.RedactLocation(loc) }
