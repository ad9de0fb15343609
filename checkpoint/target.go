package checkpoint

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"
)

// Table names a user's table that effects land in: one integer value and
// one version per key. The version only ever grows; Stepwise's writes are
// compare-and-set on it.
type Table struct {
	// Name of the table. Required.
	Name string
	// Key is the key column (TEXT). Required.
	Key string
	// Value is the integer value column (minor units for money). Required.
	Value string
	// Version is the integer version column. Required.
	Version string
	// CreateMissing lets a write to a missing key insert it (from value 0,
	// version 0). Otherwise a missing key is an error: accounts must exist.
	CreateMissing bool
}

// StateTable is the built-in key/value target kept in the checkpoint
// database, for jobs that need durable counters and no table of their own.
var StateTable = Table{Name: "stepwise_state", Key: "key", Value: "value", Version: "version", CreateMissing: true}

// State is the current value and version of one key.
type State struct {
	Value   int64 `json:"value"`
	Version int64 `json:"version"`
	Exists  bool  `json:"exists"`
}

// Write is one compare-and-set: set Key to NewValue and its version to
// OldVersion+1, where its version is still OldVersion.
type Write struct {
	Key        string `json:"key"`
	OldVersion int64  `json:"old_version"`
	OldValue   int64  `json:"old_value"`
	NewValue   int64  `json:"new_value"`
	Insert     bool   `json:"insert,omitempty"` // the key did not exist
}

// VersionConflictError is returned when a compare-and-set finds a version
// other than the one its plan expected: another writer moved the key first.
type VersionConflictError struct {
	Table    string
	Key      string
	Expected int64
	Found    int64 // -1 when the key no longer exists
}

func (e *VersionConflictError) Error() string {
	return fmt.Sprintf("version conflict on %s key %q: expected version %d, found %d (another writer moved it)",
		e.Table, e.Key, e.Expected, e.Found)
}

// ErrMissingKey is returned when an effect touches a key that does not exist
// in a table that does not create missing keys.
var ErrMissingKey = errors.New("checkpoint: key not found in target table")

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Validate checks every name is a plain SQL identifier, so the table can be
// named in statements without quoting tricks.
func (t Table) Validate() error {
	for _, f := range []struct{ what, v string }{{"Name", t.Name}, {"Key", t.Key}, {"Value", t.Value}, {"Version", t.Version}} {
		if !identRE.MatchString(f.v) {
			return fmt.Errorf("checkpoint: Table.%s %q is not a plain SQL identifier (letters, digits, _; not starting with a digit)", f.what, f.v)
		}
	}
	return nil
}

// String names the table and its columns, e.g. accounts(id, balance, version).
func (t Table) String() string {
	return fmt.Sprintf("%s(%s, %s, %s)", t.Name, t.Key, t.Value, t.Version)
}

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

// TableHandle is a Table opened on one database, with its statements
// prepared. Its methods run inside a caller's transaction.
type TableHandle struct {
	t                    Table
	db                   *sql.DB
	read, update, insert *sql.Stmt
	isApplied, mark      *sql.Stmt
}

// OpenTable checks that t exists in db with its columns, creates the
// applied-effects table beside it, and prepares the statements effects use.
func OpenTable(ctx context.Context, db *sql.DB, t Table) (*TableHandle, error) {
	return openTable(ctx, db, t, true)
}

// OpenTableForReading is OpenTable for a dry run: it checks the table and
// prepares only its read, and writes nothing to the database.
func OpenTableForReading(ctx context.Context, db *sql.DB, t Table) (*TableHandle, error) {
	return openTable(ctx, db, t, false)
}

func openTable(ctx context.Context, db *sql.DB, t Table, write bool) (*TableHandle, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, sqlTableColumns, t.Name)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: inspect table %s: %w", t.Name, err)
	}
	cols := map[string]bool{}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			rows.Close()
			return nil, err
		}
		cols[strings.ToLower(c)] = true
	}
	rows.Close()
	if len(cols) == 0 {
		return nil, fmt.Errorf("checkpoint: effect target table %q does not exist; create it with columns %s", t.Name, t)
	}
	for _, c := range []string{t.Key, t.Value, t.Version} {
		if !cols[strings.ToLower(c)] {
			return nil, fmt.Errorf("checkpoint: effect target table %q has no column %q; want %s", t.Name, c, t)
		}
	}
	if write {
		if _, err := db.ExecContext(ctx, sqlCreateApplied); err != nil {
			return nil, fmt.Errorf("checkpoint: create stepwise_applied beside %s: %w", t.Name, err)
		}
	}
	// Identifiers were validated above; values are always bound parameters.
	h := &TableHandle{t: t, db: db}
	prep := []struct {
		dst **sql.Stmt
		q   string
	}{
		{&h.read, "SELECT " + t.Value + ", " + t.Version + " FROM " + t.Name + " WHERE " + t.Key + " = ?"},
		{&h.update, "UPDATE " + t.Name + " SET " + t.Value + " = ?, " + t.Version + " = ? WHERE " + t.Key + " = ? AND " + t.Version + " = ?"},
		{&h.insert, "INSERT INTO " + t.Name + " (" + t.Key + ", " + t.Value + ", " + t.Version + ") VALUES (?, ?, 1) ON CONFLICT DO NOTHING"},
		{&h.isApplied, sqlIsApplied},
		{&h.mark, sqlMarkApplied},
	}
	if !write {
		prep = prep[:1]
	}
	for _, p := range prep {
		if *p.dst, err = db.PrepareContext(ctx, p.q); err != nil {
			h.Close()
			return nil, fmt.Errorf("checkpoint: prepare statement for %s: %w", t, err)
		}
	}
	return h, nil
}

// Table returns the table this handle writes.
func (h *TableHandle) Table() Table { return h.t }

// DB returns the database the table lives in.
func (h *TableHandle) DB() *sql.DB { return h.db }

// Close releases the prepared statements.
func (h *TableHandle) Close() error {
	for _, s := range []*sql.Stmt{h.read, h.update, h.insert, h.isApplied, h.mark} {
		if s != nil {
			s.Close()
		}
	}
	return nil
}

// Read returns the current state of keys, reading through tx.
func (h *TableHandle) Read(ctx context.Context, tx *sql.Tx, keys []string) (map[string]State, error) {
	st := tx.StmtContext(ctx, h.read)
	out := make(map[string]State, len(keys))
	for _, k := range keys {
		if _, done := out[k]; done {
			continue
		}
		var s State
		err := st.QueryRowContext(ctx, k).Scan(&s.Value, &s.Version)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			if !h.t.CreateMissing {
				return nil, fmt.Errorf("%w: %q in %s; create the row first", ErrMissingKey, k, h.t)
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

// Write applies compare-and-set writes through tx. The first write whose
// version moved returns a *VersionConflictError; the caller rolls back.
func (h *TableHandle) Write(ctx context.Context, tx *sql.Tx, ws []Write) error {
	upd := tx.StmtContext(ctx, h.update)
	var ins *sql.Stmt
	for _, w := range ws {
		var res sql.Result
		var err error
		if w.Insert {
			if ins == nil {
				ins = tx.StmtContext(ctx, h.insert)
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

func (h *TableHandle) conflict(ctx context.Context, tx *sql.Tx, w Write) error {
	found := int64(-1)
	var v int64
	if err := tx.StmtContext(ctx, h.read).QueryRowContext(ctx, w.Key).Scan(&v, &found); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	return &VersionConflictError{Table: h.t.Name, Key: w.Key, Expected: w.OldVersion, Found: found}
}

// IsApplied reports whether the effect ID is recorded in the target's
// stepwise_applied table: the only proof that a plan of ours applied.
func (h *TableHandle) IsApplied(ctx context.Context, tx *sql.Tx, effectID string) (bool, error) {
	var one int
	err := tx.StmtContext(ctx, h.isApplied).QueryRowContext(ctx, effectID).Scan(&one)
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
func (h *TableHandle) MarkApplied(ctx context.Context, tx *sql.Tx, effectID, runID, stepID string, at time.Time) error {
	if _, err := tx.StmtContext(ctx, h.mark).ExecContext(ctx, effectID, runID, stepID, fmtTime(at)); err != nil {
		return fmt.Errorf("checkpoint: record effect %s as applied: %w", effectID, err)
	}
	return nil
}

// OpenTarget opens another SQLite database (not the checkpoint database) to
// hold effects, with the same pragmas as the checkpoint store. It creates a
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
