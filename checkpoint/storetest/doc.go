// Package storetest is the conformance suite every checkpoint store passes:
// one set of tests, run against each backend, that checks the behaviour the
// checkpoint contract promises (claims and leases, the fence, steps, items,
// chunk plans, effect targets, the outbox, schedules, operator actions,
// and times that come only from the caller).
//
// Import rule: storetest imports checkpoint and the standard library only,
// and tests only through the contract: [checkpoint.Store], [checkpoint.Tx]
// and small interfaces it declares for what lives beside them (operator
// actions, the outbox, schedules, listings). It never reads a backend's
// tables.
//
// The common case is one test in the backend's package that gives the suite
// a [Harness]: how to make a fresh, isolated database and how to open a
// handle on it, and how to make another database of the same kind for
// separate-store effect targets ([TargetDatabase]: its location, and
// plain SQL on it to create the target table and read it back). Several
// handles on one database stand for several hosts.
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness{
//			NewDatabase: func(t *testing.T) string {
//				return filepath.Join(t.TempDir(), "stepwise.db")
//			},
//			NewTargetDatabase: newLedgerFile, // returns a storetest.TargetDatabase
//			Open: func(ctx context.Context, db string) (checkpoint.Store, error) {
//				return sqlite.Open(ctx, sqlite.Config{Path: db})
//			},
//			SchemaVersion: sqlite.SchemaVersion(),
//		})
//	}
//
// A PostgreSQL harness makes a schema (or a database) per test on the
// server named by STEPWISE_TEST_PG and drops it at cleanup; Open connects
// with that schema first on the search path, so every handle of one test
// sees one database and no other test's rows.
//
// A store that reads its own clock in production (PostgreSQL's now())
// sets [Harness.ServerClock] and gives [Harness.OpenCallerClock]: the
// suite then runs on the production handles every test that holds on any
// clock, and on caller-clock handles only the tests that move time past a
// lease or read back the times they gave (and the fence race). The
// concepts run in parallel, each test on a database of its own; the fence
// race runs alone.
//
// The heart of the suite is the fence race: A holds a transaction open
// under its lease with a fenced write made, B takes the run over from
// another handle, then A commits. Exactly one of two outcomes is allowed:
// A's commit fails with ErrFenced and leaves nothing, or B's claim waited
// for A's commit and sees all of it.
package storetest
