package checkpointtest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// Transfer is one movement of money between two accounts of a test
// ledger, in int64 minor units.
type Transfer struct {
	ID       string
	From, To string
	Amount   int64
}

// LedgerCheck is what a test ledger (an accounts table seeded with
// CreateTable) must hold after a run: the invariants every settlement
// test checks, in one place.
type LedgerCheck struct {
	// Opening is every account of the ledger and its opening balance.
	Opening map[string]int64
	// Applied are the transfers the run applied, by the protocol's own
	// evidence (completed steps or items, applied plans).
	Applied []Transfer
	// Versions is each account's expected version. Nil expects the
	// number of applied transfers touching the account (one write per
	// transfer); a test whose writes merge several transfers (a chunk)
	// gives its own count.
	Versions map[string]int64
	// SkipVersions checks no versions: for a ledger whose writes merge
	// transfers in a way the test does not follow (a settlement's
	// chunks, partitions committing in any order).
	SkipVersions bool
}

// Problems compares got (each account's balance and version, as Balances
// reads them) with c and returns what is wrong, a sentence each, in a
// stable order: money not conserved, a transfer applied twice, an account
// missing or not opened, a balance other than its opening plus the applied
// transfers' deltas, a version other than the expected one. Nil means the
// ledger holds.
func (c LedgerCheck) Problems(got map[string]checkpoint.State) []string {
	var out []string
	var opened, total int64
	for _, v := range c.Opening {
		opened += v
	}
	for _, s := range got {
		total += s.Value
	}
	if total != opened {
		out = append(out, fmt.Sprintf("money not conserved: %d accounts hold %d, %d accounts opened with %d", len(got), total, len(c.Opening), opened))
	}
	want := map[string]int64{}
	for acct, v := range c.Opening {
		want[acct] = v
	}
	versions := map[string]int64{}
	seen := map[string]bool{}
	for _, x := range c.Applied {
		if seen[x.ID] {
			out = append(out, fmt.Sprintf("transfer %s is applied more than once", x.ID))
		}
		seen[x.ID] = true
		want[x.From] -= x.Amount
		want[x.To] += x.Amount
		versions[x.From]++
		versions[x.To]++
	}
	if c.Versions != nil {
		versions = c.Versions
	}
	for _, acct := range sortedKeys(got) {
		if _, ok := c.Opening[acct]; !ok {
			out = append(out, fmt.Sprintf("account %s is in the ledger but was never opened", acct))
		}
	}
	for _, acct := range sortedKeys(c.Opening) {
		s, ok := got[acct]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("account %s is missing from the ledger", acct))
		case s.Value != want[acct]:
			out = append(out, fmt.Sprintf("account %s = %d, want %d (opening %d plus its applied transfers)", acct, s.Value, want[acct], c.Opening[acct]))
		}
		if ok && !c.SkipVersions && s.Version != versions[acct] {
			out = append(out, fmt.Sprintf("account %s version = %d, want %d", acct, s.Version, versions[acct]))
		}
	}
	return out
}

// CheckLedger reads table in the database at loc and reports each of c's
// problems with t.Errorf.
func CheckLedger(t testing.TB, loc string, table checkpoint.Table, c LedgerCheck) {
	t.Helper()
	for _, p := range c.Problems(Balances(t, loc, table)) {
		t.Errorf("ledger %s: %s", table.Name, p)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
