package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stepwise-run/stepwise/checkpoint"
)

// targetConns is the pool size of a separate target: one writer at a
// time per attempt, plus a View that never waits for it.
const targetConns = 2

const (
	// sqlIdentity names what decides "same store": the database and the
	// relation the table's name resolves to under the session's
	// search_path, the server's address and port as it reports them (NULL
	// over a Unix socket), and whether this role may read the cluster's
	// system identifier.
	sqlIdentity = `SELECT current_database(), host(inet_server_addr()), inet_server_port(),
       pg_postmaster_start_time(), to_regclass($1::text)::oid::bigint,
       has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE')`
	sqlSystemID = `SELECT system_identifier FROM pg_catalog.pg_control_system()`
	// sqlHasApplied tells whether the applied-effects table resolves
	// under the session's search_path.
	sqlHasApplied = `SELECT to_regclass('stepwise_applied') IS NOT NULL`
	// sqlCreateApplied is migration 0001's stepwise_applied, for a
	// separate target database.
	sqlCreateApplied = `CREATE TABLE IF NOT EXISTS stepwise_applied (
    effect_id  text COLLATE "C" PRIMARY KEY,
    run_id     text COLLATE "C" NOT NULL,
    step_id    text COLLATE "C" NOT NULL,
    applied_at timestamptz NOT NULL
)`
	// sqlAppliedLock serializes the creation of stepwise_applied by
	// runners opening one target database at once (CREATE TABLE IF NOT
	// EXISTS alone can fail on the catalog's unique index).
	sqlAppliedLock = `SELECT pg_advisory_xact_lock(hashtextextended('stepwise_applied', 0))`
)

// identity is what a session reports of where it is.
type identity struct {
	db       string
	addr     *string // nil over a Unix socket
	port     *int32
	started  time.Time // the server process's start (pg_postmaster_start_time())
	relation *int64    // nil when the table does not resolve
	sysid    *int64    // nil when the role may not read pg_control_system()
}

// identify reads the identity of the session q runs on, for table.
func identify(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, table checkpoint.Table) (identity, error) {
	var id identity
	var mayRead bool
	name := pgx.Identifier{table.Name}.Sanitize()
	if err := q.QueryRow(ctx, sqlIdentity, name).Scan(&id.db, &id.addr, &id.port, &id.started, &id.relation, &mayRead); err != nil {
		return id, err
	}
	if mayRead {
		var v int64
		if err := q.QueryRow(ctx, sqlSystemID).Scan(&v); err != nil {
			return id, err
		}
		id.sysid = &v
	}
	return id, nil
}

// sameStore decides whether d's database is the store's own and its
// table the same relation: the same cluster (the system identifier of
// pg_control_system() when both sessions may read it; otherwise the
// server address and port as the server reports them and the moment its
// server process started, so two clusters behind one address (a proxy,
// NAT) are told apart, and a Unix socket is never the same), the same
// database (current_database()), and the table's name
// resolving to the same relation (its oid) under both sessions'
// search_path. Names and spellings of the URL never decide.
func (s *Store) sameStore(ctx context.Context, d *dbTarget, table checkpoint.Table) (bool, error) {
	ours, err := identify(ctx, s.pool, table)
	if err != nil {
		return false, s.wrap("identify the checkpoint database", err)
	}
	theirs, err := identify(ctx, d.pool, table)
	if err != nil {
		return false, d.wrap("identify the effect target's database", err)
	}
	return sameIdentity(ours, theirs), nil
}

// sameIdentity is sameStore's rule on two identities.
func sameIdentity(a, b identity) bool {
	eq64 := func(x, y *int64) bool { return x != nil && y != nil && *x == *y }
	cluster := false
	switch {
	case a.sysid != nil && b.sysid != nil:
		cluster = *a.sysid == *b.sysid
	default:
		cluster = a.addr != nil && b.addr != nil && *a.addr == *b.addr &&
			a.port != nil && b.port != nil && *a.port == *b.port &&
			!a.started.IsZero() && a.started.Equal(b.started)
	}
	return cluster && a.db == b.db && eq64(a.relation, b.relation)
}

// dbTarget is an effect target table in a database of its own (not the
// checkpoint database): its own small pool, effects committed in its own
// transactions, an applied-effects table beside the table.
type dbTarget struct {
	pool     *pgxpool.Pool
	rdb      *sql.DB
	table    checkpoint.Table
	sql      *targetSQL
	readOnly bool
	where    string // server and database, as errors name them
	shown    string // the location's URL without the password
}

var _ checkpoint.EffectTarget = (*dbTarget)(nil)

// OpenDatabaseTarget opens spec.Table in the database spec.Location (a
// postgres:// or postgresql:// URL) as a separate effect target, with
// cfg's settings but its URL (statement, idle-in-transaction and connect
// timeouts, application name); its pool holds at most 2 connections. It
// checks the table and its columns, and creates the applied-effects table
// stepwise_applied in the location's first search_path schema if it is
// missing, unless spec.ReadOnly (which writes nothing). The database must
// exist: a missing one is an error wrapping checkpoint.ErrNoDatabase and
// ErrNoDatabase. For a backend whose own location is not a PostgreSQL
// database (a SQLite store's Config.Targets); a PostgreSQL store decides
// by itself whether a URL is its own database.
func OpenDatabaseTarget(ctx context.Context, cfg Config, spec checkpoint.TargetSpec) (checkpoint.EffectTarget, error) {
	if err := spec.Table.Validate(); err != nil {
		return nil, err
	}
	cfg.URL = spec.Location
	d, err := openDatabase(ctx, cfg, spec)
	if err != nil {
		return nil, err
	}
	if err := d.prepare(ctx); err != nil {
		d.pool.Close()
		return nil, err
	}
	return d, nil
}

// openDatabase connects to the location of cfg.URL and checks the table;
// prepare finishes a separate target.
func openDatabase(ctx context.Context, cfg Config, spec checkpoint.TargetSpec) (*dbTarget, error) {
	cfg.MaxConns = targetConns
	pc, err := cfg.poolConfig()
	if err != nil {
		return nil, fmt.Errorf("postgres: effect target %s: %w", spec.Table.Name, err)
	}
	if cfg.OwnTargetCredentials {
		// Whatever the environment, the passfile or a service file gave
		// is dropped: the URL's own password, or none.
		pc.ConnConfig.Password = urlPassword(cfg.URL)
	}
	d := &dbTarget{table: spec.Table, sql: newTargetSQL(spec.Table), readOnly: spec.ReadOnly,
		where: describe(pc), shown: redactURL(cfg.URL)}
	if d.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return nil, d.wrap("connect", err)
	}
	if err := checkTableExists(ctx, d.pool, spec.Table); err != nil {
		d.pool.Close()
		return nil, d.wrap("open "+spec.Table.String(), err)
	}
	d.rdb = openReader(pc)
	return d, nil
}

// prepare creates the applied-effects table when it is missing and the
// target is written to.
func (d *dbTarget) prepare(ctx context.Context) error {
	if d.readOnly {
		return nil
	}
	var ok bool
	if err := d.pool.QueryRow(ctx, sqlHasApplied).Scan(&ok); err != nil {
		return d.wrap("look for stepwise_applied", err)
	}
	if ok {
		return nil
	}
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlAppliedLock); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sqlCreateApplied)
		return err
	})
	return d.wrap("create stepwise_applied beside "+d.table.Name, err)
}

// wrap maps a driver error as the store does, naming the target's
// location.
func (d *dbTarget) wrap(op string, err error) error {
	return wrapError(d.where, "effect target "+d.shown+": "+op, err)
}

// Same implements checkpoint.EffectTarget: never, its database is not the
// checkpoint's.
func (d *dbTarget) Same() bool { return false }

// ReadDB returns read-only database/sql connections to the target's
// database, for job code that reads its own tables there.
func (d *dbTarget) ReadDB() *sql.DB { return d.rdb }

// Update implements checkpoint.EffectTarget: one read-write transaction
// in which reads lock the rows they read, as in the checkpoint's.
func (d *dbTarget) Update(ctx context.Context, fn func(checkpoint.Target) error) error {
	if d.readOnly {
		return fmt.Errorf("postgres: effect target %s in %s was opened read-only", d.table, d.shown)
	}
	return d.run(ctx, pgx.TxOptions{AccessMode: pgx.ReadWrite}, true, "write "+d.table.Name, fn)
}

// View implements checkpoint.EffectTarget: a read-only transaction that
// takes no row locks.
func (d *dbTarget) View(ctx context.Context, fn func(checkpoint.Target) error) error {
	return d.run(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly}, false, "read "+d.table.Name, fn)
}

// run runs fn in one transaction and commits it if fn and every statement
// succeeded.
func (d *dbTarget) run(ctx context.Context, opts pgx.TxOptions, lock bool, op string, fn func(checkpoint.Target) error) error {
	tx, err := d.pool.BeginTx(ctx, opts)
	if err != nil {
		return d.wrap(op, err)
	}
	defer tx.Rollback(ctx)
	var failed error
	g := txTarget(ctx, tx, d.table, d.sql, lock, func(err error) error {
		if failed == nil {
			failed = err
		}
		return err
	})
	g.mayLackApplied = d.readOnly
	g.lockEffects = lock
	if err := fn(g); err != nil {
		return d.wrap(op, err)
	}
	if failed != nil {
		// A statement failed, aborting the transaction: fn went on
		// regardless, and nothing of it may commit.
		return d.wrap(op, failed)
	}
	if err := tx.Commit(ctx); err != nil {
		return d.wrap("commit: "+op, err)
	}
	return nil
}

// Close implements checkpoint.EffectTarget: the target's pool and ReadDB
// connections.
func (d *dbTarget) Close() error {
	err := d.rdb.Close()
	d.pool.Close()
	return err
}

// urlPassword is the password a postgres:// URL holds itself, in its user
// information or a password= parameter; "" when it holds none.
func urlPassword(loc string) string {
	u, err := url.Parse(loc)
	if err != nil {
		return ""
	}
	if pw, ok := u.User.Password(); ok {
		return pw
	}
	return u.Query().Get("password")
}
