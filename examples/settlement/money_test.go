package settlement_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// execLedger runs statements on the ledger at path (a file or a URL).
func execLedger(t *testing.T, path string, stmts ...string) {
	t.Helper()
	db := openLedger(t, path)
	defer db.Close()
	for _, q := range stmts {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// balances returns every account's balance.
func balances(t *testing.T, path string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for id, bv := range readAccounts(t, path) {
		out[id] = bv[0]
	}
	return out
}

// itemErrors returns the recorded reason of each rejected item of post.
func (s store) itemErrors(t *testing.T, date string) map[string]string {
	t.Helper()
	ctx := context.Background()
	st := s.open(t)
	defer st.Close()
	out := map[string]string{}
	q := checkpoint.ItemQuery{RunID: jobs.RunID(settlement.Job.Name(), date), Step: "post", Status: checkpoint.StepRejected}
	if err := st.Items(ctx, q, func(it checkpoint.Item) error {
		out[it.Key] = it.Error
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestBadAmountsArePinnedRejections: a transfer of a negative or zero
// amount is rejected (pinned) with a reason naming it and its amount, and
// moves no balance: the ledger ends exactly like the same ledger without
// those transfers. The summary and ledger check count them.
func TestBadAmountsArePinnedRejections(t *testing.T) {
	t.Parallel()
	for _, l := range layouts(t) {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			clean := newStore(t, l, smallLedger)
			bad := newStore(t, l, smallLedger)
			neg, zero := settlement.TransferID(testDate, 100)+"a", settlement.TransferID(testDate, 400)+"z"
			execLedger(t, bad.ledgerLoc(),
				// A negative amount would move 500 from A-0000002 to
				// A-0000001, past A-0000002's no-overdraft guard.
				`INSERT INTO transfers VALUES ('`+neg+`', '`+testDate+`', 'A-0000001', 'A-0000002', -500)`,
				`INSERT INTO transfers VALUES ('`+zero+`', '`+testDate+`', 'A-0000003', 'A-0000004', 0)`)
			clean.mustSettle(t, testDate, 100)
			bad.mustSettle(t, testDate, 100)

			// (Versions may differ: they grow once per chunk, and the extra
			// transfers move the chunk boundaries.)
			if a, b := balances(t, clean.ledgerLoc()), balances(t, bad.ledgerLoc()); !mapsEqual(a, b) {
				t.Fatalf("bad amounts moved balances:\nwithout them %v\nwith them    %v", a, b)
			}
			reasons := bad.itemErrors(t, testDate)
			for id, amount := range map[string]string{neg: "amount -500", zero: "amount 0"} {
				if r := reasons[id]; !strings.Contains(r, id) || !strings.Contains(r, amount) || !strings.Contains(r, "not positive") {
					t.Errorf("%s: rejection reason %q; want it to name the transfer and its %s", id, r, amount)
				}
			}
			cs, bs := clean.summary(t, testDate), bad.summary(t, testDate)
			if bs.Rejected != cs.Rejected+2 || bs.BadAmount != 2 || bs.Posted != cs.Posted || bs.PostedAmount != cs.PostedAmount ||
				bs.RejectedAmount != cs.RejectedAmount-500 || bs.Transfers != cs.Transfers+2 {
				t.Errorf("summary with bad amounts %+v; without %+v", bs, cs)
			}
			rep := bad.check(t, testDate)
			if !rep.OK() || rep.BadAmount != 2 || rep.Rejected != int(bs.Rejected) || rep.Posted != int(bs.Posted) {
				t.Errorf("ledger check disagrees with the summary %+v:\n%s", bs, rep)
			}
			if !strings.Contains(rep.String(), "2 of them for an amount that is not positive") {
				t.Errorf("report does not count the bad amounts:\n%s", rep)
			}

			// Pinned: correcting the amount afterwards does not post it on
			// a rerun.
			execLedger(t, bad.ledgerLoc(), `UPDATE transfers SET amount = 500 WHERE id = '`+neg+`'`)
			before := readAccounts(t, bad.ledgerLoc())
			if _, err := bad.settle(t, testDate, 100, true); err != nil {
				t.Fatal(err)
			}
			if after := readAccounts(t, bad.ledgerLoc()); !mapsEqual(before, after) {
				t.Errorf("a forced rerun posted a pinned rejection")
			}
			if st := bad.items(t, testDate)[neg]; st != checkpoint.StepRejected {
				t.Errorf("%s is %s after the rerun, want still rejected", neg, st)
			}
		})
	}
}

// overflowLedger seeds smallLedger plus three accounts: A-MAX near the
// int64 limit, A-NEG far below zero (so the opening total still fits) and
// A-SRC, which pays A-MAX enough to overflow in transfer 150: chunk 2 of
// 100-transfer chunks.
func overflowLedger(t *testing.T, l layout) (store, string) {
	t.Helper()
	s := newStore(t, l, smallLedger)
	id := settlement.TransferID(testDate, 150)
	execLedger(t, s.ledgerLoc(),
		`INSERT INTO accounts VALUES ('A-MAX', 9223372036854775797, 0), ('A-NEG', -1000000, 0), ('A-SRC', 1000, 0)`,
		`INSERT INTO opening_balances SELECT '`+testDate+`', id, balance FROM accounts WHERE id IN ('A-MAX', 'A-NEG', 'A-SRC')`,
		`UPDATE transfers SET from_account = 'A-SRC', to_account = 'A-MAX', amount = 11 WHERE id = '`+id+`'`)
	return s, id
}

// TestBalanceOverflowFailsTheRun: a credit that would overflow a balance
// fails the run (not a pinned rejection) naming the account and the
// transfer, and commits nothing of its chunk: the ledger is exactly the
// first chunk's postings. ledger check fails loudly on the same ledger.
func TestBalanceOverflowFailsTheRun(t *testing.T) {
	t.Parallel()
	for _, l := range layouts(t) {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			s, id := overflowLedger(t, l)
			opening := readAccounts(t, s.ledgerLoc())
			res, err := s.settle(t, testDate, 100, false)
			var ov *steps.OverflowError
			if !errors.As(err, &ov) || ov.Key != "A-MAX" || res.Status != checkpoint.RunFailed {
				t.Fatalf("settle: status %q, err %v; want a failed run with an *OverflowError on A-MAX", res.Status, err)
			}
			for _, w := range []string{"A-MAX", "post/" + id, "overflow"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %s", err, w)
				}
			}
			items := s.items(t, testDate)
			if len(items) != 100 {
				t.Errorf("%d items recorded; want the first chunk's 100 and nothing of the failed chunk", len(items))
			}
			if _, ok := items[id]; ok {
				t.Errorf("the overflowing transfer %s was recorded", id)
			}
			// Replay the first 100 transfers by the settlement rules: the
			// ones it accepts are the first chunk's postings, each account
			// they touch written once (one chunk).
			want, check := map[string]int64{}, checkpointtest.LedgerCheck{Opening: map[string]int64{}, Versions: map[string]int64{}}
			for k, v := range opening {
				want[k], check.Opening[k] = v[0], v[0]
			}
			db := openLedger(t, s.ledgerLoc())
			rows, err := db.Query(`SELECT id, from_account, to_account, amount FROM transfers WHERE business_date = $1 ORDER BY id LIMIT 100`, testDate)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var tr checkpointtest.Transfer
				if err := rows.Scan(&tr.ID, &tr.From, &tr.To, &tr.Amount); err != nil {
					t.Fatal(err)
				}
				if want[tr.From] >= tr.Amount {
					want[tr.From] -= tr.Amount
					want[tr.To] += tr.Amount
					check.Applied = append(check.Applied, tr)
					check.Versions[tr.From], check.Versions[tr.To] = 1, 1
				}
			}
			rows.Close()
			db.Close()
			got := map[string]checkpoint.State{}
			for k, v := range readAccounts(t, s.ledgerLoc()) {
				got[k] = checkpoint.State{Value: v[0], Version: v[1], Exists: true}
			}
			for _, p := range check.Problems(got) {
				t.Errorf("the first chunk alone: %s", p)
			}

			ldb := openLedger(t, s.ledgerLoc())
			defer ldb.Close()
			_, err = settlement.Check(context.Background(), ldb, testDate)
			if !errors.Is(err, settlement.ErrOverflow) || !strings.Contains(err.Error(), "A-MAX") || !strings.Contains(err.Error(), id) {
				t.Errorf("ledger check: err = %v; want ErrOverflow naming A-MAX and %s", err, id)
			}
		})
	}
}

// TestSummaryOverflowFailsTheRun: the rejected amounts' total does not fit
// in int64 (going down) while the day's total does: the summary step fails
// loudly, naming the exact total, instead of wrapping.
func TestSummaryOverflowFailsTheRun(t *testing.T) {
	t.Parallel()
	s := newStore(t, sameStoreLayout, settlement.SeedConfig{Accounts: 2, Date: testDate, Seed: 1, Balance: 1000})
	execLedger(t, s.ledgerLoc(),
		`INSERT INTO transfers VALUES ('T-1', '`+testDate+`', 'A-0000001', 'A-0000002', -9223372036854775807)`,
		`INSERT INTO transfers VALUES ('T-2', '`+testDate+`', 'A-0000001', 'A-0000002', 100)`,
		`INSERT INTO transfers VALUES ('T-3', '`+testDate+`', 'A-0000001', 'A-0000002', -5)`)
	res, err := s.settle(t, testDate, 100, false)
	if !errors.Is(err, settlement.ErrOverflow) || res.Status != checkpoint.RunFailed {
		t.Fatalf("settle: status %q, err %v; want a failed run wrapping ErrOverflow", res.Status, err)
	}
	for _, w := range []string{"summary", "rejected amount", "-9223372036854775812"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not name %s", err, w)
		}
	}
}

// TestDayTotalOverflowFailsTheRun: the database's sum refuses to overflow;
// the count step says which total it was.
func TestDayTotalOverflowFailsTheRun(t *testing.T) {
	t.Parallel()
	s := newStore(t, sameStoreLayout, settlement.SeedConfig{Accounts: 2, Date: testDate, Seed: 1, Balance: 1000})
	execLedger(t, s.ledgerLoc(),
		`INSERT INTO transfers VALUES ('T-1', '`+testDate+`', 'A-0000001', 'A-0000002', 9223372036854775807)`,
		`INSERT INTO transfers VALUES ('T-2', '`+testDate+`', 'A-0000001', 'A-0000002', 1)`)
	res, err := s.settle(t, testDate, 100, false)
	if !errors.Is(err, settlement.ErrOverflow) || res.Status != checkpoint.RunFailed {
		t.Fatalf("settle: status %q, err %v; want a failed run wrapping ErrOverflow", res.Status, err)
	}
	for _, w := range []string{"count", "total amount", testDate} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not name %s", err, w)
		}
	}
}

// TestCheckTotalsOverflowLoudly: the opening total and the current total
// are checked sums.
func TestCheckTotalsOverflowLoudly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, stmt, mention string }{
		{"opening total", `UPDATE opening_balances SET balance = 4611686018427387904`, "opening total"},
		{"current total", `UPDATE accounts SET balance = 4611686018427387904`, "current balances"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, sameStoreLayout, settlement.SeedConfig{Accounts: 2, Date: testDate, Seed: 1, Balance: 1000})
			execLedger(t, s.ledgerLoc(), tc.stmt)
			db := openLedger(t, s.ledgerLoc())
			defer db.Close()
			_, err := settlement.Check(context.Background(), db, testDate)
			if !errors.Is(err, settlement.ErrOverflow) || !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("err = %v; want ErrOverflow naming the %s", err, tc.mention)
			}
		})
	}
}

// TestBadInputIsErrBadInput: what the caller got wrong wraps ErrBadInput,
// so the command line exits 2 for it.
func TestBadInputIsErrBadInput(t *testing.T) {
	t.Parallel()
	s := newStore(t, sameStoreLayout, settlement.SeedConfig{Accounts: 2, Date: testDate, Seed: 1, Balance: 1000})
	db := openLedger(t, s.ledgerLoc())
	defer db.Close()
	ctx := context.Background()
	for _, date := range []string{"28/11/2026", "2026-02-30", "2026-11-29"} {
		if _, err := settlement.Check(ctx, db, date); !errors.Is(err, settlement.ErrBadInput) || !strings.Contains(err.Error(), date) {
			t.Errorf("Check %s: err = %v; want ErrBadInput naming the date", date, err)
		}
	}
	empty := openLedger(t, newLocation(t, "empty.db"))
	defer empty.Close()
	if _, err := settlement.Check(ctx, empty, testDate); !errors.Is(err, settlement.ErrBadInput) || !strings.Contains(err.Error(), "not a ledger") {
		t.Errorf("Check on a file that is not a ledger: err = %v; want ErrBadInput", err)
	}
	for _, cfg := range []settlement.SeedConfig{
		{Accounts: 2, Date: "2026-13-01"},
		{Accounts: 1, Date: testDate},
		{Accounts: 2, Date: testDate, Balance: -1},
		{Accounts: 2, Date: testDate, Transfers: -1},
		{Accounts: 3, Date: testDate, Balance: math.MaxInt64 / 2},
	} {
		if err := settlement.Seed(ctx, db, cfg); !errors.Is(err, settlement.ErrBadInput) {
			t.Errorf("Seed %+v: err = %v; want ErrBadInput", cfg, err)
		}
	}
}
