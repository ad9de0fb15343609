package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
)

// This file is the SQLite backend of the benchmark: stores in files of a
// temporary directory, and the raw baselines, hand-written database/sql
// on modernc's driver with the store's very DSN (sqlite.DSN: WAL, the
// same synchronous level, immediate transactions), one connection like
// the store's writer, prepared statements, and tables created from the
// SQL the store's migrations left in sqlite_master.

// The raw baselines' SQL: what a careful engineer writes by hand.
const (
	sqlTableDDL = `SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?`
	// sqlRawStep is the row steps.Do writes for a completed step.
	sqlRawStep = `INSERT INTO steps (run_id, step_id, status, output, input_hash, error, tries, attempt, started_at, finished_at)
VALUES (?, ?, 'completed', ?, '', '', 1, 1, ?, ?)`
	sqlRawStepCount   = `SELECT count(*) FROM steps WHERE run_id = ?`
	sqlRawStateInit   = `INSERT INTO stepwise_state (key, value, version) VALUES (?, 0, 0)`
	sqlRawStateRead   = `SELECT value, version FROM stepwise_state WHERE key = ?`
	sqlRawStateCAS    = `UPDATE stepwise_state SET value = ?, version = ? WHERE key = ? AND version = ?`
	sqlRawTransfers   = `SELECT id, from_account, to_account, amount FROM transfers WHERE business_date = ? AND id > ? ORDER BY id LIMIT ?`
	sqlRawAccountRead = `SELECT balance, version FROM accounts WHERE id = ?`
	sqlRawAccountCAS  = `UPDATE accounts SET balance = ?, version = ? WHERE id = ? AND version = ?`
	sqlRawItem        = `INSERT INTO items (run_id, step_id, item_key, status, output, error, attempt, chunk) VALUES (?, 'post', ?, ?, ?, ?, 1, '')`
	sqlRawItemKeys    = `SELECT item_key, status FROM items WHERE run_id = ? AND step_id = 'post'`
	sqlRawRejected    = `SELECT count(*) FROM items WHERE status = 'rejected'`
	// The queue-claim baseline's table, claim, finish and count.
	sqlRawQueueTable = `CREATE TABLE raw_queue (
    id           TEXT PRIMARY KEY,
    status       TEXT NOT NULL,
    priority     INTEGER NOT NULL DEFAULT 0,
    available_at TEXT NOT NULL,
    owner        TEXT,
    lease_until  TEXT,
    attempts     INTEGER NOT NULL DEFAULT 0
)`
	sqlRawQueueIndex = `CREATE INDEX raw_queue_due ON raw_queue (priority DESC, available_at, id) WHERE status = 'queued'`
	sqlRawQueueSeed  = `INSERT INTO raw_queue (id, status, available_at) VALUES (?, 'queued', ?)`
	sqlRawClaim      = `UPDATE raw_queue SET status = 'running', owner = ?1, lease_until = ?3, attempts = attempts + 1
WHERE id = (SELECT id FROM raw_queue WHERE status = 'queued' AND available_at <= ?2
            ORDER BY priority DESC, available_at, id LIMIT 1)
RETURNING id`
	sqlRawFinish = `UPDATE raw_queue SET status = 'done', owner = NULL, lease_until = NULL WHERE id = ? AND status = 'running'`
	sqlRawDone   = `SELECT count(*) FROM raw_queue WHERE status = 'done'`
)

const sqliteTimeFormat = "2006-01-02T15:04:05.000000Z"

// sqliteBackend keeps every database in one temporary directory.
type sqliteBackend struct {
	dir     string
	sync    string
	closers []io.Closer
}

func newSQLite(cfg Config) (*sqliteBackend, error) {
	sync := cfg.Synchronous
	if sync == "" {
		sync = sqlite.SyncFull
	}
	if sync != sqlite.SyncFull && sync != sqlite.SyncNormal {
		return nil, fmt.Errorf("%w: synchronous %q (use %q or %q)", ErrBadConfig, sync, sqlite.SyncFull, sqlite.SyncNormal)
	}
	dir, err := os.MkdirTemp(cfg.Dir, "stepwise-bench-")
	if err != nil {
		return nil, fmt.Errorf("%w: temporary directory: %w", ErrBadConfig, err)
	}
	return &sqliteBackend{dir: dir, sync: sync}, nil
}

func (s *sqliteBackend) kind() string                       { return StoreSQLite }
func (s *sqliteBackend) where() string                      { return s.dir }
func (s *sqliteBackend) synchronous(context.Context) string { return s.sync }
func (s *sqliteBackend) durability(sync string) string      { return "synchronous=" + sync }
func (s *sqliteBackend) goals() goals                       { return sqliteGoals }
func (s *sqliteBackend) config(name string) sqlite.Config {
	return sqlite.Config{Path: filepath.Join(s.dir, name), Synchronous: s.sync}
}
func (s *sqliteBackend) track(c io.Closer) { s.closers = append(s.closers, c) }
func (s *sqliteBackend) chunkNote() string {
	return "raw: per chunk one transaction reading the page of transfers, per transfer 2 balance reads, 2 version-CAS UPDATEs and 1 item INSERT"
}

func (s *sqliteBackend) close(context.Context) error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		errs = append(errs, s.closers[i].Close())
	}
	s.closers = nil
	errs = append(errs, os.RemoveAll(s.dir))
	return errors.Join(errs...)
}

func (s *sqliteBackend) store(ctx context.Context, name string) (*store, error) {
	st, err := sqlite.Open(ctx, s.config(name+".db"))
	if err != nil {
		return nil, err
	}
	s.track(st)
	return &store{Backend: st, db: st.DB(), read: st.ReadDB()}, nil
}

// openRaw opens a database for a hand-written baseline with the store's
// very DSN and, like the store's writer, one connection. Its tables are
// created from the SQL the store's migrations left in schemaFrom's
// sqlite_master, so columns, keys and WITHOUT ROWID are identical.
func (s *sqliteBackend) openRaw(ctx context.Context, name string, schemaFrom *sql.DB, tables ...string) (*sql.DB, error) {
	dsn, err := sqlite.DSN(s.config(name))
	if err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	s.track(db)
	for _, table := range tables {
		var ddl string
		if err := schemaFrom.QueryRowContext(ctx, sqlTableDDL, table).Scan(&ddl); err != nil {
			return nil, fmt.Errorf("read the schema of %s: %w", table, err)
		}
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			return nil, fmt.Errorf("create raw %s: %w", table, err)
		}
	}
	return db, nil
}

// prepare prepares each query on db, closed with the backend.
func (s *sqliteBackend) prepare(ctx context.Context, db *sql.DB, qs ...string) ([]*sql.Stmt, error) {
	out := make([]*sql.Stmt, len(qs))
	for i, q := range qs {
		st, err := db.PrepareContext(ctx, q)
		if err != nil {
			return nil, err
		}
		s.track(st)
		out[i] = st
	}
	return out, nil
}

// rawTx runs fn in one raw transaction and commits it.
func rawTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// casExec runs a compare-and-set UPDATE and fails unless it hit one row.
func casExec(ctx context.Context, st *sql.Stmt, key string, value, version int64) error {
	res, err := st.ExecContext(ctx, value, version+1, key, version)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("raw: the version of %s moved", key)
	}
	return nil
}

// sqliteSteps is the per-step baseline: one prepared INSERT per
// transaction.
type sqliteSteps struct {
	db       *sql.DB
	ins, cnt *sql.Stmt
}

func (s *sqliteBackend) rawSteps(ctx context.Context, name string, ours *store) (rawSteps, error) {
	db, err := s.openRaw(ctx, name+"-raw.db", ours.db, "steps")
	if err != nil {
		return nil, err
	}
	sts, err := s.prepare(ctx, db, sqlRawStep, sqlRawStepCount)
	if err != nil {
		return nil, err
	}
	return &sqliteSteps{db: db, ins: sts[0], cnt: sts[1]}, nil
}

func (r *sqliteSteps) insert(ctx context.Context, runID, id string, output []byte) error {
	now := time.Now().UTC().Format(sqliteTimeFormat)
	return rawTx(ctx, r.db, func(tx *sql.Tx) error {
		_, err := tx.StmtContext(ctx, r.ins).ExecContext(ctx, runID, id, output, now, now)
		return err
	})
}

func (r *sqliteSteps) count(ctx context.Context, runID string) (int, error) {
	var n int
	err := r.cnt.QueryRowContext(ctx, runID).Scan(&n)
	return n, err
}

// sqliteEffects is the per-step effect baseline: prepared read, CAS and
// insert in one transaction.
type sqliteEffects struct {
	db                *sql.DB
	read, cas, insert *sql.Stmt
}

func (s *sqliteBackend) rawEffects(ctx context.Context, name string, ours *store, keys []string) (rawEffects, error) {
	db, err := s.openRaw(ctx, name+"-raw.db", ours.db, "steps", "stepwise_state")
	if err != nil {
		return nil, err
	}
	for _, k := range keys {
		if _, err := db.ExecContext(ctx, sqlRawStateInit, k); err != nil {
			return nil, err
		}
	}
	sts, err := s.prepare(ctx, db, sqlRawStateRead, sqlRawStateCAS, sqlRawStep)
	if err != nil {
		return nil, err
	}
	return &sqliteEffects{db: db, read: sts[0], cas: sts[1], insert: sts[2]}, nil
}

func (r *sqliteEffects) step(ctx context.Context, runID, id, key string, output []byte) error {
	now := time.Now().UTC().Format(sqliteTimeFormat)
	return rawTx(ctx, r.db, func(tx *sql.Tx) error {
		var value, version int64
		if err := tx.StmtContext(ctx, r.read).QueryRowContext(ctx, key).Scan(&value, &version); err != nil {
			return err
		}
		if err := casExec(ctx, tx.StmtContext(ctx, r.cas), key, value+1, version); err != nil {
			return err
		}
		_, err := tx.StmtContext(ctx, r.insert).ExecContext(ctx, runID, id, output, now, now)
		return err
	})
}

func (r *sqliteEffects) stateSum(ctx context.Context) (int64, error) {
	var n int64
	err := r.db.QueryRowContext(ctx, sqlStateSum).Scan(&n)
	return n, err
}

// settleSides seeds the raw side's ledger, copies the file for ours (Seed
// is reproducible, a copy is just faster) and opens both.
func (s *sqliteBackend) settleSides(ctx context.Context, name string, seed seedFunc) (*store, rawSettler, error) {
	rawName := name + "-raw.db"
	ledger, err := sqlite.OpenTarget(ctx, s.config(rawName))
	if err != nil {
		return nil, nil, err
	}
	err = seed(ctx, ledger)
	if cerr := ledger.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, nil, err
	}
	if err := copyDB(filepath.Join(s.dir, rawName), filepath.Join(s.dir, name+".db")); err != nil {
		return nil, nil, err
	}
	st, err := s.store(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	db, err := s.openRaw(ctx, rawName, st.db, "items")
	if err != nil {
		return nil, nil, err
	}
	sts, err := s.prepare(ctx, db, sqlRawTransfers, sqlRawAccountRead, sqlRawAccountCAS, sqlRawItem)
	if err != nil {
		return nil, nil, err
	}
	return st, &sqliteSettler{db: db, page: sts[0], read: sts[1], cas: sts[2], item: sts[3],
		runID: jobs.RunID(settlement.Job.Name(), benchDate)}, nil
}

// copyDB copies a closed SQLite database file (no WAL left beside it).
func copyDB(from, to string) error {
	if _, err := os.Stat(from + "-wal"); err == nil {
		return fmt.Errorf("copy %s: it still has a WAL file", from)
	}
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// sqliteSettler is the hand-written settlement: prepared statements on a
// handle with the store's DSN, one transaction per chunk, per transfer
// two reads, two CAS updates and an item insert.
type sqliteSettler struct {
	db                    *sql.DB
	page, read, cas, item *sql.Stmt
	runID                 string
	out                   []byte
	rawPage
}

// chunk settles the next Chunk transfers in one transaction: per
// transfer, read both balances and versions, reject an overdraft (its
// item recorded as rejected), else two version-CAS UPDATEs, and the
// item's checkpoint with its output (the amount).
func (rs *sqliteSettler) chunk(ctx context.Context) (bool, error) {
	err := rawTx(ctx, rs.db, func(tx *sql.Tx) error {
		rows, err := tx.StmtContext(ctx, rs.page).QueryContext(ctx, benchDate, rs.after, Chunk)
		if err != nil {
			return err
		}
		if err := errors.Join(rs.fill(rows), rows.Close()); err != nil {
			return err
		}
		read, cas, item := tx.StmtContext(ctx, rs.read), tx.StmtContext(ctx, rs.cas), tx.StmtContext(ctx, rs.item)
		for _, x := range rs.xs {
			var fromBal, fromVer, toBal, toVer int64
			if err := read.QueryRowContext(ctx, x.from).Scan(&fromBal, &fromVer); err != nil {
				return err
			}
			if err := read.QueryRowContext(ctx, x.to).Scan(&toBal, &toVer); err != nil {
				return err
			}
			rs.out = strconv.AppendInt(rs.out[:0], x.amount, 10)
			status, reason := checkpoint.StepCompleted, ""
			if fromBal-x.amount < 0 {
				status, reason = checkpoint.StepRejected, "overdraft"
			} else if err := casExec(ctx, cas, x.from, fromBal-x.amount, fromVer); err != nil {
				return err
			} else if err := casExec(ctx, cas, x.to, toBal+x.amount, toVer); err != nil {
				return err
			}
			if _, err := item.ExecContext(ctx, rs.runID, x.id, status, rs.out, reason); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	return rs.advance(), nil
}

// loadKeys is the raw rerun baseline: the run's item keys and statuses
// with one SELECT into a map.
func (rs *sqliteSettler) loadKeys(ctx context.Context, runID string, n int) (int, error) {
	rows, err := rs.db.QueryContext(ctx, sqlRawItemKeys, runID)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	return keyStatuses(rows, n)
}

func (rs *sqliteSettler) rejected(ctx context.Context) (int, error) {
	var n int
	err := rs.db.QueryRowContext(ctx, sqlRawRejected).Scan(&n)
	return n, err
}

func (rs *sqliteSettler) balances(ctx context.Context) (string, error) { return balances(ctx, rs.db) }

// sqliteClaims is the queue-claim baseline on SQLite: one UPDATE …
// RETURNING per claim and one per finish, each its own (immediate)
// transaction on the one writer connection.
type sqliteClaims struct {
	db                *sql.DB
	claimSt, finishSt *sql.Stmt
}

func (s *sqliteBackend) claimSides(ctx context.Context, name string, _, n int, analyze bool) (*store, rawClaims, error) {
	ours, err := s.store(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	db, err := s.openRaw(ctx, name+"-raw.db", ours.db)
	if err != nil {
		return nil, nil, err
	}
	for _, q := range []string{sqlRawQueueTable, sqlRawQueueIndex} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return nil, nil, err
		}
	}
	at := time.Now().Add(-time.Second).UTC().Format(sqliteTimeFormat)
	if err := rawTx(ctx, db, func(tx *sql.Tx) error {
		for i := range n {
			if _, err := tx.ExecContext(ctx, sqlRawQueueSeed, fmt.Sprintf("bench/%06d", i), at); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	if analyze {
		if _, err := db.ExecContext(ctx, "ANALYZE raw_queue"); err != nil {
			return nil, nil, err
		}
	}
	sts, err := s.prepare(ctx, db, sqlRawClaim, sqlRawFinish)
	if err != nil {
		return nil, nil, err
	}
	return ours, &sqliteClaims{db: db, claimSt: sts[0], finishSt: sts[1]}, nil
}

// release is a no-op: SQLite has no connection slots to free.
func (s *sqliteBackend) release(*store, rawClaims) {}

func (r *sqliteClaims) claim(ctx context.Context, owner string) (string, bool, error) {
	now := time.Now().UTC()
	var id string
	err := r.claimSt.QueryRowContext(ctx, owner, now.Format(sqliteTimeFormat), now.Add(time.Minute).Format(sqliteTimeFormat)).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	return id, err == nil, err
}

func (r *sqliteClaims) finish(ctx context.Context, id string) error {
	res, err := r.finishSt.ExecContext(ctx, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("raw: job %s was not running", id)
	}
	return nil
}

func (r *sqliteClaims) done(ctx context.Context) (int, error) {
	var n int
	err := r.db.QueryRowContext(ctx, sqlRawDone).Scan(&n)
	return n, err
}
