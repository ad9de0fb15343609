package steps

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// Table names a table that effects land in (key, value and version
// columns); see checkpoint.Table.
type Table = checkpoint.Table

// Target says where a step's effects land: a table in the checkpoint
// database (same store: effects commit in the checkpoint's transaction) or
// in another SQLite database (separate store: plan, apply, record).
type Target struct {
	// Path of the SQLite database holding Table. Empty, or the checkpoint
	// database's own path, means the same store. The file must exist (with
	// Table in it): a missing one fails with an error wrapping
	// checkpoint.ErrNoDatabase that names its absolute path, and is never
	// created. A relative path is resolved against the working directory
	// when the target is opened; jobs store absolute paths in their
	// parameters (format:"path") so a resume elsewhere opens the same file.
	Path string
	// Table is the table and its key, value and version columns.
	Table Table
}

// State is the built-in key/value target in the checkpoint database, for
// durable counters: missing keys start at 0.
var State = Target{Table: checkpoint.StateTable}

func (t Target) String() string {
	if t.Path == "" {
		return t.Table.Name
	}
	return t.Path + ":" + t.Table.Name
}

// openTarget is a Target opened for this attempt.
type openTarget struct {
	h    *checkpoint.TableHandle
	same bool    // lives in the checkpoint database
	db   *sql.DB // owned writer (separate store) or nil
	rdb  *sql.DB // reads for job code (owned when separate)
	name string
}

// target returns the opened target, opening it on first use.
func (r *Run) target(ctx context.Context, t Target) (*openTarget, error) {
	key := t.Path + "\x00" + t.Table.Name
	r.mu.Lock()
	defer r.mu.Unlock()
	if ot, ok := r.targets[key]; ok {
		return ot, nil
	}
	sqlStore, ok := r.store.(checkpoint.SQLStore)
	if !ok {
		return nil, fmt.Errorf("steps: the checkpoint store %T cannot host effect targets", r.store)
	}
	same := t.Path == "" || samePath(t.Path, sqlStore.Path())
	ot := &openTarget{same: same, name: t.String(), rdb: sqlStore.ReadDB()}
	db := sqlStore.DB()
	if !same {
		var err error
		// A target is the user's own database: opening it never creates it.
		cfg := checkpoint.Config{Path: t.Path, MustExist: true}
		if ot.rdb, err = checkpoint.OpenTargetReader(ctx, cfg); err != nil {
			return nil, fmt.Errorf("steps: effect target %s: %w", t, err)
		}
		db = ot.rdb
		if !r.dryRun {
			if db, err = checkpoint.OpenTarget(ctx, cfg); err != nil {
				ot.rdb.Close()
				return nil, fmt.Errorf("steps: effect target %s: %w", t, err)
			}
		}
		ot.db = db
	}
	open := checkpoint.OpenTable
	if r.dryRun {
		// A dry run reads the target and writes nothing, not even the
		// applied-effects table.
		open, db = checkpoint.OpenTableForReading, ot.rdb
	}
	h, err := open(ctx, db, t.Table)
	if err != nil {
		if ot.db != nil {
			ot.closeDBs()
		}
		return nil, fmt.Errorf("steps: effect target %s: %w", t, err)
	}
	ot.h = h
	if r.targets == nil {
		r.targets = make(map[string]*openTarget)
	}
	r.targets[key] = ot
	return ot, nil
}

// closeDBs closes a separate target's handles (the writer may be the
// reader itself, in a dry run).
func (ot *openTarget) closeDBs() error {
	err := ot.rdb.Close()
	if ot.db != ot.rdb {
		err = errors.Join(err, ot.db.Close())
	}
	return err
}

func samePath(a, b string) bool {
	if a == b {
		return true
	}
	ra, err1 := filepath.Abs(a)
	rb, err2 := filepath.Abs(b)
	if err1 != nil || err2 != nil {
		return false
	}
	if ea, err := filepath.EvalSymlinks(ra); err == nil {
		ra = ea
	}
	if eb, err := filepath.EvalSymlinks(rb); err == nil {
		rb = eb
	}
	return ra == rb
}

// Close releases the targets this attempt opened. The runner calls it when
// the attempt ends.
func (r *Run) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for k, ot := range r.targets {
		ot.h.Close()
		if ot.db != nil {
			errs = append(errs, ot.closeDBs())
		}
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
	return ot.rdb, nil
}
