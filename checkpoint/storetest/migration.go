package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
)

func testMigration(t *testing.T, h Harness) {
	t.Run("FreshDatabaseMigrates", func(t *testing.T) { migrationFreshDatabaseMigrates(t, h) })
	t.Run("ReopenIsNoOp", func(t *testing.T) { migrationReopenIsNoOp(t, h) })
	t.Run("HostsMigrateOnce", func(t *testing.T) { migrationHostsMigrateOnce(t, h) })
	t.Run("NewerDatabaseRefused", func(t *testing.T) { migrationNewerDatabaseRefused(t, h) })
}

// migrationFreshDatabaseMigrates is the Migration test FreshDatabaseMigrates.
func migrationFreshDatabaseMigrates(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "migrate/fresh", ownerA, t0)
	if !c.Created || c.Lease.Fence != 1 {
		t.Fatalf("first claim on a fresh database = %+v; want a created run at fence 1", c)
	}
	e.checkVersionsOnce("after the first open")
}

// migrationReopenIsNoOp is the Migration test ReopenIsNoOp.
func migrationReopenIsNoOp(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st, err := h.Open(e.ctx, e.db)
	if err != nil {
		t.Fatalf("first open: %v", err)
	}
	c := e.claim(st, "migrate/reopen", ownerA, t0)
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error { return tx.PutStep(completed("load", `{"n":1}`)) })
	if err := st.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	before := e.versions()
	for round := 1; round <= 3; round++ {
		st, err := h.Open(e.ctx, e.db)
		if err != nil {
			t.Fatalf("reopen %d: %v", round, err)
		}
		got := e.steps(st, "migrate/reopen")
		if string(got["load"].Output) != `{"n":1}` {
			t.Errorf("reopen %d: step load = %+v; want the output recorded before", round, got["load"])
		}
		if f, err := st.Fence(e.ctx, "migrate/reopen"); err != nil || f != 1 {
			t.Errorf("reopen %d: fence = %d, %v; want 1 (a reopen claims nothing)", round, f, err)
		}
		if err := st.Close(); err != nil {
			t.Fatalf("close after reopen %d: %v", round, err)
		}
		if after := e.versions(); !slices.Equal(after, before) {
			t.Errorf("reopen %d: schema versions %v; before %v (a reopen must apply nothing)", round, after, before)
		}
	}
	e.checkVersionsOnce("after three reopens")
}

// migrationHostsMigrateOnce is the Migration test HostsMigrateOnce.
func migrationHostsMigrateOnce(t *testing.T, h Harness) {
	e := newEnv(t, h)
	const hosts = 4
	stores := make([]checkpoint.Store, hosts)
	errs := make([]error, hosts)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range hosts {
		wg.Go(func() {
			<-start
			stores[i], errs[i] = h.Open(e.ctx, e.db)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("host %d opening a fresh database with %d others: %v", i, hosts-1, err)
			continue
		}
		t.Cleanup(func() { stores[i].Close() })
	}
	if t.Failed() {
		return
	}
	c := e.claim(stores[0], "migrate/hosts", ownerA, t0)
	for i, st := range stores {
		if f, err := st.Fence(e.ctx, "migrate/hosts"); err != nil || f != c.Lease.Fence {
			t.Errorf("host %d reads fence %d, %v; want %d: every host sees one database", i, f, err, c.Lease.Fence)
		}
	}
	e.checkVersionsOnce(fmt.Sprintf("after %d hosts opened at once", hosts))
}

// migrationNewerDatabaseRefused is the Migration test NewerDatabaseRefused.
func migrationNewerDatabaseRefused(t *testing.T, h Harness) {
	if h.MarkNewer == nil {
		t.Skip("the harness has no MarkNewer hook: it cannot make a database look written by a newer binary")
	}
	e := newEnv(t, h)
	st, err := h.Open(e.ctx, e.db)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	newer := h.SchemaVersion + 7
	h.MarkNewer(t, e.db, newer)
	st, err = h.Open(e.ctx, e.db)
	if err == nil {
		st.Close()
		t.Fatalf("open of a database at schema version %d with a binary knowing %d succeeded; want ErrTooNew", newer, h.SchemaVersion)
	}
	if !errors.Is(err, checkpoint.ErrTooNew) {
		t.Fatalf("open of a newer database: %v; want an error wrapping ErrTooNew", err)
	}
	for _, want := range []string{fmt.Sprint(newer), fmt.Sprint(h.SchemaVersion)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not name version %s; it must name both the database's and the binary's", err, want)
		}
	}
}

// versions returns the recorded schema versions, or nil without the hook.
func (e *env) versions() []int {
	e.t.Helper()
	if e.h.SchemaVersions == nil {
		return nil
	}
	v := e.h.SchemaVersions(e.t, e.db)
	slices.Sort(v)
	return v
}

// checkVersionsOnce checks every schema version up to the harness's is
// recorded once and none beyond it, when the harness can read them.
func (e *env) checkVersionsOnce(when string) {
	e.t.Helper()
	if e.h.SchemaVersions == nil {
		e.t.Logf("the harness cannot read schema versions; not checked %s", when)
		return
	}
	v := e.versions()
	if len(v) == 0 || v[len(v)-1] != e.h.SchemaVersion {
		e.t.Errorf("%s: schema versions %v; want the newest to be %d", when, v, e.h.SchemaVersion)
	}
	if len(slices.Compact(slices.Clone(v))) != len(v) {
		e.t.Errorf("%s: schema versions %v; a version is recorded twice", when, v)
	}
}
