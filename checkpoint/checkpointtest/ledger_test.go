package checkpointtest_test

import (
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
)

var accounts = checkpoint.Table{Name: "accounts", Key: "id", Value: "balance", Version: "version"}

// TestLedgerCheckCatchesEachBrokenInvariant seeds a real ledger, applies
// two transfers to it by SQL as a run would, checks it holds, then breaks
// each invariant in turn and checks the checker names it.
func TestLedgerCheckCatchesEachBrokenInvariant(t *testing.T) {
	loc := checkpointtest.NewLocation(t)
	opening := map[string]int64{"a": 100, "b": 50, "c": 0}
	checkpointtest.CreateTable(t, loc, accounts, opening)
	db := checkpointtest.SQL(t, loc)
	for _, q := range []string{
		`UPDATE accounts SET balance = 70, version = 1 WHERE id = 'a'`,
		`UPDATE accounts SET balance = 60, version = 2 WHERE id = 'b'`,
		`UPDATE accounts SET balance = 20, version = 1 WHERE id = 'c'`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	applied := []checkpointtest.Transfer{{ID: "t1", From: "a", To: "b", Amount: 30}, {ID: "t2", From: "b", To: "c", Amount: 20}}
	got := checkpointtest.Balances(t, loc, accounts)
	good := checkpointtest.LedgerCheck{Opening: opening, Applied: applied}
	if p := good.Problems(got); p != nil {
		t.Fatalf("a ledger that holds: %q; want no problems", p)
	}
	checkpointtest.CheckLedger(t, loc, accounts, good)

	with := func(mod func(m map[string]checkpoint.State)) map[string]checkpoint.State {
		m := map[string]checkpoint.State{}
		for k, v := range got {
			m[k] = v
		}
		mod(m)
		return m
	}
	for _, c := range []struct {
		name  string
		check checkpointtest.LedgerCheck
		got   map[string]checkpoint.State
		want  string
	}{
		{"money created", good, with(func(m map[string]checkpoint.State) { m["a"] = checkpoint.State{Value: 71, Version: 1} }), "money not conserved"},
		{"transfer twice", checkpointtest.LedgerCheck{Opening: opening, Applied: append(applied, applied[0])}, got, "transfer t1 is applied more than once"},
		{"transfer lost", checkpointtest.LedgerCheck{Opening: opening, Applied: applied[:1]}, got, "account c = 20, want 0"},
		{"balance moved", good, with(func(m map[string]checkpoint.State) {
			m["a"], m["b"] = checkpoint.State{Value: 60, Version: 1}, checkpoint.State{Value: 70, Version: 2}
		}), "account a = 60, want 70"},
		{"version off", good, with(func(m map[string]checkpoint.State) { m["b"] = checkpoint.State{Value: 60, Version: 3} }), "account b version = 3, want 2"},
		{"version rule", checkpointtest.LedgerCheck{Opening: opening, Applied: applied, Versions: map[string]int64{"a": 1, "b": 1, "c": 1}}, got, "account b version = 2, want 1"},
		{"account missing", good, with(func(m map[string]checkpoint.State) { delete(m, "c") }), "account c is missing"},
		{"account never opened", good, with(func(m map[string]checkpoint.State) { m["d"] = checkpoint.State{} }), "account d is in the ledger but was never opened"},
	} {
		p := c.check.Problems(c.got)
		if c.name == "version off" {
			skip := c.check
			skip.SkipVersions = true
			if sp := skip.Problems(c.got); sp != nil {
				t.Errorf("version off, SkipVersions: problems %q; want none", sp)
			}
		}
		if !strings.Contains(strings.Join(p, "\n"), c.want) {
			t.Errorf("%s: problems %q; want one naming %q", c.name, p, c.want)
		}
	}
}
