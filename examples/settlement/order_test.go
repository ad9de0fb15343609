package settlement_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/examples/settlement"
)

// TestCheckIsRightWhateverOrderDatesAreSettled seeds and settles three
// dates out of calendar order (29, 28, 30), each settled before the next is
// seeded: every date's check passes, compared with the opening balances of
// the date seeded after it (not the next date in the calendar), and a
// corrupted balance is named alone.
func TestCheckIsRightWhateverOrderDatesAreSettled(t *testing.T) {
	t.Parallel()
	for _, l := range layouts(t) {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			first := smallLedger
			first.Date = "2026-11-29"
			s := newStore(t, l, first)
			s.mustSettle(t, first.Date, 100)
			for i, date := range []string{"2026-11-28", "2026-11-30"} {
				seed(t, s.ledgerLoc(), settlement.SeedConfig{Accounts: 2, Transfers: 600, Date: date, Seed: uint64(20 + i), Balance: 10_000})
				s.mustSettle(t, date, 100)
			}
			want := map[string]string{
				"2026-11-29": "2026-11-28's opening balances (seeded after 2026-11-29)",
				"2026-11-28": "2026-11-30's opening balances (seeded after 2026-11-28)",
				"2026-11-30": "the current balances",
			}
			for date, compared := range want {
				rep := s.check(t, date)
				if !rep.OK() || rep.Posted == 0 {
					t.Fatalf("check of %s:\n%s", date, rep)
				}
				if rep.ComparedWith != compared || !strings.Contains(rep.String(), "compared with "+compared) {
					t.Errorf("check of %s compared with %q; want %q", date, rep.ComparedWith, compared)
				}
			}
			db := openLedger(t, s.ledgerLoc())
			defer db.Close()
			if _, err := db.Exec(`UPDATE accounts SET balance = balance + 1 WHERE id = $1`, settlement.AccountID(7)); err != nil {
				t.Fatal(err)
			}
			rep := s.check(t, "2026-11-30")
			if len(rep.Mismatches) != 1 || rep.Mismatches[0].Account != settlement.AccountID(7) || rep.Mismatches[0].Got != rep.Mismatches[0].Want+1 {
				t.Fatalf("after one balance was corrupted, check names %v; want only %s, off by 1", rep.Mismatches, settlement.AccountID(7))
			}
			for _, date := range []string{"2026-11-28", "2026-11-29"} {
				if rep := s.check(t, date); !rep.OK() {
					t.Errorf("the corruption after 2026-11-30 was seeded shows in %s's check:\n%s", date, rep)
				}
			}
		})
	}
}

// TestSeedRefusesPastAnUnsettledDate: seeding a date while the one seeded
// last is unsettled is refused, naming it and how to go on; seeded anyway,
// the earlier date's check says it has no closing balances instead of
// naming every account wrong.
func TestSeedRefusesPastAnUnsettledDate(t *testing.T) {
	t.Parallel()
	s := newStore(t, sameStoreLayout, smallLedger)
	db := openLedger(t, s.ledgerLoc())
	defer db.Close()
	next := settlement.SeedConfig{Accounts: 2, Transfers: 300, Date: "2026-11-29", Seed: 9, Balance: 10_000}
	err := settlement.Seed(context.Background(), db, next)
	if !errors.Is(err, settlement.ErrUnsettled) || !strings.Contains(err.Error(), testDate) || !strings.Contains(err.Error(), "--allow-unsettled") {
		t.Fatalf("seed past the unsettled %s: %v; want ErrUnsettled naming it and --allow-unsettled", testDate, err)
	}
	if n := count(t, s.ledgerLoc(), `SELECT count(*) FROM transfers WHERE business_date = '2026-11-29'`); n != 0 {
		t.Fatalf("the refused seed left %d transfers", n)
	}
	next.AllowUnsettled = true
	if err := settlement.Seed(context.Background(), db, next); err != nil {
		t.Fatal(err)
	}
	s.mustSettle(t, testDate, 100)
	s.mustSettle(t, next.Date, 100)
	_, err = settlement.Check(context.Background(), db, testDate)
	if !errors.Is(err, settlement.ErrNoSnapshot) || !strings.Contains(err.Error(), "2026-11-29 was seeded before "+testDate+" was settled") {
		t.Fatalf("check of %s, whose next date was seeded before it settled: %v; want ErrNoSnapshot", testDate, err)
	}
	_, err = settlement.Check(context.Background(), db, next.Date)
	if !errors.Is(err, settlement.ErrNoSnapshot) || !strings.Contains(err.Error(), "2026-11-29 was seeded before "+testDate+" was settled") {
		t.Fatalf("check of %s, seeded before %s settled: %v; want ErrNoSnapshot", next.Date, testDate, err)
	}
}
