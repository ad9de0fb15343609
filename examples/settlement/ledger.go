package settlement

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// SeedConfig describes a reproducible ledger.
type SeedConfig struct {
	// Accounts is the number of accounts (created if the ledger has none).
	Accounts int
	// Transfers is the number of transfers for Date.
	Transfers int
	// Date is the business date of the transfers, YYYY-MM-DD.
	Date string
	// Seed makes the ledger reproducible: the same seed, the same ledger.
	Seed uint64
	// Balance is each new account's opening balance in minor units.
	Balance int64
	// MaxAmount bounds a transfer's amount (minor units). Defaults to
	// Balance/2, which makes a few transfers overdraw and get rejected.
	MaxAmount int64
}

// Validate checks the configuration as Seed does, without touching a
// database: its errors wrap ErrBadInput.
func (c SeedConfig) Validate() error { return c.validate() }

func (c *SeedConfig) validate() error {
	if _, err := time.Parse("2006-01-02", c.Date); err != nil {
		return fmt.Errorf("%w: seed: date %q is not YYYY-MM-DD", ErrBadInput, c.Date)
	}
	if c.Accounts < 2 || c.Accounts > 10_000_000 {
		return fmt.Errorf("%w: seed: accounts is %d; use 2 to 10000000", ErrBadInput, c.Accounts)
	}
	if c.Transfers < 0 || c.Transfers > 100_000_000 {
		return fmt.Errorf("%w: seed: transfers is %d; use 0 to 100000000", ErrBadInput, c.Transfers)
	}
	if c.Balance < 0 {
		return fmt.Errorf("%w: seed: balance is %d; it cannot be negative", ErrBadInput, c.Balance)
	}
	if c.Balance > math.MaxInt64/int64(c.Accounts) {
		return fmt.Errorf("%w: seed: balance %d times %d accounts does not fit in int64 minor units; use a balance of at most %d",
			ErrBadInput, c.Balance, c.Accounts, math.MaxInt64/int64(c.Accounts))
	}
	if c.MaxAmount == 0 {
		c.MaxAmount = max(c.Balance/2, 1)
	}
	if c.MaxAmount < 1 {
		return fmt.Errorf("%w: seed: max amount is %d; use at least 1", ErrBadInput, c.MaxAmount)
	}
	return nil
}

// AccountID is the ID of account n (1-based): A-0000001.
func AccountID(n int) string { return fmt.Sprintf("A-%07d", n) }

// TransferID is the ID of transfer n (1-based) of a date: T-2026-11-28-00000001,
// so IDs sort in posting order.
func TransferID(date string, n int) string { return fmt.Sprintf("T-%s-%08d", date, n) }

// ErrAlreadySeeded is returned by Seed when the ledger already has
// transfers for the date.
var ErrAlreadySeeded = errors.New("settlement: the ledger already has transfers for this date")

// Seed creates the ledger tables in db if needed, the accounts if there are
// none, and cfg.Transfers transfers for cfg.Date, all in one transaction,
// and records every account's balance as the date's opening balance.
func Seed(ctx context.Context, db *sql.DB, cfg SeedConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	d := dialectOf(db)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, d.schema()); err != nil {
		return fmt.Errorf("seed: create ledger tables: %w", err)
	}
	var existing int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM transfers WHERE business_date = $1`, cfg.Date).Scan(&existing); err != nil {
		return err
	}
	if existing > 0 {
		return fmt.Errorf("%w: %d transfers on %s; seed another date or another file", ErrAlreadySeeded, existing, cfg.Date)
	}
	var accounts int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM accounts`).Scan(&accounts); err != nil {
		return err
	}
	if accounts == 0 {
		acct := inserter{ctx: ctx, tx: tx, head: `INSERT INTO accounts (id, balance, version) VALUES `, cols: 3}
		for i := 1; i <= cfg.Accounts; i++ {
			if err := acct.add(AccountID(i), cfg.Balance, 0); err != nil {
				return err
			}
		}
		if err := acct.flush(); err != nil {
			return err
		}
		accounts = cfg.Accounts
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5e771e))
	trans := inserter{ctx: ctx, tx: tx, head: `INSERT INTO transfers (id, business_date, from_account, to_account, amount) VALUES `, cols: 5}
	for i := 1; i <= cfg.Transfers; i++ {
		from := rng.IntN(accounts) + 1
		to := rng.IntN(accounts-1) + 1
		if to >= from {
			to++ // never to itself
		}
		amount := rng.Int64N(cfg.MaxAmount) + 1
		if err := trans.add(TransferID(cfg.Date, i), cfg.Date, AccountID(from), AccountID(to), amount); err != nil {
			return err
		}
	}
	if err := trans.flush(); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO opening_balances (business_date, account_id, balance)
SELECT $1, id, balance FROM accounts`, cfg.Date); err != nil {
		return fmt.Errorf("seed: record opening balances: %w", err)
	}
	return tx.Commit()
}

// inserter inserts rows a few hundred to a statement: one round trip per
// batch instead of per row, which a server database needs (and which both
// databases accept: multi-row VALUES with $n placeholders).
type inserter struct {
	ctx  context.Context
	tx   *sql.Tx
	head string // INSERT INTO t (cols) VALUES
	cols int
	args []any
}

// insertRows is how many rows one statement inserts: well inside both
// databases' limits on a statement's parameters.
const insertRows = 500

func (in *inserter) add(values ...any) error {
	in.args = append(in.args, values...)
	if len(in.args) >= insertRows*in.cols {
		return in.flush()
	}
	return nil
}

func (in *inserter) flush() error {
	if len(in.args) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString(in.head)
	for r := 0; r < len(in.args)/in.cols; r++ {
		if r > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('(')
		for c := 0; c < in.cols; c++ {
			if c > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "$%d", r*in.cols+c+1)
		}
		b.WriteByte(')')
	}
	_, err := in.tx.ExecContext(in.ctx, b.String(), in.args...)
	in.args = in.args[:0]
	return err
}
