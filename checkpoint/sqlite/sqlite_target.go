package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/stepwise-run/stepwise/checkpoint"
)

const (
	sqlCreateApplied = `CREATE TABLE IF NOT EXISTS stepwise_applied (
    effect_id  TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL,
    step_id    TEXT NOT NULL,
    applied_at TEXT NOT NULL
) WITHOUT ROWID`
	sqlIsApplied    = `SELECT 1 FROM stepwise_applied WHERE effect_id = ?`
	sqlMarkApplied  = `INSERT INTO stepwise_applied (effect_id, run_id, step_id, applied_at) VALUES (?, ?, ?, ?)`
	sqlTableColumns = `SELECT name FROM pragma_table_info(?)`
)

// tableHandle is a Table opened on one database, with its statements
// prepared. Its methods run inside a caller's transaction.
type tableHandle struct {
	t                    checkpoint.Table
	db                   *sql.DB // nil when prepared in one transaction
	inTx                 bool    // the statements belong to one transaction
	read, update, insert *sql.Stmt
	readMany             *sql.Stmt // every key of a JSON array, in one query
	// readManyRowid and updateRowid are readMany with each row's rowid and
	// update by rowid (rowid.go); nil for a table without rowids.
	readManyRowid, updateRowid *sql.Stmt
	isApplied, mark            *sql.Stmt
}

// checkTable fails unless t exists through q with its columns.
func checkTable(ctx context.Context, q querier, t checkpoint.Table) error {
	if err := t.Validate(); err != nil {
		return err
	}
	rows, err := q.QueryContext(ctx, sqlTableColumns, t.Name)
	if err != nil {
		return fmt.Errorf("checkpoint: inspect table %s: %w", t.Name, err)
	}
	cols := map[string]bool{}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			rows.Close()
			return err
		}
		cols[strings.ToLower(c)] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("checkpoint: inspect table %s: %w", t.Name, err)
	}
	if len(cols) == 0 {
		return fmt.Errorf("checkpoint: effect target table %q does not exist; create it with columns %s", t.Name, t)
	}
	for _, c := range []string{t.Key, t.Value, t.Version} {
		if !cols[strings.ToLower(c)] {
			return fmt.Errorf("checkpoint: effect target table %q has no column %q; want %s", t.Name, c, t)
		}
	}
	return nil
}

// querier is what checkTable and prepareTable need of a *sql.DB or *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// openTable checks that t exists in db with its columns, creates the
// applied-effects table beside it (when write), and prepares the statements
// effects use (only the read when !write: nothing is written).
func openTable(ctx context.Context, db *sql.DB, t checkpoint.Table, write bool) (*tableHandle, error) {
	if err := checkTable(ctx, db, t); err != nil {
		return nil, err
	}
	h, err := prepareTable(ctx, db, t, write)
	if err != nil {
		return nil, err
	}
	h.db = db
	return h, nil
}

// stmt returns s for use in tx.
func (h *tableHandle) stmt(ctx context.Context, tx *sql.Tx, s *sql.Stmt) *sql.Stmt {
	if h.inTx {
		return s
	}
	return tx.StmtContext(ctx, s)
}

// prepareTable creates the applied-effects table (when write) and prepares
// the statements for t through q (a database, or one transaction).
func prepareTable(ctx context.Context, q querier, t checkpoint.Table, write bool) (*tableHandle, error) {
	if write {
		if _, err := q.ExecContext(ctx, sqlCreateApplied); err != nil {
			return nil, fmt.Errorf("checkpoint: create stepwise_applied beside %s: %w", t.Name, err)
		}
	}
	// Identifiers were validated by checkTable; values are always bound
	// parameters.
	h := &tableHandle{t: t}
	prep := []struct {
		dst **sql.Stmt
		q   string
	}{
		{&h.read, "SELECT " + t.Value + ", " + t.Version + " FROM " + t.Name + " WHERE " + t.Key + " = ?"},
		{&h.readMany, "SELECT " + t.Key + ", " + t.Value + ", " + t.Version + " FROM " + t.Name +
			" WHERE " + t.Key + " IN (SELECT value FROM json_each(?))"},
		{&h.update, "UPDATE " + t.Name + " SET " + t.Value + " = ?, " + t.Version + " = ? WHERE " + t.Key + " = ? AND " + t.Version + " = ?"},
		{&h.insert, "INSERT INTO " + t.Name + " (" + t.Key + ", " + t.Value + ", " + t.Version + ") VALUES (?, ?, 1) ON CONFLICT DO NOTHING"},
		{&h.isApplied, sqlIsApplied},
		{&h.mark, sqlMarkApplied},
	}
	if !write {
		prep = prep[:2]
	}
	for _, p := range prep {
		var err error
		if *p.dst, err = q.PrepareContext(ctx, p.q); err != nil {
			h.Close()
			return nil, fmt.Errorf("checkpoint: prepare statement for %s: %w", t, err)
		}
	}
	if write {
		if err := h.prepareRowid(ctx, q); err != nil {
			h.Close()
			return nil, err
		}
	}
	return h, nil
}

// Close releases the prepared statements.
func (h *tableHandle) Close() error {
	for _, s := range []*sql.Stmt{h.read, h.readMany, h.update, h.insert, h.isApplied, h.mark, h.readManyRowid, h.updateRowid} {
		if s != nil {
			s.Close()
		}
	}
	return nil
}

// Read returns the current state of keys, reading through tx.
func (h *tableHandle) Read(ctx context.Context, tx *sql.Tx, keys []string) (map[string]checkpoint.State, error) {
	if len(keys) > 1 {
		return h.readSet(ctx, tx, keys)
	}
	st := h.stmt(ctx, tx, h.read)
	out := make(map[string]checkpoint.State, len(keys))
	for _, k := range keys {
		if _, done := out[k]; done {
			continue
		}
		var s checkpoint.State
		err := st.QueryRowContext(ctx, k).Scan(&s.Value, &s.Version)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			if !h.t.CreateMissing {
				return nil, h.missing(k)
			}
		case err != nil:
			return nil, fmt.Errorf("checkpoint: read %s key %q: %w", h.t.Name, k, err)
		default:
			s.Exists = true
		}
		out[k] = s
	}
	return out, nil
}

// readSet reads many keys with one query, the keys passed as one JSON
// array.
func (h *tableHandle) readSet(ctx context.Context, tx *sql.Tx, keys []string) (map[string]checkpoint.State, error) {
	arg, err := json.Marshal(keys)
	if err != nil {
		return nil, err
	}
	rows, err := h.stmt(ctx, tx, h.readMany).QueryContext(ctx, string(arg))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: read %d keys of %s: %w", len(keys), h.t.Name, err)
	}
	defer rows.Close()
	out := make(map[string]checkpoint.State, len(keys))
	for rows.Next() {
		var k string
		s := checkpoint.State{Exists: true}
		if err := rows.Scan(&k, &s.Value, &s.Version); err != nil {
			return nil, fmt.Errorf("checkpoint: read %d keys of %s: %w", len(keys), h.t.Name, err)
		}
		out[k] = s
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("checkpoint: read %d keys of %s: %w", len(keys), h.t.Name, err)
	}
	return h.withMissing(keys, out)
}

// withMissing completes out, the states read of keys, with the keys no
// row holds: a new key's zero State where the table creates missing keys,
// else the error naming the first of them.
func (h *tableHandle) withMissing(keys []string, out map[string]checkpoint.State) (map[string]checkpoint.State, error) {
	for _, k := range keys {
		if _, ok := out[k]; !ok {
			if !h.t.CreateMissing {
				return nil, h.missing(k)
			}
			out[k] = checkpoint.State{}
		}
	}
	return out, nil
}

// missing is the error for a key absent from a table that does not create
// missing keys.
func (h *tableHandle) missing(k string) error {
	return fmt.Errorf("%w: %q in %s; create the row first", checkpoint.ErrMissingKey, k, h.t)
}

// Write applies compare-and-set writes through tx. The first write whose
// version moved returns a *VersionConflictError; the caller rolls back.
func (h *tableHandle) Write(ctx context.Context, tx *sql.Tx, ws []checkpoint.Write) error {
	upd := h.stmt(ctx, tx, h.update)
	var ins *sql.Stmt
	for _, w := range ws {
		var res sql.Result
		var err error
		if w.Insert {
			if ins == nil {
				ins = h.stmt(ctx, tx, h.insert)
			}
			res, err = ins.ExecContext(ctx, w.Key, w.NewValue)
		} else {
			res, err = upd.ExecContext(ctx, w.NewValue, w.OldVersion+1, w.Key, w.OldVersion)
		}
		if err != nil {
			return fmt.Errorf("checkpoint: write %s key %q: %w", h.t.Name, w.Key, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return h.conflict(ctx, tx, w)
		}
	}
	return nil
}

func (h *tableHandle) conflict(ctx context.Context, tx *sql.Tx, w checkpoint.Write) error {
	found := int64(-1)
	var v int64
	if err := h.stmt(ctx, tx, h.read).QueryRowContext(ctx, w.Key).Scan(&v, &found); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	return &checkpoint.VersionConflictError{Table: h.t.Name, Key: w.Key, Expected: w.OldVersion, Found: found}
}

// IsApplied reports whether the effect ID is recorded in the target's
// stepwise_applied table: the only proof that a plan of ours applied.
func (h *tableHandle) IsApplied(ctx context.Context, tx *sql.Tx, effectID string) (bool, error) {
	var one int
	var err error
	if h.isApplied == nil {
		// Opened for reading: nothing was prepared and nothing created,
		// so an applied-effects table that does not exist yet holds
		// nothing.
		err = tx.QueryRowContext(ctx, sqlIsApplied, effectID).Scan(&one)
		if err != nil && strings.Contains(err.Error(), "no such table") {
			return false, nil
		}
	} else {
		err = h.stmt(ctx, tx, h.isApplied).QueryRowContext(ctx, effectID).Scan(&one)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("checkpoint: look up effect %s: %w", effectID, err)
	}
	return true, nil
}

// MarkApplied records the effect ID in the target's stepwise_applied table,
// in the same transaction as the writes.
func (h *tableHandle) MarkApplied(ctx context.Context, tx *sql.Tx, a checkpoint.Applied) error {
	if _, err := h.stmt(ctx, tx, h.mark).ExecContext(ctx, a.EffectID, a.RunID, a.StepID, fmtTime(a.At)); err != nil {
		return fmt.Errorf("checkpoint: record effect %s as applied: %w", a.EffectID, err)
	}
	return nil
}

// OpenTarget opens another SQLite database (not the checkpoint database) to
// hold effects, with the pragmas cfg gives the checkpoint store: tests and
// tools that write a ledger file use it. It creates a
// missing file unless cfg.MustExist.
func OpenTarget(ctx context.Context, cfg Config) (*sql.DB, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if _, err := statDB(cfg.Path, cfg.MustExist); err != nil {
		return nil, err
	}
	d, _ := DSN(cfg)
	db, err := sql.Open("sqlite", d)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: open target %s: %w", cfg.Path, err)
	}
	db.SetMaxOpenConns(1)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, wrapSQLiteError(cfg.Path, cfg.BusyTimeout, "open target", err)
	}
	return db, nil
}

// OpenTargetReader opens query-only connections to an effect target's
// database, for job code that reads its own tables while steps commit. It
// never creates the file: a missing one is an ErrNoDatabase.
func OpenTargetReader(ctx context.Context, cfg Config) (*sql.DB, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	_, err := os.Stat(cfg.Path)
	if err := missingDB(cfg.Path, err); err != nil {
		return nil, err
	}
	return openReadPool(ctx, cfg)
}

// txTarget is a tableHandle's view inside one transaction (Target).
type txTarget struct {
	h  *tableHandle
	tx *sql.Tx
	// rows, when not nil, keeps the rowids of the keys read in tx, for
	// writing them by rowid (rowid.go): a same-store view, whose reads
	// and writes share one write transaction.
	rows *rowids
}

func (v txTarget) Read(ctx context.Context, keys []string) (map[string]checkpoint.State, error) {
	if v.rows != nil && len(keys) > 1 && v.h.readManyRowid != nil {
		return v.h.readSetRowid(ctx, v.tx, keys, v.rows)
	}
	return v.h.Read(ctx, v.tx, keys)
}

func (v txTarget) Write(ctx context.Context, ws []checkpoint.Write) error {
	if v.rows != nil && len(v.rows.of) > 0 {
		return v.h.writeRowid(ctx, v.tx, ws, v.rows)
	}
	return v.h.Write(ctx, v.tx, ws)
}

func (v txTarget) IsApplied(ctx context.Context, effectID string) (bool, error) {
	return v.h.IsApplied(ctx, v.tx, effectID)
}

func (v txTarget) MarkApplied(ctx context.Context, a checkpoint.Applied) error {
	return v.h.MarkApplied(ctx, v.tx, a)
}

// sqliteTarget is an effect target table opened by SQLite.OpenTarget.
type sqliteTarget struct {
	same bool
	w    *tableHandle // on the writer; nil when read-only
	r    *tableHandle // on rdb (the writer itself for a separate target written to)
	db   *sql.DB      // the writer: the store's own or a separate database's
	rdb  *sql.DB      // query-only connections, for reads that never wait
	own  bool         // db and rdb were opened for this target
}

var _ checkpoint.EffectTarget = (*sqliteTarget)(nil)

// OpenTarget implements checkpoint.Store. A location names a SQLite file; it is the
// same store when it is the checkpoint file itself (os.SameFile: a
// relative path, a symlink or a hard link to it count), and otherwise it is
// opened with the store's synchronous level and busy timeout
// (OpenFileTarget). A location that is a URL (postgres://...) is not a
// file: Config.Targets opens it.
func (s *Store) OpenTarget(ctx context.Context, spec checkpoint.TargetSpec) (checkpoint.EffectTarget, error) {
	if isURL(spec.Location) {
		if s.cfg.Targets == nil {
			return nil, fmt.Errorf("checkpoint: effect target %s in %s: the SQLite store opens database files only, and no opener for other locations was configured (Config.Targets)",
				spec.Table.Name, redactURL(spec.Location))
		}
		return s.cfg.Targets(ctx, spec)
	}
	if spec.Location == "" || s.isSelf(spec.Location) {
		return s.openSameTarget(ctx, spec)
	}
	cfg := s.cfg
	cfg.Path = spec.Location
	return OpenFileTarget(ctx, cfg, spec)
}

// OpenFileTarget opens spec.Table in the SQLite file spec.Location (not a
// checkpoint database of a store) as a separate effect target, with cfg's
// synchronous level and busy timeout (cfg.Path and cfg.MustExist are
// ignored: the file must exist, and a missing one is an error wrapping
// checkpoint.ErrNoDatabase naming it). It checks the table and its
// columns and creates the applied-effects table stepwise_applied beside
// it, unless spec.ReadOnly (which writes nothing). For a backend whose own
// location is not a SQLite file (a PostgreSQL store's Config.Targets); a
// SQLite store decides by itself whether a path is its own file.
func OpenFileTarget(ctx context.Context, cfg Config, spec checkpoint.TargetSpec) (checkpoint.EffectTarget, error) {
	if err := spec.Table.Validate(); err != nil {
		return nil, err
	}
	cfg.Path, cfg.MustExist, cfg.Targets = spec.Location, true, nil
	t := &sqliteTarget{own: true}
	var err error
	if t.rdb, err = OpenTargetReader(ctx, cfg); err != nil {
		return nil, err
	}
	t.db = t.rdb
	if !spec.ReadOnly {
		if t.db, err = OpenTarget(ctx, cfg); err != nil {
			t.rdb.Close()
			return nil, err
		}
	}
	if t.r, err = openTable(ctx, t.db, spec.Table, !spec.ReadOnly); err != nil {
		t.Close()
		return nil, err
	}
	if !spec.ReadOnly {
		t.w = t.r
	}
	return t, nil
}

// isURL reports whether loc is a URL with a scheme (SCHEME://...), which
// no SQLite store location is: its files are paths (or file: URIs).
func isURL(loc string) bool {
	scheme, _, ok := strings.Cut(loc, "://")
	if !ok || scheme == "" || strings.EqualFold(scheme, "file") {
		return false
	}
	for i, r := range scheme {
		letter := (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
		if !letter && (i == 0 || !(r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.')) {
			return false
		}
	}
	return true
}

// redactURL is loc with any password hidden, for messages.
func redactURL(loc string) string { return checkpoint.RedactLocation(loc) }

// isSelf reports whether path is the checkpoint database's own file.
func (s *Store) isSelf(path string) bool {
	a, err := os.Stat(path)
	if err != nil {
		return false
	}
	b, err := os.Stat(s.path)
	return err == nil && os.SameFile(a, b)
}

// openSameTarget opens a table of the checkpoint database. Its statements
// are prepared once per store and shared by every attempt; the table is
// checked again on each open, so a dropped table is reported at once.
func (s *Store) openSameTarget(ctx context.Context, spec checkpoint.TargetSpec) (checkpoint.EffectTarget, error) {
	t := &sqliteTarget{same: true, db: s.db, rdb: s.rdb}
	if err := checkTable(ctx, s.rdb, spec.Table); err != nil {
		return nil, err
	}
	s.tmu.Lock()
	defer s.tmu.Unlock()
	var err error
	if t.r = s.readTables[spec.Table]; t.r == nil {
		if t.r, err = openTable(ctx, s.rdb, spec.Table, false); err != nil {
			return nil, err
		}
		s.readTables[spec.Table] = t.r
	}
	if spec.ReadOnly {
		return t, nil
	}
	if t.w = s.tables[spec.Table]; t.w == nil {
		if t.w, err = openTable(ctx, s.db, spec.Table, true); err != nil {
			return nil, s.wrap("open effect target", err)
		}
		s.tables[spec.Table] = t.w
	}
	return t, nil
}

// Same implements checkpoint.EffectTarget.
func (t *sqliteTarget) Same() bool { return t.same }

// ReadDB returns query-only connections to the target's database, for job
// code that reads its own tables while steps commit.
func (t *sqliteTarget) ReadDB() *sql.DB { return t.rdb }

// Update implements checkpoint.EffectTarget.
func (t *sqliteTarget) Update(ctx context.Context, fn func(checkpoint.Target) error) error {
	if t.w == nil {
		return fmt.Errorf("checkpoint: effect target %s was opened read-only", t.r.t)
	}
	return runTx(ctx, t.db, nil, func(tx *sql.Tx) error { return fn(txTarget{h: t.w, tx: tx}) })
}

// View implements checkpoint.EffectTarget. A separate target written to reads on its
// writer connection in a deferred transaction, which takes no write lock.
func (t *sqliteTarget) View(ctx context.Context, fn func(checkpoint.Target) error) error {
	return runTx(ctx, t.r.db, &sql.TxOptions{ReadOnly: true}, func(tx *sql.Tx) error { return fn(txTarget{h: t.r, tx: tx}) })
}

// Close implements checkpoint.EffectTarget.
func (t *sqliteTarget) Close() error {
	if !t.own {
		return nil // the store's shared statements and handles stay
	}
	if t.r != nil {
		t.r.Close()
	}
	err := t.rdb.Close()
	if t.db != t.rdb {
		err = errors.Join(err, t.db.Close())
	}
	return err
}

// runTx runs fn in one transaction on db and commits it if fn returns nil.
func runTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// Target implements checkpoint.Tx. A table opened with OpenTarget uses the store's
// prepared statements; any other is checked and prepared in this
// transaction.
func (t *sqliteTx) Target(tb checkpoint.Table) (checkpoint.Target, error) {
	// Effects are writes of this transaction like any other: fenced at
	// commit, even when no checkpoint comes with them (InTx checks the
	// fence before COMMIT unless a write of the transaction already did).
	// The write lock, held from BEGIN IMMEDIATE, keeps the fence from
	// moving meanwhile, so checking it last is checking it first; an
	// effect step's checkpoint checks it in its own statement, with no
	// read of its own.
	t.touched = true
	t.s.tmu.Lock()
	h := t.s.tables[tb]
	t.s.tmu.Unlock()
	if h == nil {
		if err := checkTable(t.ctx, t.tx, tb); err != nil {
			return nil, err
		}
		var err error
		if h, err = prepareTable(t.ctx, t.tx, tb, true); err != nil {
			return nil, err
		}
		h.inTx = true
	}
	return txTarget{h: h, tx: t.tx, rows: &rowids{}}, nil
}
