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
//	         overdraw is rejected, and that rejection is pinned
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
	"encoding/json"
	"fmt"

	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// Params are the settle job's parameters.
type Params struct {
	Date   string `param:"date,key" format:"date" help:"business date to settle, YYYY-MM-DD"`
	Ledger string `param:"ledger" help:"ledger database file; empty means the checkpoint database (--db)"`
	Chunk  int    `param:"chunk" default:"1000" help:"transfers committed together"`
}

// Validate checks the parameters beyond their types.
func (p *Params) Validate() error {
	if p.Chunk < 1 || p.Chunk > steps.MaxChunkSize {
		return fmt.Errorf("parameter \"chunk\" is %d; use 1 to %d", p.Chunk, steps.MaxChunkSize)
	}
	return nil
}

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
type Summary struct {
	Date           string   `json:"date"`
	Transfers      int64    `json:"transfers"`
	Posted         int64    `json:"posted"`
	Rejected       int64    `json:"rejected"`
	PostedAmount   int64    `json:"posted_amount"`
	RejectedAmount int64    `json:"rejected_amount"`
	RejectedIDs    []string `json:"rejected_ids"` // the first MaxListed
}

// MaxListed bounds how many rejected transfer IDs the summary lists.
const MaxListed = 20

// Job is the settle job, registered by cmd/stepwise.
var Job = jobs.Define("settle", Settle, jobs.Help("settles a business day's transfers over the ledger, exactly once"))

// Settle is the settle job's function.
func Settle(ctx context.Context, r *steps.Run, p Params) error {
	target := steps.Target{Path: p.Ledger, Table: Accounts}
	db, err := r.TargetDB(ctx, target)
	if err != nil {
		return fmt.Errorf("open ledger: %w (create one with `stepwise ledger seed`)", err)
	}
	day, err := steps.Do(ctx, r, steps.ID("count"), func(ctx context.Context) (Day, error) {
		var d Day
		err := db.QueryRowContext(ctx, `SELECT count(*), COALESCE(sum(amount), 0) FROM transfers WHERE business_date = ?`,
			p.Date).Scan(&d.Transfers, &d.Amount)
		return d, err
	}, steps.Input(p.Date))
	if err != nil {
		return err
	}
	src := steps.Paged(p.Chunk, func(t Transfer) string { return t.ID },
		func(ctx context.Context, after string, limit int) ([]Transfer, error) {
			rows, err := db.QueryContext(ctx, `SELECT id, from_account, to_account, amount FROM transfers
WHERE business_date = ? AND id > ? ORDER BY id LIMIT ?`, p.Date, after, limit)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			page := make([]Transfer, 0, limit)
			for rows.Next() {
				var t Transfer
				if err := rows.Scan(&t.ID, &t.From, &t.To, &t.Amount); err != nil {
					return nil, err
				}
				page = append(page, t)
			}
			return page, rows.Err()
		}, day.Transfers)
	if _, err := steps.ForEach(ctx, r, "post", src, post, steps.WithTarget(target), steps.ChunkSize(p.Chunk)); err != nil {
		return err
	}
	_, err = steps.Do(ctx, r, steps.ID("summary"), func(ctx context.Context) (Summary, error) {
		s := Summary{Date: p.Date, Transfers: day.Transfers, RejectedIDs: []string{}}
		err := r.Items(ctx, "post", "rejected", func(it steps.ItemResult) error {
			var amount int64 // post's output, kept with its rejection
			if err := json.Unmarshal(it.Output, &amount); err != nil {
				return fmt.Errorf("rejected transfer %s: decode its amount: %w", it.Key, err)
			}
			s.Rejected++
			s.RejectedAmount += amount
			if len(s.RejectedIDs) < MaxListed {
				s.RejectedIDs = append(s.RejectedIDs, it.Key)
			}
			return nil
		})
		s.Posted = s.Transfers - s.Rejected
		s.PostedAmount = day.Amount - s.RejectedAmount
		r.Logger().Info().Int64("posted", s.Posted).Int64("rejected", s.Rejected).Int64("posted_amount", s.PostedAmount).
			Msg("settlement summary")
		return s, err
	}, steps.Input(day))
	if err != nil {
		return err
	}
	// Queued with its checkpoint: sent at least once, whatever crashes.
	return steps.Notify(ctx, r, steps.ID("notify"), "settled", map[string]string{
		"date": p.Date, "message": "settlement for " + p.Date + " done",
	})
}

// post is one transfer's effects: debit with a no-overdraft guard, credit.
func post(ctx context.Context, t Transfer, e *steps.Effects) (int64, error) {
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
