package postgres

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

func ptr[T any](v T) *T { return &v }

func TestSameIdentityRule(t *testing.T) {
	base := identity{db: "ledger", addr: ptr("10.0.0.5"), port: ptr(int32(5432)), relation: ptr(int64(16400)), sysid: ptr(int64(77)),
		started: time.Date(2026, 11, 30, 4, 0, 0, 123456000, time.UTC)}
	with := func(f func(*identity)) identity { id := base; f(&id); return id }
	for _, c := range []struct {
		name string
		a, b identity
		want bool
	}{
		{"identical", base, base, true},
		{"same cluster by system identifier behind another address", base, with(func(i *identity) { i.addr = ptr("10.0.0.6") }), true},
		{"another cluster at the same address (a proxy)", base, with(func(i *identity) { i.sysid = ptr(int64(78)) }), false},
		{"another database", base, with(func(i *identity) { i.db = "other" }), false},
		{"another relation", base, with(func(i *identity) { i.relation = ptr(int64(16401)) }), false},
		{"table missing on one side", base, with(func(i *identity) { i.relation = nil }), false},
		{"fallback: no system identifier, same address and port", base, with(func(i *identity) { i.sysid = nil }), true},
		{"fallback: no system identifier, another port", base, with(func(i *identity) { i.sysid, i.port = nil, ptr(int32(5433)) }), false},
		{"fallback: two clusters behind one address (NAT), started at other times", with(func(i *identity) { i.sysid = nil }),
			with(func(i *identity) { i.sysid, i.started = nil, i.started.Add(time.Second) }), false},
		{"fallback: Unix sockets report no address", with(func(i *identity) { i.sysid, i.addr = nil, nil }), with(func(i *identity) { i.sysid, i.addr = nil, nil }), false},
	} {
		if got := sameIdentity(c.a, c.b); got != c.want {
			t.Errorf("%s: sameIdentity = %v; want %v", c.name, got, c.want)
		}
	}
}

// The fallback on what the server reports: without the system
// identifier, the store's own database under another spelling is still
// the same, another database of the same server is not.
func TestSameIdentityFallbackOnAServer(t *testing.T) {
	ctx := context.Background()
	loc := pgtest.Schema(t)
	st, err := Open(ctx, Config{URL: loc})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	other := pgtest.Database(t)
	pgtest.Exec(t, other, `CREATE TABLE stepwise_state (key text PRIMARY KEY, value bigint NOT NULL, version bigint NOT NULL)`)
	u, _ := url.Parse(loc)
	q := u.Query()
	q.Set("application_name", "another-spelling")
	u.RawQuery = q.Encode()
	ours, err := identify(ctx, st.pool, checkpoint.StateTable)
	if err != nil {
		t.Fatal(err)
	}
	if ours.sysid == nil || ours.addr == nil {
		t.Fatalf("identity over TCP as %s = %+v; want the system identifier and the address (the test role reads both)", u.User.Username(), ours)
	}
	for _, c := range []struct {
		loc  string
		want bool
	}{{u.String(), true}, {other, false}} {
		d, err := openDatabase(ctx, Config{URL: c.loc}, checkpoint.TargetSpec{Table: checkpoint.StateTable})
		if err != nil {
			t.Fatal(err)
		}
		theirs, err := identify(ctx, d.pool, checkpoint.StateTable)
		d.Close()
		if err != nil {
			t.Fatal(err)
		}
		a, b := ours, theirs
		a.sysid, b.sysid = nil, nil
		if got := sameIdentity(a, b); got != c.want {
			t.Errorf("fallback identity of %s vs the store's: same = %v; want %v (%+v vs %+v)", c.loc, got, c.want, a, b)
		}
	}
}
