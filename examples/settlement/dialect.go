package settlement

import (
	"database/sql"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// The ledger lives in SQLite or in PostgreSQL. Its statements are written
// once with $1-style placeholders, which both accept; what differs (column
// types, the catalogue, how an overflowing sum fails) is here.

// dialect is the SQL flavour of a ledger's database.
type dialect struct {
	postgres bool
	// classify marks an error of a query of the ledger that trying
	// again may cure (Run.TargetError); nil leaves errors as they are.
	classify func(error) error
}

// dialectOf tells which database db reaches: PostgreSQL through pgx's
// database/sql driver, SQLite otherwise.
func dialectOf(db *sql.DB) dialect {
	_, pg := db.Driver().(*stdlib.Driver)
	return dialect{postgres: pg}
}

// schema is the ledger's tables. The accounts and transfers columns are
// fixed: people and tools read them. On PostgreSQL the IDs compare
// bytewise (COLLATE "C"), as on SQLite and as the runner orders keys.
func (d dialect) schema() string {
	if !d.postgres {
		return sqliteSchema
	}
	return postgresSchema
}

const sqliteSchema = `
CREATE TABLE IF NOT EXISTS accounts (
    id      TEXT PRIMARY KEY,
    balance INTEGER NOT NULL,
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS transfers (
    id            TEXT PRIMARY KEY,
    business_date TEXT NOT NULL,
    from_account  TEXT NOT NULL,
    to_account    TEXT NOT NULL,
    amount        INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS transfers_by_date ON transfers (business_date, id);
-- Balances when a business date was seeded, for ledger check.
CREATE TABLE IF NOT EXISTS opening_balances (
    business_date TEXT NOT NULL,
    account_id    TEXT NOT NULL,
    balance       INTEGER NOT NULL,
    PRIMARY KEY (business_date, account_id)
) WITHOUT ROWID;
-- The order dates were seeded in: a date's closing balances are the
-- opening balances of the date seeded next (or the current balances).
CREATE TABLE IF NOT EXISTS seeded_dates (
    business_date TEXT PRIMARY KEY,
    seq           INTEGER NOT NULL UNIQUE
) WITHOUT ROWID;
`

const postgresSchema = `
CREATE TABLE IF NOT EXISTS accounts (
    id      TEXT COLLATE "C" PRIMARY KEY,
    balance BIGINT NOT NULL,
    version BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS transfers (
    id            TEXT COLLATE "C" PRIMARY KEY,
    business_date TEXT COLLATE "C" NOT NULL,
    from_account  TEXT COLLATE "C" NOT NULL,
    to_account    TEXT COLLATE "C" NOT NULL,
    amount        BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS transfers_by_date ON transfers (business_date, id);
-- Balances when a business date was seeded, for ledger check.
CREATE TABLE IF NOT EXISTS opening_balances (
    business_date TEXT COLLATE "C" NOT NULL,
    account_id    TEXT COLLATE "C" NOT NULL,
    balance       BIGINT NOT NULL,
    PRIMARY KEY (business_date, account_id)
);
-- The order dates were seeded in: a date's closing balances are the
-- opening balances of the date seeded next (or the current balances).
CREATE TABLE IF NOT EXISTS seeded_dates (
    business_date TEXT COLLATE "C" PRIMARY KEY,
    seq           BIGINT NOT NULL UNIQUE
);
`

// ledgerTables counts which of the ledger's three tables exist, as the
// database resolves unqualified names (PostgreSQL: its search_path).
func (d dialect) ledgerTables() string {
	if d.postgres {
		return `SELECT (to_regclass('accounts') IS NOT NULL)::int + (to_regclass('transfers') IS NOT NULL)::int +
(to_regclass('opening_balances') IS NOT NULL)::int`
	}
	return `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name IN ('accounts', 'transfers', 'opening_balances')`
}

// hasSeedOrder tells whether the ledger records the order its dates were
// seeded in (a ledger seeded by an older Stepwise has no seeded_dates).
func (d dialect) hasSeedOrder() string {
	if d.postgres {
		return `SELECT (to_regclass('seeded_dates') IS NOT NULL)::int`
	}
	return `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'seeded_dates'`
}

// daySums counts a date's transfers and sums their amounts; a sum that
// leaves int64 fails (see overflowed).
func (d dialect) daySums() string {
	if d.postgres {
		return `SELECT count(*), COALESCE(sum(amount), 0)::bigint FROM transfers WHERE business_date = $1`
	}
	return `SELECT count(*), COALESCE(sum(amount), 0) FROM transfers WHERE business_date = $1`
}

// overflowed reports whether err is the database refusing a sum that
// leaves int64: SQLite's "integer overflow", PostgreSQL's "bigint out of
// range" (SQLSTATE 22003).
func (d dialect) overflowed(err error) bool {
	if err == nil {
		return false
	}
	if d.postgres {
		var pe *pgconn.PgError
		return errors.As(err, &pe) && pe.Code == "22003" // numeric_value_out_of_range
	}
	return strings.Contains(err.Error(), "integer overflow")
}

// fault is err of a query of the ledger, marked as a store fault by the
// store that holds the ledger (steps.Run.TargetError) when trying again
// may cure it: a server restart or an ended session under a pooled run
// then hands the partition back and the run goes on, instead of failing
// it.
func (d dialect) fault(err error) error {
	if d.classify != nil {
		return d.classify(err)
	}
	return err
}
