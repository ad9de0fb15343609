package settlement

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/steps"
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
	BadAmount    int        `json:"bad_amount,omitempty"` // rejected for an amount that is not positive
	OpeningTotal int64      `json:"opening_total"`
	Total        int64      `json:"total"`
	Mismatches   []Mismatch `json:"mismatches,omitempty"`
	// ComparedWith names the balances the replay was compared with: "the
	// current balances", or the opening balances of the date seeded
	// next after Date ("2026-11-30's opening balances").
	ComparedWith string `json:"compared_with"`
	// Recorded is true for CheckRecorded's report: which transfers
	// posted came from the recorded outcomes, not from a replay.
	Recorded bool `json:"recorded_outcomes,omitempty"`
	// Problems are what CheckRecorded found besides wrong balances: a
	// transfer without exactly one recorded outcome, a bad amount
	// posted, a balance below zero.
	Problems []string `json:"problems,omitempty"`
}

// Difference is Total minus OpeningTotal in decimal: how much money
// appeared (or, negative, vanished).
func (r Report) Difference() string { return difference(r.Total, r.OpeningTotal) }

// OK reports whether the ledger passed every check.
func (r Report) OK() bool {
	return r.Total == r.OpeningTotal && len(r.Mismatches) == 0 && len(r.Problems) == 0
}

func (r Report) String() string {
	var b strings.Builder
	bad := ""
	if r.BadAmount > 0 {
		bad = fmt.Sprintf(", %d of them for an amount that is not positive", r.BadAmount)
	}
	fmt.Fprintf(&b, "ledger check %s: %d accounts, %d transfers (%d posted, %d rejected%s)\n",
		r.Date, r.Accounts, r.Transfers, r.Posted, r.Rejected, bad)
	if r.ComparedWith != "" {
		fmt.Fprintf(&b, "  replayed from %s's opening balances, compared with %s\n", r.Date, r.ComparedWith)
	}
	if r.Total == r.OpeningTotal {
		fmt.Fprintf(&b, "  money conserved: total %d\n", r.Total)
	} else {
		fmt.Fprintf(&b, "  MONEY NOT CONSERVED: total %d, opening total %d (difference %s)\n", r.Total, r.OpeningTotal, r.Difference())
	}
	if r.Recorded {
		b.WriteString("  posted and rejected as recorded by the partitioned run (its guards saw commit order, not ID order)\n")
	}
	for i, p := range r.Problems {
		if i == 20 {
			fmt.Fprintf(&b, "  ... and %d more problems\n", len(r.Problems)-20)
			break
		}
		fmt.Fprintf(&b, "  WRONG %s\n", p)
	}
	for i, m := range r.Mismatches {
		if i == 20 {
			fmt.Fprintf(&b, "  ... and %d more accounts\n", len(r.Mismatches)-20)
			break
		}
		fmt.Fprintf(&b, "  WRONG %s: balance %d, want %d (off by %s)\n", m.Account, m.Got, m.Want, difference(m.Got, m.Want))
	}
	if r.OK() {
		b.WriteString("  every account equals its opening balance plus posted incoming minus posted outgoing\n")
	}
	return b.String()
}

// The outcomes CheckRecorded takes: a batch item's recorded status
// (checkpoint.StepCompleted and checkpoint.StepRejected).
const (
	OutcomePosted   = "completed"
	OutcomeRejected = "rejected"
)

// ErrBadInput is wrapped by the errors of Check and Seed about what the
// caller asked for: a malformed date, a seed configuration out of range, a
// date the ledger has no opening balances for, a file that is not a ledger.
var ErrBadInput = errors.New("settlement: bad input")

// ErrNoSnapshot is returned by Check when a date next to the checked one in
// the order they were seeded was seeded while the one before it was
// unsettled (SeedConfig.AllowUnsettled): the checked date's opening or
// closing balances were then never recorded.
var ErrNoSnapshot = errors.New("settlement: the ledger has no record of the balances to check against")

// Check audits the ledger for date independently of Stepwise's
// checkpoints: it replays the date's transfers in ascending ID order from
// the opening balances Seed recorded, posting each unless its amount is not
// positive or it would overdraw its source account (the settlement rules),
// and compares every account's balance and the total with the result: the
// current balances, or for a date followed by another seeded after it
// (in the order they were seeded, whatever their dates), that date's
// opening balances. It reads the ledger only. Dates may be seeded and
// settled in any order, one at a time: a date seeded before the previous
// one was settled leaves both without a snapshot to compare with, and Check
// says so (ErrNoSnapshot) instead of naming every account. Every sum is checked:
// one that overflows int64 is an error wrapping ErrOverflow.
func Check(ctx context.Context, db *sql.DB, date string) (Report, error) {
	return check(ctx, db, date, nil)
}

// CheckRecorded audits a settlement whose post step ran in several
// partitions (steps.Partitions): their overdraft guards saw the other
// partitions' credits in commit order, not in ID order, so which
// transfers were rejected cannot be replayed from the ledger alone.
// outcome maps each transfer ID to its recorded item status
// (OutcomePosted, OutcomeRejected: the checkpoint item statuses). It
// checks what holds whatever the order: every transfer has exactly one
// recorded outcome (and no outcome names another), no transfer with an
// amount that is not positive was posted, every balance is its opening
// plus the effects of the posted transfers, none is below zero, and money
// is conserved.
func CheckRecorded(ctx context.Context, db *sql.DB, date string, outcome map[string]string) (Report, error) {
	if outcome == nil {
		outcome = map[string]string{}
	}
	return check(ctx, db, date, outcome)
}

// check is Check, or with outcome CheckRecorded.
func check(ctx context.Context, db *sql.DB, date string, outcome map[string]string) (Report, error) {
	c := &checker{ctx: ctx, db: db, date: date, outcome: outcome, seen: map[string]bool{},
		rep: Report{Date: date, Recorded: outcome != nil}}
	if _, err := time.Parse("2006-01-02", date); err != nil {
		return c.rep, fmt.Errorf("%w: ledger check: date %q is not YYYY-MM-DD", ErrBadInput, date)
	}
	var tables int
	if err := db.QueryRowContext(ctx, dialectOf(db).ledgerTables()).Scan(&tables); err != nil {
		return c.rep, fmt.Errorf("ledger check: read the schema: %w", err)
	}
	if tables != 3 {
		return c.rep, fmt.Errorf("%w: ledger check: the database has no accounts, transfers and opening_balances tables; it is not a ledger made by Seed", ErrBadInput)
	}
	for _, phase := range []func() error{c.readOpening, c.replay, c.recordedProblems, c.compareClosing} {
		if err := phase(); err != nil {
			return c.rep, err
		}
	}
	sort.Slice(c.rep.Mismatches, func(i, j int) bool { return c.rep.Mismatches[i].Account < c.rep.Mismatches[j].Account })
	return c.rep, nil
}

// checker is one ledger check's state, phase by phase: the opening
// balances, the replay of the date's transfers over them (want), the
// problems of a recorded run, and the comparison with the closing
// balances.
type checker struct {
	ctx     context.Context
	db      *sql.DB
	date    string
	outcome map[string]string // CheckRecorded's outcomes; nil for Check
	seen    map[string]bool   // transfers that have a recorded outcome
	open    map[string]int64  // the date's opening balances
	want    map[string]int64  // what the replay makes each balance
	rep     Report
}

// readOpening reads the date's opening balances and their total.
func (c *checker) readOpening() error {
	c.want = map[string]int64{}
	opening := sum{what: "the opening total of " + c.date}
	rows, err := c.db.QueryContext(c.ctx, `SELECT account_id, balance FROM opening_balances WHERE business_date = $1`, c.date)
	if err != nil {
		return fmt.Errorf("ledger check: read opening balances: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var b int64
		if err := rows.Scan(&id, &b); err != nil {
			return err
		}
		c.want[id] = b
		opening.add(b)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("ledger check: read opening balances: %w", err)
	}
	if c.rep.OpeningTotal, err = opening.value(); err != nil {
		return fmt.Errorf("ledger check: %w", err)
	}
	if len(c.want) == 0 {
		return fmt.Errorf("%w: ledger check: no opening balances for %s; seed that date first", ErrBadInput, c.date)
	}
	c.open = maps.Clone(c.want)
	return nil
}

// replay posts the date's transfers in ID order over want: each unless its
// amount is not positive or it would overdraw (Check), or as recorded
// (CheckRecorded).
func (c *checker) replay() error {
	rows, err := c.db.QueryContext(c.ctx, `SELECT id, from_account, to_account, amount FROM transfers WHERE business_date = $1 ORDER BY id`, c.date)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var t Transfer
		if err := rows.Scan(&t.ID, &t.From, &t.To, &t.Amount); err != nil {
			return err
		}
		if err := c.post(t); err != nil {
			return err
		}
	}
	return rows.Err()
}

// post replays one transfer.
func (c *checker) post(t Transfer) error {
	rep := &c.rep
	rep.Transfers++
	if c.outcome != nil {
		c.seen[t.ID] = true
		switch st := c.outcome[t.ID]; {
		case st == OutcomeRejected:
			rep.Rejected++
			if t.Amount <= 0 {
				rep.BadAmount++
			}
			return nil
		case st != OutcomePosted:
			rep.Problems = append(rep.Problems, fmt.Sprintf("transfer %s has no recorded outcome (%q)", t.ID, st))
			return nil
		case t.Amount <= 0:
			rep.Problems = append(rep.Problems, fmt.Sprintf("transfer %s of amount %d was posted", t.ID, t.Amount))
			return nil
		}
	} else if t.Amount <= 0 {
		rep.Rejected++
		rep.BadAmount++
		return nil
	}
	// Each step is a real balance, as the planner computes it: it must
	// fit.
	debit, ok := steps.AddInt64(c.want[t.From], -t.Amount)
	if ok && debit < 0 && c.outcome == nil {
		rep.Rejected++
		return nil
	}
	credit, ok2 := steps.AddInt64(c.want[t.To], t.Amount)
	if !ok || !ok2 {
		acct, bal := t.From, c.want[t.From]
		if ok {
			acct, bal = t.To, c.want[t.To]
		}
		return fmt.Errorf("ledger check: %w: replaying transfer %s of %d from %s to %s: the balance of %s (%d) would not fit in int64 minor units",
			ErrOverflow, t.ID, t.Amount, t.From, t.To, acct, bal)
	}
	c.want[t.From], c.want[t.To] = debit, credit
	rep.Posted++
	return nil
}

// recordedProblems adds, for CheckRecorded, the outcomes that name no
// transfer and the balances the replay leaves below zero.
func (c *checker) recordedProblems() error {
	if c.outcome == nil {
		return nil
	}
	var extra []string
	for id := range c.outcome {
		if !c.seen[id] {
			extra = append(extra, id)
		}
	}
	sort.Strings(extra)
	for _, id := range extra {
		c.rep.Problems = append(c.rep.Problems, fmt.Sprintf("recorded outcome %s names no transfer of %s", id, c.date))
	}
	var below []string
	for id, b := range c.want {
		if b < 0 {
			below = append(below, fmt.Sprintf("account %s ends below zero: %d", id, b))
		}
	}
	sort.Strings(below)
	c.rep.Problems = append(c.rep.Problems, below...)
	return nil
}

// compareClosing compares want with the balances at the end of the day:
// the current ones, or, once another date is seeded after it, that date's
// opening balances; a snapshot seeded past an unsettled date is refused
// (ErrNoSnapshot) rather than compared.
func (c *checker) compareClosing() error {
	prev, next, err := seededNext(c.ctx, c.db, c.date)
	if err != nil {
		return fmt.Errorf("ledger check: %w", err)
	}
	if prev != "" {
		if bad, err := seededUnsettled(c.ctx, c.db, prev, c.date); err != nil {
			return fmt.Errorf("ledger check: %w", err)
		} else if bad {
			return fmt.Errorf("%w: ledger check: %s was seeded before %s was settled, so its opening balances are %s's opening balances unchanged; the ledger has no record of the balances %s opened with (seed each date after settling the one before)",
				ErrNoSnapshot, c.date, prev, prev, c.date)
		}
	}
	total := sum{what: "the total of the current balances"}
	c.rep.ComparedWith = "the current balances"
	var rows *sql.Rows
	if next != "" {
		total.what = "the total of " + next + "'s opening balances"
		c.rep.ComparedWith = next + "'s opening balances (seeded after " + c.date + ")"
		rows, err = c.db.QueryContext(c.ctx, `SELECT account_id, balance FROM opening_balances WHERE business_date = $1`, next)
	} else {
		rows, err = c.db.QueryContext(c.ctx, `SELECT id, balance FROM accounts`)
	}
	if err != nil {
		return err
	}
	defer rows.Close()
	moved := 0
	for rows.Next() {
		var id string
		var got int64
		if err := rows.Scan(&id, &got); err != nil {
			return err
		}
		c.rep.Accounts++
		total.add(got)
		if got != c.open[id] {
			moved++
		}
		if w, ok := c.want[id]; !ok || w != got {
			c.rep.Mismatches = append(c.rep.Mismatches, Mismatch{Account: id, Want: w, Got: got})
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if c.rep.Total, err = total.value(); err != nil {
		return fmt.Errorf("ledger check: %w", err)
	}
	if next != "" && moved == 0 && len(c.rep.Mismatches) > 0 {
		return fmt.Errorf("%w: ledger check: %s was seeded before %s was settled, so its opening balances are %s's opening balances unchanged; the ledger has no record of %s's closing balances (seed each date after settling the one before)",
			ErrNoSnapshot, next, c.date, c.date, c.date)
	}
	return nil
}

// seededNext returns the dates seeded just before and just after date (""
// where there is none): by the order the ledger recorded (seeded_dates),
// or for dates seeded before it recorded one, by business date among
// those, which all come before the recorded ones.
func seededNext(ctx context.Context, db *sql.DB, date string) (prev, next string, err error) {
	var ordered int
	if err := db.QueryRowContext(ctx, dialectOf(db).hasSeedOrder()).Scan(&ordered); err != nil {
		return "", "", fmt.Errorf("read the schema: %w", err)
	}
	one := func(query string, args ...any) string {
		var d sql.NullString
		if err == nil {
			if err = db.QueryRowContext(ctx, query, args...).Scan(&d); errors.Is(err, sql.ErrNoRows) {
				err = nil
			}
		}
		return d.String
	}
	if ordered == 0 {
		prev = one(`SELECT max(business_date) FROM opening_balances WHERE business_date < $1`, date)
		next = one(`SELECT min(business_date) FROM opening_balances WHERE business_date > $1`, date)
		return prev, next, err
	}
	var seq sql.NullInt64
	if err = db.QueryRowContext(ctx, `SELECT seq FROM seeded_dates WHERE business_date = $1`, date).Scan(&seq); errors.Is(err, sql.ErrNoRows) {
		err = nil
	}
	if seq.Valid {
		prev = one(`SELECT business_date FROM seeded_dates WHERE seq < $1 ORDER BY seq DESC LIMIT 1`, seq.Int64)
		next = one(`SELECT business_date FROM seeded_dates WHERE seq > $1 ORDER BY seq LIMIT 1`, seq.Int64)
		if prev == "" {
			prev = one(`SELECT max(business_date) FROM opening_balances
WHERE business_date NOT IN (SELECT business_date FROM seeded_dates)`)
		}
		return prev, next, err
	}
	const legacy = ` AND business_date NOT IN (SELECT business_date FROM seeded_dates)`
	prev = one(`SELECT max(business_date) FROM opening_balances WHERE business_date < $1`+legacy, date)
	if next = one(`SELECT min(business_date) FROM opening_balances WHERE business_date > $1`+legacy, date); next == "" {
		next = one(`SELECT business_date FROM seeded_dates ORDER BY seq LIMIT 1`)
	}
	return prev, next, err
}

// seededUnsettled reports whether date was seeded while prev, the date
// seeded before it, was unsettled: prev has transfers of a positive amount
// and date's opening balances are prev's, every one.
func seededUnsettled(ctx context.Context, db *sql.DB, prev, date string) (bool, error) {
	var movable, moved int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM transfers WHERE business_date = $1 AND amount > 0`, prev).Scan(&movable); err != nil || movable == 0 {
		return false, err
	}
	err := db.QueryRowContext(ctx, `SELECT count(*) FROM opening_balances AS a LEFT JOIN opening_balances AS b
ON b.account_id = a.account_id AND b.business_date = $2
WHERE a.business_date = $1 AND (b.balance IS NULL OR a.balance <> b.balance)`, date, prev).Scan(&moved)
	return moved == 0, err
}
