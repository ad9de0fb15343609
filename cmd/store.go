package cmd

import (
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"strings"

	"github.com/alecthomas/kong"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
)

// This file is the one place that knows which backends exist: --db (and
// $STEPWISE_DB) is parsed here, and the store it names is opened here.
// Everything else in cmd holds a checkpoint.Backend.

// dbMapper decodes --db: a database URL is kept as it is, anything else is
// a SQLite file path, made absolute as kong's "path" type does, so a
// resume from another directory opens the same file.
type dbMapper struct{}

func (dbMapper) Decode(ctx *kong.DecodeContext, target reflect.Value) error {
	var s string
	if err := ctx.Scan.PopValueInto("database", &s); err != nil {
		return err
	}
	if _, ok := databaseURL(s); !ok && s != "" {
		s = kong.ExpandPath(s)
	}
	target.SetString(s)
	return nil
}

// databaseURL reports whether loc is a server database's URL (postgres://
// or postgresql://), and gives it with any password hidden, for messages.
func databaseURL(loc string) (string, bool) {
	scheme, _, ok := strings.Cut(loc, "://")
	if !ok || !(strings.EqualFold(scheme, "postgres") || strings.EqualFold(scheme, "postgresql")) {
		return "", false
	}
	if u, err := url.Parse(loc); err == nil {
		return u.Redacted(), true
	}
	return scheme + "://…", true
}

// errNoPostgres is returned for a PostgreSQL URL in --db: this build has
// no PostgreSQL store.
var errNoPostgres = errors.New("this build of Stepwise has no PostgreSQL store yet")

// openBackend opens the checkpoint store named by g.DB: a SQLite file
// (created unless mustExist) with g's durability and lock wait.
func openBackend(e *Env, mustExist bool) (checkpoint.Backend, error) {
	g := e.Globals
	if shown, ok := databaseURL(g.DB); ok {
		return nil, usageError{fmt.Errorf("--db %s: %w; give a SQLite database file path", shown, errNoPostgres)}
	}
	st, err := sqlite.Open(e.Ctx, sqlite.Config{
		Path: g.DB, Synchronous: g.Synchronous, BusyTimeout: g.BusyTimeout, MustExist: mustExist,
	})
	if errors.Is(err, checkpoint.ErrNoDatabase) {
		return nil, usageError{fmt.Errorf("%w; check --db or $STEPWISE_DB (this command only reads a checkpoint database)", err)}
	}
	if err != nil {
		return nil, err
	}
	return st, nil
}

// storeName names the checkpoint store in messages: its file, or its URL
// without the password.
func (e *Env) storeName() string {
	if shown, ok := databaseURL(e.Globals.DB); ok {
		return shown
	}
	return e.Globals.DB
}
