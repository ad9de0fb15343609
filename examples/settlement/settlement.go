// Package settlement is the flagship example: nightly settlement of a
// business day's transfers over a ledger. Crash it anywhere (kill -9,
// Ctrl-C, a power cut) and run it again from the top: every transfer is
// posted exactly once and every account ends exactly right.
//
// The job has three steps:
//
//	count    how many transfers the day has and their total (checkpointed)
//	post     a batch step over the transfers in ascending ID order, a chunk
//	         at a time: each transfer is Add(from, -amount) with a
//	         no-overdraft guard and Add(to, +amount); one that would
//	         overdraw, or whose amount is not positive, is rejected, and
//	         that rejection is pinned
//	summary  counts, totals and the rejected transfers
//	notify   queues a "settled" notification in the outbox
//
// The ledger's accounts table is the effects' target. By default it lives
// in the checkpoint database (same store: a chunk's balances and item
// checkpoints commit in one transaction); with -p ledger=PATH it is another
// SQLite file (separate store: plan, apply with an effect ID, record).
package settlement

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// Params are the settle job's parameters.
type Params struct {
	Date   string `param:"date,key" format:"date" help:"business date to settle, YYYY-MM-DD"`
	Ledger string `param:"ledger" format:"database" help:"ledger database: an existing SQLite file (stored as an absolute path) or a postgres:// URL without a password; over the HTTP API the name of a target serve's operator configured (--target); empty means the checkpoint database"`
	Chunk  int    `param:"chunk" default:"1000" help:"transfers committed together"`
	// Partitions splits the post step across runners, by debit account.
	Partitions int `param:"partitions" default:"1" help:"partitions of the post step, by debit account (1 to 256); several let workers share it"`
}

// Validate checks the parameters beyond their types.
func (p *Params) Validate() error {
	if p.Chunk < 1 || p.Chunk > steps.MaxChunkSize {
		return fmt.Errorf("parameter \"chunk\" is %d; use 1 to %d", p.Chunk, steps.MaxChunkSize)
	}
	if p.Partitions < 1 || p.Partitions > MaxPartitions {
		return fmt.Errorf("parameter \"partitions\" is %d; use 1 to %d", p.Partitions, MaxPartitions)
	}
	return nil
}

// MaxPartitions is the most partitions the post step may have.
const MaxPartitions = 256

// Accounts is the ledger's accounts table as an effect target.
var Accounts = steps.Table{Name: "accounts", Key: "id", Value: "balance", Version: "version"}

// Transfer is one row of the transfers table.
type Transfer struct {
	ID     string `json:"id"`
	From   string `json:"from"`
	To     string `json:"to"`
	Amount int64  `json:"amount"`
}

// Day is the output of the count step.
type Day struct {
	Transfers int64 `json:"transfers"`
	Amount    int64 `json:"amount"`
}

// Summary is the settlement's result, the output of the summary step.
// PostedAmount plus RejectedAmount is the day's total.
type Summary struct {
	Date      string `json:"date"`
	Transfers int64  `json:"transfers"`
	Posted    int64  `json:"posted"`
	// Rejected counts every rejected transfer: overdrafts and bad amounts.
	Rejected int64 `json:"rejected"`
	// BadAmount counts the rejected transfers whose amount was not
	// positive.
	BadAmount      int64    `json:"bad_amount"`
	PostedAmount   int64    `json:"posted_amount"`
	RejectedAmount int64    `json:"rejected_amount"`
	RejectedIDs    []string `json:"rejected_ids"` // the first MaxListed
}

// ErrBadAmount is wrapped by the pinned rejection of a transfer whose
// amount is zero or negative: a negative amount would move money the other
// way round, past the source account's no-overdraft guard.
var ErrBadAmount = errors.New("amount is not positive")

// MaxListed bounds how many rejected transfer IDs the summary lists.
const MaxListed = 20

// Job is the settle job, registered by cmd/stepwise.
var Job = jobs.Define("settle", Settle, jobs.Help("settles a business day's transfers over the ledger, exactly once"),
	jobs.LimitBy(1, LedgerKey))

// LedgerKey is the resource a settlement uses: its ledger. One settlement
// per ledger runs at a time (jobs.LimitBy), on every path that starts one
// and on every host: two days settled at once over one ledger would make
// which transfer an overdraft rejects depend on timing.
func LedgerKey(p Params) string {
	if p.Ledger == "" {
		return "ledger=(checkpoint store)"
	}
	return "ledger=" + p.Ledger
}

// Settle is the settle job's function.
func Settle(ctx context.Context, r *steps.Run, p Params) error {
	target := steps.Target{Location: p.Ledger, Table: Accounts}
	db, err := r.TargetDB(ctx, target)
	if err != nil {
		return fmt.Errorf("open ledger: %w (create one with `stepwise ledger seed`)", err)
	}
	dialect := dialectOf(db)
	dialect.classify = func(err error) error { return r.TargetError(ctx, target, err) }
	day, err := steps.Do(ctx, r, steps.ID("count"), func(ctx context.Context) (Day, error) {
		var d Day
		err := db.QueryRowContext(ctx, dialect.daySums(), p.Date).Scan(&d.Transfers, &d.Amount)
		if dialect.overflowed(err) {
			// The database's sum refuses to wrap around; say what it summed.
			return d, fmt.Errorf("%w: the total amount of %s's transfers does not fit in int64 minor units: %w", ErrOverflow, p.Date, err)
		}
		if err != nil {
			return d, fmt.Errorf("count %s's transfers: %w", p.Date, dialect.fault(err))
		}
		return d, nil
	}, steps.Input(p.Date))
	if err != nil {
		return err
	}
	src := steps.Paged(p.Chunk, func(t Transfer) string { return t.ID },
		func(ctx context.Context, after string, limit int) ([]Transfer, error) {
			rows, err := db.QueryContext(ctx, `SELECT id, from_account, to_account, amount FROM transfers
WHERE business_date = $1 AND id > $2 ORDER BY id LIMIT $3`, p.Date, after, limit)
			if err != nil {
				return nil, dialect.fault(err)
			}
			defer rows.Close()
			page := make([]Transfer, 0, limit)
			for rows.Next() {
				var t Transfer
				if err := rows.Scan(&t.ID, &t.From, &t.To, &t.Amount); err != nil {
					return nil, dialect.fault(err)
				}
				page = append(page, t)
			}
			return page, dialect.fault(rows.Err())
		}, day.Transfers).ReadAhead() // transfers do not move with postings: read the next page while a chunk commits
	opts := []steps.Option{steps.WithTarget(target), steps.ChunkSize(p.Chunk)}
	if p.Partitions > 1 {
		// By debit account: one account's debits stay in one partition,
		// in ID order, so its overdraft guard decides as in one partition.
		opts = append(opts, steps.Partitions(p.Partitions))
		src = src.PartitionBy(func(t Transfer) string { return t.From })
	}
	if _, err := steps.ForEach(ctx, r, "post", src, post, opts...); err != nil {
		return err
	}
	_, err = steps.Do(ctx, r, steps.ID("summary"), func(ctx context.Context) (Summary, error) {
		return summarize(ctx, r, db, dialect, p.Date, day)
	}, steps.Input(day))
	if err != nil {
		return err
	}
	// Queued with its checkpoint: sent at least once, whatever crashes.
	return steps.Notify(ctx, r, steps.ID("notify"), "settled", map[string]string{
		"date": p.Date, "message": "settlement for " + p.Date + " done",
	})
}

// summarize is the summary step: the day's counts and totals, from the
// rejected items of post (few) and the count step's totals, with checked
// sums.
func summarize(ctx context.Context, r *steps.Run, db *sql.DB, dialect dialect, date string, day Day) (Summary, error) {
	// Counted from the recorded items, not from the count step: a
	// transfer altered before it was posted, or one accepted beyond the
	// declared total, is summarised as it was posted.
	s := Summary{Date: date, RejectedIDs: []string{}}
	rejected := sum{what: "the rejected amount of " + date}
	posted := sum{what: "the posted amount of " + date}
	err := r.Items(ctx, "post", "", func(it steps.ItemResult) error {
		var amount int64
		switch {
		case it.Output != nil:
			// post's output: the amount, kept with an overdraft's rejection.
			if err := json.Unmarshal(it.Output, &amount); err != nil {
				return fmt.Errorf("transfer %s: decode its amount: %w", it.Key, err)
			}
		case it.Status == "rejected":
			// post itself rejected it (a bad amount): read the amount.
			if err := db.QueryRowContext(ctx, `SELECT amount FROM transfers WHERE id = $1`, it.Key).Scan(&amount); err != nil {
				return fmt.Errorf("rejected transfer %s: read its amount: %w", it.Key, dialect.fault(err))
			}
			s.BadAmount++
		default:
			return fmt.Errorf("transfer %s is %s with no recorded amount", it.Key, it.Status)
		}
		s.Transfers++
		if it.Status != "rejected" {
			s.Posted++
			posted.add(amount)
			return nil
		}
		s.Rejected++
		rejected.add(amount)
		if len(s.RejectedIDs) < MaxListed {
			s.RejectedIDs = append(s.RejectedIDs, it.Key)
		}
		return nil
	})
	if err != nil {
		return s, err
	}
	var errR, errP error
	s.RejectedAmount, errR = rejected.value()
	s.PostedAmount, errP = posted.value()
	if err := errors.Join(errR, errP); err != nil {
		return s, err
	}
	if s.Transfers != day.Transfers {
		r.Logger().Warn().Int64("counted", day.Transfers).Int64("posted_or_rejected", s.Transfers).
			Msg("the day's transfers changed since they were counted; the summary is of what was posted")
	}
	r.Logger().Info().Int64("posted", s.Posted).Int64("rejected", s.Rejected).Int64("posted_amount", s.PostedAmount).
		Msg("settlement summary")
	return s, nil
}

// post is one transfer's effects: debit with a no-overdraft guard, credit.
// A transfer that does not move a positive amount is rejected (pinned).
func post(ctx context.Context, t Transfer, e *steps.Effects) (int64, error) {
	if t.Amount <= 0 {
		return 0, steps.Reject(fmt.Errorf("transfer %s from %s to %s has amount %d: %w; "+
			"a transfer moves a positive number of minor units", t.ID, t.From, t.To, t.Amount, ErrBadAmount))
	}
	e.Add(t.From, -t.Amount, steps.NotBelow(0))
	e.Add(t.To, t.Amount)
	return t.Amount, nil
}

// DecodeSummary decodes a summary step's recorded output.
func DecodeSummary(raw []byte) (Summary, error) {
	var s Summary
	err := json.Unmarshal(raw, &s)
	return s, err
}
