package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stepwise-run/stepwise/checkpoint"
)

// Config configures Open.
type Config struct {
	// URL names the server and database: postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?PARAMS],
	// or postgresql://. The usual libpq parameters apply (sslmode,
	// connect_timeout, and server settings such as search_path to keep
	// the tables in a schema of their own). Required.
	URL string
	// MaxConns is the size of the connection pool. Defaults to 4: one
	// writer at a time per run, plus reads (listings, streaming item
	// reads) that never wait for it.
	MaxConns int32
	// StatementTimeout cancels a statement that runs longer, with
	// ErrStatementTimeout; its transaction is rolled back. Zero leaves the
	// server's setting (usually none): a streaming read of a million items
	// can outlast any fixed limit.
	StatementTimeout time.Duration
	// IdleInTxTimeout makes the server end a session that sits inside a
	// transaction this long without sending anything: a runner paused or
	// cut off in the middle of InTx then releases the row locks it holds
	// (the run's, a partition's, the target rows of a chunk), so the
	// runner that takes its work over once the lease passes is not
	// blocked behind it (the paused one is fenced when it wakes).
	// Defaults to half of Lease (at least 1s) when Lease is set, else 60s;
	// negative turns it off. A shorter idle_in_transaction_session_timeout
	// in the URL is kept.
	IdleInTxTimeout time.Duration
	// LockTimeout makes a statement that waits longer for a row lock
	// fail with checkpoint.ErrLocked, a transient fault the runner tries
	// again, instead of waiting without end behind a stalled session.
	// Defaults to Lease when Lease is set, else none (the server's
	// setting); negative turns it off. A shorter lock_timeout in the URL
	// is kept.
	LockTimeout time.Duration
	// Lease is the lease the runners using this store take (the command
	// line's --lease), when known: the session timeouts above follow it,
	// so a paused process cannot hold locks past its lease.
	Lease time.Duration
	// ConnectTimeout bounds establishing one connection. Defaults to 10s.
	ConnectTimeout time.Duration
	// ApplicationName is shown in pg_stat_activity. Defaults to "stepwise".
	ApplicationName string
	// CallerClock computes leases and run times from the times the caller
	// passes (ClaimRequest.Now, Heartbeat's now and until, Ending.At)
	// instead of the server's now(): for tests that drive a fake clock.
	// Leave it false in production so clock skew between hosts cannot
	// shorten or stretch a lease.
	CallerClock bool
	// MustExist refuses a database that holds no Stepwise tables (in the
	// schema the URL's search_path names) with an error wrapping
	// checkpoint.ErrNoDatabase, instead of creating them: for commands
	// that only read, so a mistyped URL creates nothing. The database
	// itself is never created either way.
	MustExist bool
	// OwnTargetCredentials makes every effect target database this
	// store (or OpenDatabaseTarget) connects to take its password from
	// its own URL only (user:password@ or password=), never from
	// PGPASSWORD, PGPASSFILE or ~/.pgpass, or a service file: those are
	// the checkpoint store's. serve and worker set it, so that only the
	// targets their operator configured carry credentials, and only
	// those the operator gave each one.
	OwnTargetCredentials bool
	// NoMigrate refuses (ErrNeedsMigration) a database whose schema is
	// older than this binary's instead of migrating it: for callers that
	// only read, which must not change the database.
	NoMigrate bool
	// Targets opens an effect target whose TargetSpec.Location this
	// backend does not own (anything but a postgres:// or postgresql://
	// URL, such as a SQLite file path), with settings of the caller's
	// choosing. Nil refuses such locations with an error naming them.
	// checkpoint/stores fills it in.
	Targets func(ctx context.Context, spec checkpoint.TargetSpec) (checkpoint.EffectTarget, error)
}

// poolConfig validates c and builds the pgxpool configuration. Errors
// never echo the URL's password.
func (c Config) poolConfig() (*pgxpool.Config, error) {
	if c.URL == "" {
		return nil, errors.New("postgres: Config.URL is empty; give a postgres:// URL naming the server and database")
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		what := "is not a postgres:// or postgresql:// URL"
		if err != nil && IsURL(c.URL) {
			what = "does not parse (" + urlParseReason(err) + ")"
		}
		return nil, fmt.Errorf("%w: %s %s; write postgres://USER@HOST:PORT/DATABASE", ErrBadURL, checkpoint.RedactLocation(c.URL), what)
	}
	if c.MaxConns < 0 || c.StatementTimeout < 0 || c.ConnectTimeout < 0 {
		return nil, fmt.Errorf("postgres: Config has a negative MaxConns (%d), StatementTimeout (%s) or ConnectTimeout (%s)",
			c.MaxConns, c.StatementTimeout, c.ConnectTimeout)
	}
	pc, err := pgxpool.ParseConfig(c.URL)
	if err != nil {
		// pgx's parse errors redact the password themselves.
		return nil, fmt.Errorf("%w: %s: %w", ErrBadURL, checkpoint.RedactLocation(c.URL), err)
	}
	switch {
	case c.MaxConns > 0:
		pc.MaxConns = c.MaxConns
	case u.Query().Get("pool_max_conns") == "":
		pc.MaxConns = 4 // the URL's pool_max_conns, if any, stands
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = 10 * time.Second
	}
	if u.Query().Get("connect_timeout") == "" {
		pc.ConnConfig.ConnectTimeout = c.ConnectTimeout
	}
	rp := pc.ConnConfig.RuntimeParams
	if c.ApplicationName == "" {
		c.ApplicationName = "stepwise"
	}
	if rp["application_name"] == "" {
		rp["application_name"] = c.ApplicationName
	}
	if c.StatementTimeout > 0 {
		rp["statement_timeout"] = strconv.FormatInt(c.StatementTimeout.Milliseconds(), 10)
	}
	idle, lock := c.IdleInTxTimeout, c.LockTimeout
	if idle == 0 {
		idle = 60 * time.Second
		if c.Lease > 0 {
			idle = max(c.Lease/2, time.Second)
		}
	}
	if lock == 0 && c.Lease > 0 {
		lock = max(c.Lease, time.Second)
	}
	sessionTimeout(rp, "idle_in_transaction_session_timeout", idle)
	sessionTimeout(rp, "lock_timeout", lock)
	// Timestamps come back in UTC, as from the SQLite store.
	rp["timezone"] = "UTC"
	return pc, nil
}

// sessionTimeout sets the session setting name to d (in milliseconds)
// unless d is not positive or the URL set a shorter one of its own.
func sessionTimeout(rp map[string]string, name string, d time.Duration) {
	if d <= 0 {
		return
	}
	if own, ok := settingDuration(rp[name]); ok && own > 0 && own <= d {
		return
	}
	rp[name] = strconv.FormatInt(d.Milliseconds(), 10)
}

// settingDuration parses a PostgreSQL time setting as the server does: a
// bare number is milliseconds; else a number and one of the units us, ms,
// s, min, h, d.
func settingDuration(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseFloat(v, 64); err == nil {
		return time.Duration(n * float64(time.Millisecond)), true
	}
	units := []struct {
		suffix string
		unit   time.Duration
	}{{"us", time.Microsecond}, {"ms", time.Millisecond}, {"min", time.Minute}, {"s", time.Second}, {"h", time.Hour}, {"d", 24 * time.Hour}}
	for _, u := range units {
		if num, ok := strings.CutSuffix(v, u.suffix); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
			if err != nil {
				return 0, false
			}
			return time.Duration(n * float64(u.unit)), true
		}
	}
	return 0, false
}

// Store is the checkpoint store kept in a PostgreSQL database, shared by
// any number of runner processes.
type Store struct {
	pool  *pgxpool.Pool
	rdb   *sql.DB // read-only database/sql connections, for job code (ReadDB)
	cfg   Config
	where string   // "server HOST:PORT, database NAME": what errors name
	tsql  sync.Map // checkpoint.Table → *targetSQL, built once per table
}

// Store is a complete backend: the runner, workers and the command line
// use it as they use the SQLite store.
var _ checkpoint.Backend = (*Store)(nil)

// Open connects to the database cfg.URL names and brings its schema up to
// date. Its errors name the server and database and what is wrong.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	pc, err := cfg.poolConfig()
	if err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, where: describe(pc)}
	if s.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return nil, s.wrap("connect", err)
	}
	if err := s.pool.Ping(ctx); err != nil {
		s.pool.Close()
		return nil, s.wrap("connect", err)
	}
	if err := s.checkConnLimit(ctx); err != nil {
		s.pool.Close()
		return nil, err
	}
	if cfg.MustExist {
		var exists bool
		if err := s.pool.QueryRow(ctx, sqlSchemaTable).Scan(&exists); err != nil {
			s.pool.Close()
			return nil, s.wrap("read schema version", err)
		}
		if !exists {
			s.pool.Close()
			return nil, fmt.Errorf("%w: %s holds no Stepwise tables (none in the schemas of its search_path); nothing was created",
				checkpoint.ErrNoDatabase, s.where)
		}
	}
	if err := s.migrate(ctx); err != nil {
		s.pool.Close()
		return nil, err
	}
	s.rdb = openReader(pc)
	return s, nil
}

// minConns is how many connections a store needs at once: a run's write
// and its heartbeat beside it.
const minConns = 2

// sqlConnLimits reads the database's and the role's CONNECTION LIMIT
// (-1: none) and whether the role is a superuser (exempt from both).
const sqlConnLimits = `SELECT (SELECT datconnlimit FROM pg_database WHERE datname = current_database()), rolconnlimit, rolsuper
FROM pg_roles WHERE rolname = current_user`

// checkConnLimit refuses, before anything is written, a database or role
// whose CONNECTION LIMIT leaves fewer than minConns connections: the
// first write would work, and the heartbeat or read beside it fail the
// run midway.
func (s *Store) checkConnLimit(ctx context.Context) error {
	var db, role int32
	var super bool
	if err := s.pool.QueryRow(ctx, sqlConnLimits).Scan(&db, &role, &super); err != nil {
		return s.wrap("read the connection limits", err)
	}
	what, limit := "database", db
	if role >= 0 && (db < 0 || role < db) {
		what, limit = "role", role
	}
	if super || limit < 0 || limit >= minConns {
		return nil
	}
	return &Error{Kind: ErrTooManyConnections, Where: s.where, Op: "connect",
		Detail: fmt.Sprintf("the %s's CONNECTION LIMIT is %d; a store needs %d connections at once (a write and its heartbeat)", what, limit, minConns),
		Hint:   fmt.Sprintf("raise it (ALTER %s ... CONNECTION LIMIT %d or more); nothing was written", strings.ToUpper(what), minConns+2)}
}

// describe names the server and database of a pool configuration.
func describe(pc *pgxpool.Config) string {
	cc := pc.ConnConfig
	host := cc.Host
	if host == "" || host[0] == '/' {
		host = "socket " + host
	}
	return fmt.Sprintf("server %s:%d, database %s", host, cc.Port, cc.Database)
}

// Where names the server and database of the store, as its errors do: for
// messages of callers. It never contains the password.
func (s *Store) Where() string { return s.where }

// Pool returns the store's connection pool, for benchmarks' raw baselines
// and tests. Job code never needs it.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// ReadDB returns read-only database/sql connections to the store's
// database (default_transaction_read_only is on), beside the store's own
// pool so a job iterating rows never holds a connection a checkpoint
// needs. Closed with the store.
func (s *Store) ReadDB() *sql.DB { return s.rdb }

// Close releases the pool's connections and those of ReadDB.
func (s *Store) Close() error {
	err := s.rdb.Close()
	s.pool.Close()
	return err
}

func (s *Store) wrap(op string, err error) error { return wrapError(s.where, op, err) }

// clock returns t as a statement's time parameter: nil (the statement
// uses the server's now()) unless the store runs on the caller's clock.
func (s *Store) clock(t time.Time) any {
	if !s.cfg.CallerClock || t.IsZero() {
		return nil
	}
	return t
}

// ts returns t as a nullable timestamptz parameter: the zero time is NULL.
func ts(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// urlParseReason is why url.Parse refused a URL, without the URL (which
// may hold a password).
func urlParseReason(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return "malformed"
}
