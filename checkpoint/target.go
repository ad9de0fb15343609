package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"regexp"
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

// Target is the view of one effect target table inside one transaction:
// the checkpoint's own (Tx.Target, same store) or one of the target's
// database (EffectTarget.Update and View, separate store). Every method is
// set-based: the number of statements a call sends does not grow with the
// number of keys a chunk touches (no statement per key).
//
// Inside a write transaction, what Read returned must stay true until the
// commit: no other writer may change a key read until the transaction
// ends (SQLite: the database's write lock; a server store: row locks
// taken in key order, so colliding writers wait instead of deadlocking).
type Target interface {
	// Read returns the current state of keys; a missing key is
	// State{Exists: false} when the table creates missing keys, an
	// ErrMissingKey naming it otherwise. Duplicate keys are read once.
	Read(ctx context.Context, keys []string) (map[string]State, error)
	// Write applies compare-and-set writes: each key's version must still
	// be its OldVersion (or the key must still be missing, for an
	// Insert). A write that finds another version is a
	// *VersionConflictError, and the caller rolls the transaction back.
	Write(ctx context.Context, ws []Write) error
	// IsApplied reports whether effectID is recorded in the target's
	// applied-effects table: the only proof that a separate-store plan of
	// ours applied (a version alone cannot say who moved it).
	IsApplied(ctx context.Context, effectID string) (bool, error)
	// MarkApplied records a's effect ID in the target's applied-effects
	// table, in the same transaction as the writes it proves.
	MarkApplied(ctx context.Context, a Applied) error
}

// Applied is the record that a separate-store plan applied, kept in the
// target database beside the writes.
type Applied struct {
	EffectID string
	RunID    string
	StepID   string
	At       time.Time
}

// TargetSpec says which effect target table Store.OpenTarget opens.
type TargetSpec struct {
	// Location names the database holding Table: a SQLite file path or a
	// postgres:// URL. Empty means the store's own database. A location
	// that is the store's database under another name is the same store
	// too: stores decide by database identity, never by comparing names
	// (SQLite: the same file; PostgreSQL: the same cluster, database and
	// relation). A location of the other backend's kind is opened through
	// the store's Config.Targets (checkpoint/stores fills it in). A
	// separate database must exist (with Table in it); it is never
	// created, and a missing one is an error wrapping ErrNoDatabase.
	Location string
	// Table is the table and its key, value and version columns.
	Table Table
	// ReadOnly opens the target for reading only (a dry run): the table is
	// checked and nothing is written, not even the applied-effects table.
	// Update then fails.
	ReadOnly bool
}

// EffectTarget is an effect target table opened by a Store for one
// attempt. A separate database is opened with the store's own settings
// (durability, lock waits).
type EffectTarget interface {
	// Same reports whether the table lives in the checkpoint database
	// itself: its effects then commit in the checkpoint's own transaction,
	// through Tx.Target, and Update is not used.
	Same() bool
	// Update runs fn in one write transaction on the target's database
	// and commits it if fn returns nil.
	Update(ctx context.Context, fn func(Target) error) error
	// View runs fn in one read-only transaction that never waits for the
	// target's writers and keeps no lock they wait for.
	View(ctx context.Context, fn func(Target) error) error
	// Close releases what the target opened (never the store itself).
	Close() error
}
