package main

import (
	"context"
	"database/sql"
	"errors"
	"strconv"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
)

// rawSettler is the hand-written settlement: prepared statements on a
// handle with the store's DSN, one transaction per chunk.
type rawSettler struct {
	db                    *sql.DB
	page, read, cas, item *sql.Stmt
	after                 string
	done                  bool
	out                   []byte
	xs                    []rawTransfer
}

type rawTransfer struct {
	id, from, to string
	amount       int64
}

func (b *bench) newRawSettler(db *sql.DB) (*rawSettler, error) {
	rs := &rawSettler{db: db}
	var err error
	for dst, q := range map[**sql.Stmt]string{&rs.page: sqlRawTransfers, &rs.read: sqlRawAccountRead, &rs.cas: sqlRawAccountCAS, &rs.item: sqlRawItem} {
		if *dst, err = b.prepare(db, q); err != nil {
			return nil, err
		}
	}
	return rs, nil
}

// chunk settles the next benchChunk transfers in one transaction: per
// transfer, read both balances and versions, reject an overdraft (its
// item recorded as rejected), else two version-CAS UPDATEs, and the
// item's checkpoint with its output (the amount).
func (rs *rawSettler) chunk(ctx context.Context) error {
	runID := jobs.RunID(settlement.Job.Name(), benchDate)
	err := rawTx(ctx, rs.db, func(tx *sql.Tx) error {
		rows, err := tx.StmtContext(ctx, rs.page).QueryContext(ctx, benchDate, rs.after, benchChunk)
		if err != nil {
			return err
		}
		rs.xs = rs.xs[:0]
		for rows.Next() {
			var x rawTransfer
			if err := rows.Scan(&x.id, &x.from, &x.to, &x.amount); err != nil {
				rows.Close()
				return err
			}
			rs.xs = append(rs.xs, x)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return err
		}
		read, cas, item := tx.StmtContext(ctx, rs.read), tx.StmtContext(ctx, rs.cas), tx.StmtContext(ctx, rs.item)
		for _, x := range rs.xs {
			var fromBal, fromVer, toBal, toVer int64
			if err := read.QueryRowContext(ctx, x.from).Scan(&fromBal, &fromVer); err != nil {
				return err
			}
			if err := read.QueryRowContext(ctx, x.to).Scan(&toBal, &toVer); err != nil {
				return err
			}
			rs.out = strconv.AppendInt(rs.out[:0], x.amount, 10)
			status, reason := checkpoint.StepCompleted, ""
			if fromBal-x.amount < 0 {
				status, reason = checkpoint.StepRejected, "overdraft"
			} else if err := casExec(ctx, cas, x.from, fromBal-x.amount, fromVer); err != nil {
				return err
			} else if err := casExec(ctx, cas, x.to, toBal+x.amount, toVer); err != nil {
				return err
			}
			if _, err := item.ExecContext(ctx, runID, x.id, status, rs.out, reason); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(rs.xs) > 0 {
		rs.after = rs.xs[len(rs.xs)-1].id
	}
	rs.done = len(rs.xs) < benchChunk
	return nil
}

// rawLoadKeys is the raw rerun baseline: the run's item keys and statuses
// with one SELECT into a map.
func rawLoadKeys(ctx context.Context, db *sql.DB, n int) (map[string]string, error) {
	rows, err := db.QueryContext(ctx, sqlRawItemKeys, jobs.RunID(settlement.Job.Name(), benchDate))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	keys := make(map[string]string, n)
	for rows.Next() {
		var k, s string
		if err := rows.Scan(&k, &s); err != nil {
			return nil, err
		}
		keys[k] = s
	}
	return keys, rows.Err()
}
