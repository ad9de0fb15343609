package postgres

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// readerConns is how many connections a ReadDB handle opens at most, as
// the SQLite store's read pool.
const readerConns = 4

// openReader returns read-only database/sql connections configured as
// pc's (server, database, search_path, timeouts, application name): every
// transaction on them is READ ONLY unless it says otherwise. Nothing
// connects until the handle is used.
func openReader(pc *pgxpool.Config) *sql.DB {
	cc := pc.ConnConfig.Copy()
	cc.RuntimeParams["default_transaction_read_only"] = "on"
	db := stdlib.OpenDB(*cc)
	db.SetMaxOpenConns(readerConns)
	db.SetMaxIdleConns(readerConns)
	return db
}

// OpenDB returns a database/sql handle on the database cfg.URL names,
// configured as Open configures its pool (timeouts, application name,
// UTC; at most cfg.MaxConns connections, 4 by default), for tools that
// write their own tables, such as a ledger's seed. It connects once to
// check the URL; its errors are Open's: ErrUnavailable, ErrAuth,
// ErrNoDatabase (which also matches checkpoint.ErrNoDatabase),
// ErrPermission, naming the server and database, never the password.
// The store's schema is not touched.
func OpenDB(ctx context.Context, cfg Config) (*sql.DB, error) {
	pc, err := cfg.poolConfig()
	if err != nil {
		return nil, err
	}
	db := stdlib.OpenDB(*pc.ConnConfig.Copy())
	db.SetMaxOpenConns(int(pc.MaxConns))
	db.SetMaxIdleConns(int(pc.MaxConns))
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, wrapError(describe(pc), "connect", err)
	}
	return db, nil
}
