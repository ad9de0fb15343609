// Package report is a small complete job: it builds a daily fee report from
// the day's orders in checkpointed steps. Crash it or press Ctrl-C halfway
// and run it again: the steps already done are skipped and return their
// recorded outputs, so the report is the same.
package report

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// Params are the report job's parameters.
type Params struct {
	Date   string        `param:"date,key" format:"date" help:"business date of the report, YYYY-MM-DD"`
	Orders int           `param:"orders" default:"20" help:"how many orders the day has"`
	Pace   time.Duration `param:"pace" default:"0s" help:"pause in each pricing step, to watch or interrupt a run"`
}

// Validate checks the parameters beyond their types.
func (p *Params) Validate() error {
	if p.Orders < 1 || p.Orders > 100000 {
		return fmt.Errorf("parameter \"orders\" is %d; use 1 to 100000", p.Orders)
	}
	if p.Pace < 0 || p.Pace > time.Minute {
		return fmt.Errorf("parameter \"pace\" is %s; use 0s to 1m", p.Pace)
	}
	return nil
}

// Order is one order of the day; amounts are minor units (cents).
type Order struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
}

// Summary is the report's result.
type Summary struct {
	Date   string `json:"date"`
	Orders int    `json:"orders"`
	Volume int64  `json:"volume"`
	Fees   int64  `json:"fees"`
}

// Job is the report job, registered by cmd/stepwise.
var Job = jobs.Define("report", run, jobs.Help("builds the daily fee report from the day's orders"))

func run(ctx context.Context, r *steps.Run, p Params) error {
	orders, err := steps.Do(ctx, r, steps.ID("load"), func(ctx context.Context) ([]Order, error) {
		return loadOrders(p.Date, p.Orders), nil
	}, steps.Input(p))
	if err != nil {
		return err
	}
	sum := Summary{Date: p.Date, Orders: len(orders)}
	for _, o := range orders {
		fee, err := steps.Do(ctx, r, steps.ID("price", o.ID), func(ctx context.Context) (int64, error) {
			if p.Pace > 0 {
				select {
				case <-ctx.Done():
					return 0, ctx.Err()
				case <-time.After(p.Pace):
				}
			}
			return Fee(o.Amount), nil
		}, steps.Input(o))
		if err != nil {
			return err
		}
		sum.Volume += o.Amount
		sum.Fees += fee
	}
	_, err = steps.Do(ctx, r, steps.ID("summary"), func(ctx context.Context) (Summary, error) {
		r.Logger().Info().Int64("volume", sum.Volume).Int64("fees", sum.Fees).Msg("report ready")
		return sum, nil
	}, steps.Input(sum))
	return err
}

// Fee is 1.5% of amount, rounded half up, at least 30 minor units.
func Fee(amount int64) int64 {
	return max((amount*15+500)/1000, 30)
}

// loadOrders derives the day's orders from the date, so every machine gets
// the same report for the same date.
func loadOrders(date string, n int) []Order {
	orders := make([]Order, n)
	for i := range orders {
		h := sha256.Sum256(fmt.Appendf(nil, "%s/%d", date, i))
		orders[i] = Order{ID: fmt.Sprintf("O-%05d", i+1), Amount: int64(binary.BigEndian.Uint32(h[:4])%100000) + 100}
	}
	return orders
}
