package steps

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// Table names a table that effects land in (key, value and version
// columns); see checkpoint.Table.
type Table = checkpoint.Table

// Target says where a step's effects land: a table in the checkpoint
// database (same store: effects commit in the checkpoint's transaction) or
// in another SQLite database (separate store: plan, apply, record).
type Target struct {
	// Location of the database holding Table, as the checkpoint store
	// takes it: a SQLite file path, or a PostgreSQL URL, whichever store
	// holds the checkpoints (checkpoint.TargetSpec.Location). Empty, or the
	// checkpoint database itself under any name (the store decides by
	// identity, so a symlink or relative path counts), means the same
	// store. A separate database is opened by the checkpoint store, with
	// its durability and lock-wait settings. It must exist (with Table in
	// it): a missing one fails with an error wrapping
	// checkpoint.ErrNoDatabase that names it, and is never created. A
	// relative path is resolved against the working directory when the
	// target is opened; jobs store absolute paths in their parameters
	// (format:"path") so a resume elsewhere opens the same file.
	Location string
	// Table is the table and its key, value and version columns.
	Table Table
}

// State is the built-in key/value target in the checkpoint database, for
// durable counters: missing keys start at 0.
var State = Target{Table: checkpoint.StateTable}

func (t Target) String() string {
	if t.Location == "" {
		return t.Table.Name
	}
	return t.Location + ":" + t.Table.Name
}

// openTarget is a Target opened for this attempt.
type openTarget struct {
	// mu makes the partitions of one attempt take turns applying to a
	// separate target (applySeparate).
	mu    sync.Mutex
	et    checkpoint.EffectTarget
	table Table
	same  bool // lives in the checkpoint database
	name  string
}

// target returns the opened target, opening it on first use. The store
// opens it and decides whether it is its own database; a dry run opens it
// for reading only, so it writes nothing, not even the applied-effects
// table.
func (r *Run) target(ctx context.Context, t Target) (*openTarget, error) {
	key := t.Location + "\x00" + t.Table.Name
	r.mu.Lock()
	defer r.mu.Unlock()
	if ot, ok := r.targets[key]; ok {
		return ot, nil
	}
	et, err := r.store.OpenTarget(ctx, checkpoint.TargetSpec{Location: t.Location, Table: t.Table, ReadOnly: r.dryRun})
	if err != nil {
		return nil, fmt.Errorf("steps: effect target %s: %w", t, err)
	}
	ot := &openTarget{et: et, table: t.Table, same: et.Same(), name: t.String()}
	if r.targets == nil {
		r.targets = make(map[string]*openTarget)
	}
	r.targets[key] = ot
	return ot, nil
}

// Close releases the targets this attempt opened. The runner calls it when
// the attempt ends.
func (r *Run) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for k, ot := range r.targets {
		errs = append(errs, ot.et.Close())
		delete(r.targets, k)
	}
	return errors.Join(errs...)
}

// TargetDB returns a query-only handle on target's database, opening it for
// this attempt if needed, so job code can read its own tables (the day's
// transfers, say) from the database its effects land in, even while
// iterating rows and running steps inside the loop. Writes go through
// effects.
func (r *Run) TargetDB(ctx context.Context, t Target) (*sql.DB, error) {
	ot, err := r.target(ctx, t)
	if err != nil {
		return nil, err
	}
	rd, ok := ot.et.(sqlReader)
	if !ok {
		return nil, fmt.Errorf("steps: effect target %s: its store (%T) offers no database/sql handle to read it with", t, ot.et)
	}
	return rd.ReadDB(), nil
}

// TargetError returns err, an error of job code's own query through
// TargetDB's handle on t, marked as a store fault (errors.Is(err,
// checkpoint.ErrTransient)) when t's store says trying again may cure it:
// the connection lost or closed by the server, the server restarting, a
// deadlock or a serialization failure. A partitioned step then hands its
// partition back and a pooled run is tried again, as after the store's own
// faults, instead of failing for an operator. Any other error, and every
// error of a store that classifies none (SQLite), is returned as it is.
func (r *Run) TargetError(ctx context.Context, t Target, err error) error {
	if err == nil {
		return nil
	}
	ot, oerr := r.target(ctx, t)
	if oerr != nil {
		return err
	}
	if c, ok := ot.et.(faultClassifier); ok {
		return c.ClassifyError(err)
	}
	return err
}

// faultClassifier is an EffectTarget that tells the errors of queries on
// its ReadDB that trying again may cure (PostgreSQL's targets).
type faultClassifier interface {
	// ClassifyError returns err marked checkpoint.ErrTransient when
	// trying again may cure it, else err.
	ClassifyError(err error) error
}

// sqlReader is an EffectTarget that gives job code a database/sql handle
// for reading its own tables.
type sqlReader interface {
	// ReadDB returns query-only connections to the target's database.
	ReadDB() *sql.DB
}
