package settlement_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"testing"

	"github.com/stepwise-run/stepwise/examples/settlement"
)

// seedGolden is the SHA-256 of dump of goldenLedger as the seed made it
// before its inserts were batched in prepared statements: the ledger a
// seed makes is part of what users reproduce (README, the demo), so how
// it is inserted must not change what is inserted.
const seedGolden = "964bab192a63358668b8aecad9d8fd0cffbfe7be15ca1b067267311980651b79"

// goldenLedger has full batches of inserts and a partial last one.
var goldenLedger = settlement.SeedConfig{Accounts: 1201, Transfers: 2345, Date: testDate, Seed: 3, Balance: 5000}

func TestSeedMakesTheSameLedgerAsBefore(t *testing.T) {
	t.Parallel()
	loc := newLocation(t, "golden.db")
	seed(t, loc, goldenLedger)
	if got := fmt.Sprintf("%x", sha256.Sum256([]byte(dump(t, loc)))); got != seedGolden {
		t.Errorf("seed made another ledger than before: its dump's SHA-256 is %s, want %s:\n%.600s", got, seedGolden, dump(t, loc))
	}
}

func TestSeedReportsProgress(t *testing.T) {
	t.Parallel()
	loc := newLocation(t, "progress.db")
	db := openLedger(t, loc)
	defer db.Close()
	var calls [][2]int
	var committed int
	progress := func(done, total int) {
		calls = append(calls, [2]int{done, total})
		if done == total {
			// Another connection sees every transfer: the last report
			// comes after the commit.
			committed = count(t, loc, `SELECT count(*) FROM transfers WHERE business_date = $1`, testDate)
		}
	}
	if err := settlement.SeedReporting(context.Background(), db, goldenLedger, progress); err != nil {
		t.Fatal(err)
	}
	want := [][2]int{{0, 2345}, {500, 2345}, {1000, 2345}, {1500, 2345}, {2000, 2345}, {2345, 2345}}
	if fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Errorf("progress reports %v, want %v", calls, want)
	}
	if committed != goldenLedger.Transfers {
		t.Errorf("at the last progress report another connection saw %d transfers, want %d (committed)", committed, goldenLedger.Transfers)
	}
}
