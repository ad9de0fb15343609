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
	// AllowUnsettled seeds Date even when the date seeded last looks
	// unsettled (see ErrUnsettled). Its check then has no closing balances
	// to compare with.
	AllowUnsettled bool
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

// ErrUnsettled is returned by Seed when the date seeded last has transfers
// but not one balance has moved since it was seeded: it looks unsettled.
// The new date's opening balances would then not be the last date's
// closing ones, and Check of the last date would have nothing to compare
// with. Settle it first, or set SeedConfig.AllowUnsettled.
var ErrUnsettled = errors.New("settlement: the date seeded last looks unsettled")

// Seed creates the ledger tables in db if needed, the accounts if there are
// none, and cfg.Transfers transfers for cfg.Date, all in one transaction,
// and records every account's balance as the date's opening balance and
// the date's place in the order dates were seeded in (any order of dates
// is fine, as long as each is settled before the next is seeded).
func Seed(ctx context.Context, db *sql.DB, cfg SeedConfig) error {
	return SeedReporting(ctx, db, cfg, nil)
}

// SeedReporting is Seed that calls progress, if not nil, as the transfers
// are inserted with how many are in and the total: with 0 before the
// first, every few hundred, and with done == total once the seed
// committed. It runs on the caller's goroutine and should return quickly
// (throttle what it prints).
func SeedReporting(ctx context.Context, db *sql.DB, cfg SeedConfig, progress func(done, total int)) error {
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
	if !cfg.AllowUnsettled {
		if err := refuseUnsettled(ctx, tx, cfg.Date); err != nil {
			return err
		}
	}
	var accounts int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM accounts`).Scan(&accounts); err != nil {
		return err
	}
	if accounts == 0 {
		acct := inserter{ctx: ctx, tx: tx, pg: d.postgres, head: `INSERT INTO accounts (id, balance, version) VALUES `, cols: 3}
		defer acct.close()
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
	if progress != nil {
		progress(0, cfg.Transfers)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5e771e))
	trans := inserter{ctx: ctx, tx: tx, pg: d.postgres, head: `INSERT INTO transfers (id, business_date, from_account, to_account, amount) VALUES `, cols: 5}
	defer trans.close()
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
		if progress != nil && i%insertRows == 0 && i < cfg.Transfers {
			progress(i, cfg.Transfers)
		}
	}
	if err := trans.flush(); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO opening_balances (business_date, account_id, balance)
SELECT $1, id, balance FROM accounts`, cfg.Date); err != nil {
		return fmt.Errorf("seed: record opening balances: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO seeded_dates (business_date, seq)
SELECT $1, COALESCE(max(seq), 0) + 1 FROM seeded_dates`, cfg.Date); err != nil {
		return fmt.Errorf("seed: record the order of seeded dates: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	if progress != nil {
		progress(cfg.Transfers, cfg.Transfers)
	}
	return nil
}

// refuseUnsettled returns an error wrapping ErrUnsettled when the date
// seeded last (before date) has transfers of a positive amount and no
// account's balance differs from its opening balance of that date.
func refuseUnsettled(ctx context.Context, tx *sql.Tx, date string) error {
	last, err := lastSeeded(ctx, tx)
	if err != nil || last == "" {
		return err
	}
	var movable, moved int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM transfers WHERE business_date = $1 AND amount > 0`, last).Scan(&movable); err != nil {
		return err
	}
	if movable == 0 {
		return nil
	}
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM accounts AS a JOIN opening_balances AS o
ON o.account_id = a.id AND o.business_date = $1 WHERE a.balance <> o.balance`, last).Scan(&moved); err != nil {
		return err
	}
	if moved > 0 {
		return nil
	}
	return fmt.Errorf("%w: %s, seeded before %s, has %d transfers and no balance has moved since; settle it first (stepwise run settle -p date=%s), or seed anyway with --allow-unsettled (ledger check of %s and %s then has no balances to compare with)",
		ErrUnsettled, last, date, movable, last, last, date)
}

// lastSeeded returns the date seeded last: the one with the highest
// seeded_dates sequence, or in a ledger whose dates were seeded before
// their order was recorded, the latest date with opening balances; "" if
// no date was seeded.
func lastSeeded(ctx context.Context, tx *sql.Tx) (string, error) {
	var last sql.NullString
	err := tx.QueryRowContext(ctx, `SELECT business_date FROM seeded_dates ORDER BY seq DESC LIMIT 1`).Scan(&last)
	if errors.Is(err, sql.ErrNoRows) {
		err = tx.QueryRowContext(ctx, `SELECT max(business_date) FROM opening_balances`).Scan(&last)
	}
	if err != nil {
		return "", fmt.Errorf("seed: find the date seeded last: %w", err)
	}
	return last.String, nil
}

// inserter inserts rows insertRows to a statement, in the seed's one
// transaction: one round trip per batch instead of per row, which a
// server database needs. The statement of a full batch is prepared once
// and reused. On SQLite its placeholders are plain ?: SQLite looks each
// numbered or named placeholder up in a list of the ones seen before, so
// a statement of thousands of $n placeholders costs time quadratic in
// their number to prepare (most of a seed's time, before).
type inserter struct {
	ctx  context.Context
	tx   *sql.Tx
	pg   bool
	head string // INSERT INTO t (cols) VALUES
	cols int
	args []any
	full *sql.Stmt // the statement of insertRows rows, once prepared
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
	rows := len(in.args) / in.cols
	var err error
	if rows == insertRows {
		if in.full == nil {
			if in.full, err = in.tx.PrepareContext(in.ctx, in.statement(rows)); err != nil {
				return err
			}
		}
		_, err = in.full.ExecContext(in.ctx, in.args...)
	} else {
		_, err = in.tx.ExecContext(in.ctx, in.statement(rows), in.args...)
	}
	in.args = in.args[:0]
	return err
}

// close releases the prepared statement; the transaction's end would too.
func (in *inserter) close() {
	if in.full != nil {
		in.full.Close()
	}
}

// statement is the INSERT of rows rows.
func (in *inserter) statement(rows int) string {
	var b strings.Builder
	b.WriteString(in.head)
	for r := 0; r < rows; r++ {
		if r > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('(')
		for c := 0; c < in.cols; c++ {
			if c > 0 {
				b.WriteByte(',')
			}
			if in.pg {
				fmt.Fprintf(&b, "$%d", r*in.cols+c+1)
			} else {
				b.WriteByte('?')
			}
		}
		b.WriteByte(')')
	}
	return b.String()
}
