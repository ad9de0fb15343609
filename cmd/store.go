package cmd

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/alecthomas/kong"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/stores"
)

// This file is where cmd opens stores: --db (and $STEPWISE_DB) is parsed
// here, and the store it names is opened here through checkpoint/stores,
// which alone knows the backends; their failures are told apart by
// checkpoint's backend-neutral kinds. Everything else in cmd holds a
// checkpoint.Backend.

// dbMapper decodes --db: a database URL is kept as it is, anything else is
// a SQLite file path, made absolute as kong's "path" type does, so a
// resume from another directory opens the same file.
type dbMapper struct{}

func (dbMapper) Decode(ctx *kong.DecodeContext, target reflect.Value) error {
	var s string
	if err := ctx.Scan.PopValueInto("database", &s); err != nil {
		return err
	}
	if !stores.IsURL(s) && s != "" {
		s = kong.ExpandPath(s)
	}
	target.SetString(s)
	return nil
}

// openBackend opens the checkpoint store named by g.DB: a PostgreSQL
// database (never created; its tables are created or migrated), or a
// SQLite file (created unless mustExist) with g's durability and lock
// wait.
func openBackend(e *Env, mustExist, noMigrate bool) (checkpoint.Backend, error) {
	g := e.Globals
	st, err := stores.Open(e.Ctx, g.DB, stores.Settings{
		MustExist: mustExist, NoMigrate: noMigrate, Synchronous: g.Synchronous, BusyTimeout: g.BusyTimeout, MaxConns: e.maxConns, Lease: e.lease,
		OwnTargetCredentials: e.ownTargetCredentials,
	})
	switch {
	case errors.Is(err, checkpoint.ErrNoDatabase) && mustExist:
		return nil, usageError{fmt.Errorf("%w; check --db or $STEPWISE_DB (this command only reads a checkpoint database)", err)}
	case errors.Is(err, checkpoint.ErrNeedsMigration):
		return nil, usageError{fmt.Errorf("%w; this command only reads, so it leaves the database as it is: "+
			"a command that writes (run, resume, serve, worker) migrates it", err)}
	case errors.Is(err, checkpoint.ErrBadLocation):
		return nil, usageError{fmt.Errorf("--db: %w", err)}
	case serverError(err):
		// The store could not be opened: nothing was done, and what to
		// fix is the server, the URL or the grants (exit 2). The same
		// errors later, mid-run, fail the attempt (exit 1): a rerun
		// resumes it.
		return nil, usageError{err}
	case err != nil:
		return nil, err
	}
	return st, nil
}

// storeName names the checkpoint store in messages: its file, or its URL
// without the password.
func (e *Env) storeName() string {
	return stores.Redact(e.Globals.DB)
}

// serverError reports whether err is a database server refusing or failing
// what was asked in a way the user fixes: the server down or unreachable,
// authentication refused, the database missing, a privilege missing, a
// statement timeout, too many connections. Opening the store, it is exit
// 2 (nothing was written).
func serverError(err error) bool {
	for _, kind := range []error{checkpoint.ErrUnavailable, checkpoint.ErrAuth, checkpoint.ErrNoDatabase,
		checkpoint.ErrPermission, checkpoint.ErrStatementTimeout, checkpoint.ErrTooManyConnections} {
		if errors.Is(err, kind) {
			return true
		}
	}
	return false
}
