package postgres

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5/stdlib"
)

// OpenDB opens a database/sql handle on the database cfg.URL names, for
// tools that keep their own tables there (the example ledger's seed and
// check), with the store's connection settings (pool size, timeouts,
// application name). It creates nothing and runs no migration. Its errors
// are the store's: they name the server and database, never the password.
func OpenDB(ctx context.Context, cfg Config) (*sql.DB, error) {
	pc, err := cfg.poolConfig()
	if err != nil {
		return nil, err
	}
	where := describe(pc)
	db := stdlib.OpenDB(*pc.ConnConfig)
	db.SetMaxOpenConns(int(pc.MaxConns))
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, wrapError(where, "connect", err)
	}
	return db, nil
}

// ReadDB returns a database/sql handle on the store's own pool, for job
// code that reads its own tables in the checkpoint database (the day's
// transfers, say) while steps commit; steps.Run.TargetDB hands it out for
// a same-store target. It is made once and closed with the store.
func (s *Store) ReadDB() *sql.DB {
	s.readOnce.Do(func() { s.read = stdlib.OpenDBFromPool(s.pool) })
	return s.read
}

// ReadDB implements the read handle steps.Run.TargetDB asks an effect
// target for: the store's own (Store.ReadDB).
func (e *effectTarget) ReadDB() *sql.DB { return e.s.ReadDB() }
