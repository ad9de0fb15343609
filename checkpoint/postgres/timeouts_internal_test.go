package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

// issue 23.3: the session timeouts follow the lease, and a user's own
// shorter setting in the URL is kept.
func TestSessionTimeoutsFollowTheLease(t *testing.T) {
	const base = "postgres://u@db:5432/d"
	for _, c := range []struct {
		name       string
		cfg        Config
		idle, lock string // "" means not set
	}{
		{"no lease: the 60s default, no lock timeout", Config{URL: base}, "60000", ""},
		{"lease 6s", Config{URL: base, Lease: 6 * time.Second}, "3000", "6000"},
		{"a short lease: at least 1s", Config{URL: base, Lease: time.Second}, "1000", "1000"},
		{"the URL's shorter ones kept", Config{URL: base + "?idle_in_transaction_session_timeout=1500&lock_timeout=2s", Lease: 6 * time.Second},
			"1500", "2s"},
		{"the URL's longer ones shortened", Config{URL: base + "?idle_in_transaction_session_timeout=5min&lock_timeout=0", Lease: 6 * time.Second},
			"3000", "6000"},
		{"explicit settings win over the lease", Config{URL: base, Lease: 6 * time.Second, IdleInTxTimeout: 500 * time.Millisecond, LockTimeout: -1},
			"500", ""},
	} {
		pc, err := c.cfg.poolConfig()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		rp := pc.ConnConfig.RuntimeParams
		if rp["idle_in_transaction_session_timeout"] != c.idle || rp["lock_timeout"] != c.lock {
			t.Errorf("%s: idle_in_transaction_session_timeout %q, lock_timeout %q; want %q, %q",
				c.name, rp["idle_in_transaction_session_timeout"], rp["lock_timeout"], c.idle, c.lock)
		}
	}
}

// The server applies them: a store opened with a 6s lease has sessions
// that end after 3s idle in a transaction.
func TestSessionTimeoutsReachTheServer(t *testing.T) {
	ctx := context.Background()
	st, err := Open(ctx, Config{URL: pgtest.Schema(t), Lease: 6 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var idle, lock string
	if err := st.pool.QueryRow(ctx, "SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('lock_timeout')").
		Scan(&idle, &lock); err != nil {
		t.Fatal(err)
	}
	if idle != "3s" || lock != "6s" {
		t.Errorf("server settings idle_in_transaction_session_timeout %s, lock_timeout %s; want 3s, 6s", idle, lock)
	}
}
