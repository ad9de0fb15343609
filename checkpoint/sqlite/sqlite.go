package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Synchronous levels for Config.Synchronous.
const (
	// SyncFull makes every commit durable across power loss (one fsync per
	// commit). The default: a step reported done stays done.
	SyncFull = "full"
	// SyncNormal skips the fsync at commit in WAL mode: several times
	// faster, and a power loss (not a process crash) can lose the last
	// commits. Same-store effects are lost together with their checkpoint,
	// so a rerun redoes both consistently; separate-store effects are still
	// detected through the target's applied-effects table.
	SyncNormal = "normal"
)

// Config configures Open.
type Config struct {
	// Path of the SQLite database file. Created if absent (unless
	// MustExist); its directory must exist. Required.
	Path string
	// MustExist refuses to create a missing database file: opening fails
	// with an error wrapping ErrNoDatabase that names the file's absolute
	// path, and nothing is created. For callers that only read (listings,
	// audits, dry runs) and for effect targets, whose tables must already
	// be there. Defaults to false: create the file.
	MustExist bool
	// NoMigrate refuses (ErrNeedsMigration) an existing database whose
	// schema is older than this binary's instead of migrating it: for
	// callers that only read, which must not change the file.
	NoMigrate bool
	// Synchronous is SyncFull or SyncNormal. Defaults to SyncFull.
	Synchronous string
	// BusyTimeout is how long a write waits for another process's write
	// transaction before failing with ErrLocked. Defaults to 5s.
	BusyTimeout time.Duration
	// Targets opens an effect target whose TargetSpec.Location this
	// backend does not own (a URL, such as postgres://...; a SQLite store
	// opens file paths), with settings of the caller's choosing. Nil
	// refuses such locations with an error naming them. checkpoint/stores
	// fills it in.
	Targets func(ctx context.Context, spec checkpoint.TargetSpec) (checkpoint.EffectTarget, error)
}

func (c *Config) validate() error {
	if c.Path == "" {
		return errors.New("checkpoint: Config.Path is empty; give the database file path")
	}
	switch c.Synchronous {
	case "":
		c.Synchronous = SyncFull
	case SyncFull, SyncNormal:
	default:
		return fmt.Errorf("checkpoint: Config.Synchronous is %q; use %q or %q", c.Synchronous, SyncFull, SyncNormal)
	}
	if c.BusyTimeout < 0 {
		return fmt.Errorf("checkpoint: Config.BusyTimeout is %s; it cannot be negative", c.BusyTimeout)
	}
	if c.BusyTimeout == 0 {
		c.BusyTimeout = 5 * time.Second
	}
	return nil
}

// Store is the checkpoint.Store kept in one SQLite file: WAL journal, one writer
// connection, BEGIN IMMEDIATE transactions and a busy timeout.
type Store struct {
	db   *sql.DB // the one writer connection
	rdb  *sql.DB // a pool of query-only connections for reads
	path string
	cfg  Config
	stmt preparedStatements

	tmu sync.Mutex
	// tables and readTables are the same-store effect target tables
	// opened so far, prepared on the writer and on the read pool.
	tables, readTables map[checkpoint.Table]*tableHandle
}

var (
	_ checkpoint.Store   = (*Store)(nil)
	_ checkpoint.Backend = (*Store)(nil)
)

// DSN returns the modernc.org/sqlite data source name Open uses for cfg:
// WAL, the busy timeout, the synchronous level and immediate transactions.
// Benchmarks use it so their raw baselines run with the very same pragmas.
func DSN(cfg Config) (string, error) {
	return dsn(cfg, false)
}

// dsn builds the data source name; readOnly adds query_only, for the read
// pool.
func dsn(cfg Config, readOnly bool) (string, error) {
	if err := cfg.validate(); err != nil {
		return "", err
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", cfg.BusyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous("+cfg.Synchronous+")")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Set("_txlock", "immediate")
	if readOnly {
		q.Add("_pragma", "query_only(1)")
		q.Set("_txlock", "deferred")
	}
	if readOnly || cfg.MustExist {
		// SQLite itself refuses to create the file, so it cannot appear
		// even if it vanishes after statDB looked.
		q.Set("mode", "rw")
	}
	// The path is escaped so ?, # and % in it name the file, not URI parts.
	return "file:" + pathEscaper.Replace(cfg.Path) + "?" + q.Encode(), nil
}

var pathEscaper = strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23")

// readPoolSize is how many read connections a store keeps. Reads never wait
// for the writer connection, so a job iterating query results can run steps
// inside the loop, and listing commands read while a runner writes.
const readPoolSize = 4

// Open opens (creating if needed) the checkpoint database at cfg.Path and
// brings its schema up to date. Its errors name the file and what to do.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// Absolute from here on: the store's path names its file in messages
	// and decides "same store" for targets, whatever directory the
	// process moves to later.
	if abs, err := filepath.Abs(cfg.Path); err == nil && !strings.HasPrefix(cfg.Path, "file:") && cfg.Path != ":memory:" {
		cfg.Path = abs
	}
	path := cfg.Path
	if _, err := statDB(path, cfg.MustExist); err != nil {
		return nil, err
	}
	dsn, err := DSN(cfg)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	s := &Store{db: db, path: path, cfg: cfg, tables: map[checkpoint.Table]*tableHandle{}, readTables: map[checkpoint.Table]*tableHandle{}}
	if err := s.migrateRetrying(ctx); err != nil {
		db.Close()
		return nil, err
	}
	if err := s.prepare(ctx); err != nil {
		db.Close()
		return nil, s.wrap("prepare statements", err)
	}
	if s.rdb, err = openReadPool(ctx, cfg); err != nil {
		s.stmt.close()
		db.Close()
		return nil, err
	}
	if s.stmt.fence, err = s.rdb.PrepareContext(ctx, sqlRunFence); err == nil {
		s.stmt.itemRange, err = s.rdb.PrepareContext(ctx, sqlItemKeysRange)
	}
	if err != nil {
		s.Close()
		return nil, s.wrap("prepare statements", err)
	}
	return s, nil
}

// statDB checks the database file's directory exists and the file, if
// present, is a writable regular file; with mustExist a missing file is an
// ErrNoDatabase. Errors name absolute paths.
func statDB(path string, mustExist bool) (os.FileInfo, error) {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	dir := filepath.Dir(path)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("%w: %s (for database %s); create it or choose another path", checkpoint.ErrNoDirectory, dir, path)
	}
	st, err := os.Stat(path)
	if mustExist {
		if err := missingDB(path, err); err != nil {
			return nil, err
		}
	}
	if err != nil {
		return nil, nil
	}
	if st.IsDir() {
		return nil, fmt.Errorf("%w: %s is a directory; give a file path", checkpoint.ErrNotDatabase, path)
	}
	if st.Mode().Perm()&0o222 == 0 {
		return nil, fmt.Errorf("%w: %s has mode %s; make it writable (chmod u+w) or use a writable copy",
			checkpoint.ErrReadOnly, path, st.Mode().Perm())
	}
	return st, nil
}

// missingDB turns statErr, from os.Stat(path), into an ErrNoDatabase
// naming path's absolute path when the file does not exist.
func missingDB(path string, statErr error) error {
	if !errors.Is(statErr, fs.ErrNotExist) {
		return nil
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return fmt.Errorf("%w: %s (nothing was created)", checkpoint.ErrNoDatabase, path)
}

// migrateRetrying migrates, retrying while another process holds the lock,
// for about the busy timeout in all. Switching a brand-new file to WAL
// fails at once with SQLITE_BUSY instead of waiting for the busy timeout
// when several processes create the same database together, so Open
// retries such quick refusals every few milliseconds; a try that itself
// waited out the busy timeout ends the retries. (Each try waits up to the
// busy timeout, so retrying a fixed number of times would wait that many
// busy timeouts.) Worst case, a try begun just before the budget ends, it
// gives up after twice the busy timeout.
func (s *Store) migrateRetrying(ctx context.Context) error {
	const pause = 10 * time.Millisecond
	budget := time.NewTimer(s.cfg.BusyTimeout)
	defer budget.Stop()
	for {
		err := s.migrate(ctx)
		if !errors.Is(err, checkpoint.ErrLocked) {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-budget.C:
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// Path returns the database file's path.
func (s *Store) Path() string { return s.path }

// DB returns the writer handle (one connection), for same-store effect
// targets and tests that write the tables directly. Never keep a query's
// rows open on it while a step commits: reads belong on ReadDB.
func (s *Store) DB() *sql.DB { return s.db }

// ReadDB returns the pool of query-only connections.
func (s *Store) ReadDB() *sql.DB { return s.rdb }

// Close releases the database.
func (s *Store) Close() error {
	s.stmt.close()
	s.tmu.Lock()
	for _, m := range []map[checkpoint.Table]*tableHandle{s.tables, s.readTables} {
		for k, h := range m {
			h.Close()
			delete(m, k)
		}
	}
	s.tmu.Unlock()
	s.rdb.Close()
	return s.db.Close()
}

// openReadPool opens query-only connections to an existing database.
func openReadPool(ctx context.Context, cfg Config) (*sql.DB, error) {
	d, err := dsn(cfg, true)
	if err != nil {
		return nil, err
	}
	rdb, err := sql.Open("sqlite", d)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: open %s for reading: %w", cfg.Path, err)
	}
	rdb.SetMaxOpenConns(readPoolSize)
	rdb.SetMaxIdleConns(readPoolSize)
	if err := rdb.PingContext(ctx); err != nil {
		rdb.Close()
		return nil, wrapSQLiteError(cfg.Path, cfg.BusyTimeout, "open for reading", err)
	}
	return rdb, nil
}

// wrap turns driver errors into the package's sentinels, naming the file.
func (s *Store) wrap(op string, err error) error {
	return wrapSQLiteError(s.path, s.cfg.BusyTimeout, op, err)
}

func wrapSQLiteError(path string, busy time.Duration, op string, err error) error {
	if err == nil {
		return nil
	}
	var se *msqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_NOTADB:
			return fmt.Errorf("%w: %s (%s): the file is not a Stepwise checkpoint database", checkpoint.ErrNotDatabase, path, op)
		case sqlite3.SQLITE_READONLY:
			return fmt.Errorf("%w: %s (%s): %v; make the file and its directory writable", checkpoint.ErrReadOnly, path, op, err)
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			return fmt.Errorf("%w: %s (%s): another process holds it (busy timeout %s); "+
				"retry when it is done, or wait longer", checkpoint.ErrLocked, path, op, busy)
		case sqlite3.SQLITE_CANTOPEN:
			return fmt.Errorf("checkpoint: cannot open %s (%s): %w", path, op, err)
		case sqlite3.SQLITE_FULL:
			return fmt.Errorf("checkpoint: disk full writing %s (%s): %w; nothing of this write was kept", path, op, err)
		case sqlite3.SQLITE_CORRUPT:
			return fmt.Errorf("checkpoint: database %s is corrupt (%s): %w; restore it from a backup", path, op, err)
		}
	}
	// Errors of this package (fencing, conflicts, mismatches) and the
	// caller's own pass through unchanged.
	return err
}

// timeFormat is RFC 3339 in UTC with a fixed width, so stored times sort as
// text and read plainly in the sqlite3 shell.
const timeFormat = "2006-01-02T15:04:05.000000Z"

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(timeFormat)
}

func parseTime(s sql.NullString) time.Time {
	if !s.Valid || s.String == "" {
		return time.Time{}
	}
	t, err := time.Parse(timeFormat, s.String)
	if err != nil {
		return time.Time{}
	}
	return t
}
