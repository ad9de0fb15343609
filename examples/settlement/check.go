package settlement

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
)

// Mismatch is an account whose balance is not what the day's transfers make
// it.
type Mismatch struct {
	Account string `json:"account"`
	Want    int64  `json:"want"`
	Got     int64  `json:"got"`
}

// Report is the result of Check.
type Report struct {
	Date         string     `json:"date"`
	Accounts     int        `json:"accounts"`
	Transfers    int        `json:"transfers"`
	Posted       int        `json:"posted"`
	Rejected     int        `json:"rejected"`
	OpeningTotal int64      `json:"opening_total"`
	Total        int64      `json:"total"`
	Mismatches   []Mismatch `json:"mismatches,omitempty"`
}

// OK reports whether the ledger passed every check.
func (r Report) OK() bool { return r.Total == r.OpeningTotal && len(r.Mismatches) == 0 }

func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ledger check %s: %d accounts, %d transfers (%d posted, %d rejected)\n",
		r.Date, r.Accounts, r.Transfers, r.Posted, r.Rejected)
	if r.Total == r.OpeningTotal {
		fmt.Fprintf(&b, "  money conserved: total %d\n", r.Total)
	} else {
		fmt.Fprintf(&b, "  MONEY NOT CONSERVED: total %d, opening total %d (difference %d)\n", r.Total, r.OpeningTotal, r.Total-r.OpeningTotal)
	}
	for i, m := range r.Mismatches {
		if i == 20 {
			fmt.Fprintf(&b, "  ... and %d more accounts\n", len(r.Mismatches)-20)
			break
		}
		fmt.Fprintf(&b, "  WRONG %s: balance %d, want %d (off by %d)\n", m.Account, m.Got, m.Want, m.Got-m.Want)
	}
	if r.OK() {
		b.WriteString("  every account equals its opening balance plus posted incoming minus posted outgoing\n")
	}
	return b.String()
}

// Check audits the ledger for date independently of Stepwise's
// checkpoints: it replays the date's transfers in ascending ID order from
// the opening balances Seed recorded, posting each unless it would overdraw
// its source account (the settlement rule), and compares every account's
// balance and the total with the result: the current balances, or for a
// date followed by a later seeded one, that date's opening balances. It
// reads the ledger only. Dates are settled in order: seed the next date
// after settling the previous one.
func Check(ctx context.Context, db *sql.DB, date string) (Report, error) {
	rep := Report{Date: date}
	want := map[string]int64{}
	rows, err := db.QueryContext(ctx, `SELECT account_id, balance FROM opening_balances WHERE business_date = ?`, date)
	if err != nil {
		return rep, fmt.Errorf("ledger check: read opening balances: %w (was this ledger made by `stepwise ledger seed`?)", err)
	}
	for rows.Next() {
		var id string
		var b int64
		if err := rows.Scan(&id, &b); err != nil {
			rows.Close()
			return rep, err
		}
		want[id] = b
		rep.OpeningTotal += b
	}
	rows.Close()
	if len(want) == 0 {
		return rep, fmt.Errorf("ledger check: no opening balances for %s; seed that date first", date)
	}
	rows, err = db.QueryContext(ctx, `SELECT from_account, to_account, amount FROM transfers WHERE business_date = ? ORDER BY id`, date)
	if err != nil {
		return rep, err
	}
	for rows.Next() {
		var from, to string
		var amount int64
		if err := rows.Scan(&from, &to, &amount); err != nil {
			rows.Close()
			return rep, err
		}
		rep.Transfers++
		if want[from]-amount < 0 {
			rep.Rejected++
			continue
		}
		want[from] -= amount
		want[to] += amount
		rep.Posted++
	}
	rows.Close()
	// Compare with the balances at the end of the day: the current ones,
	// or, once a later date is seeded, that date's opening balances.
	var next sql.NullString
	if err := db.QueryRowContext(ctx, `SELECT min(business_date) FROM opening_balances WHERE business_date > ?`, date).Scan(&next); err != nil {
		return rep, err
	}
	if next.Valid {
		rows, err = db.QueryContext(ctx, `SELECT account_id, balance FROM opening_balances WHERE business_date = ?`, next.String)
	} else {
		rows, err = db.QueryContext(ctx, `SELECT id, balance FROM accounts`)
	}
	if err != nil {
		return rep, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var got int64
		if err := rows.Scan(&id, &got); err != nil {
			return rep, err
		}
		rep.Accounts++
		rep.Total += got
		if w, ok := want[id]; !ok || w != got {
			rep.Mismatches = append(rep.Mismatches, Mismatch{Account: id, Want: w, Got: got})
		}
	}
	sort.Slice(rep.Mismatches, func(i, j int) bool { return rep.Mismatches[i].Account < rep.Mismatches[j].Account })
	return rep, rows.Err()
}
