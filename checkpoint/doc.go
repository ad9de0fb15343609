// Package checkpoint is the contract of Stepwise's durable record: runs,
// attempts, leases, fence numbers, step and item checkpoints, effect plans
// and effect targets, as types, errors and interfaces. It holds no
// database code: each store is a package of its own beside it that
// implements the contract (checkpoint/sqlite, the embedded default), and
// steps, jobs and runner are written against the contract only.
//
// Import rule: checkpoint imports no other Stepwise package and no
// database driver, and never reads the clock; every time it stores is
// passed in by the caller.
//
// The common case is to open a store from a backend package and hand it to
// a runner as a [Store]:
//
//	st, err := sqlite.Open(ctx, sqlite.Config{Path: "stepwise.db"})
//	if err != nil {
//		return err // names the file and what is wrong with it
//	}
//	defer st.Close()
//
// A run is claimed with [Store.Claim], which increments the run's fence
// number. Every later write carries that fence ([Lease]) and is refused with
// [ErrFenced] once another runner has claimed the run, so a runner that lost
// its lease writes nothing.
//
// # What a store must guarantee
//
// Every store implementing [Store] keeps these promises, and the
// conformance suite holds each one to them:
//
//   - Fenced at commit. A write made with a [Lease] (every [Tx] method,
//     Heartbeat, Finish, a schedule's settle) commits only if the run's
//     fence is still the lease's at the moment the transaction commits,
//     not merely when it began: a claim that commits in between makes the
//     whole transaction fail with [ErrFenced] and keep nothing. A store
//     takes a lock on the run that a claim must wait for (SQLite: the one
//     database write lock; a server store: a shared lock on the run row,
//     which a claim's exclusive lock waits for), so either the writer's
//     commit happens before the claim, or the writer fails.
//   - Write transactions are serialised per run. Two [Store.InTx]
//     transactions of one run, or one and a claim of that run, never
//     interleave: what a transaction read of the run's checkpoints and of
//     the effect target keys it read ([Target.Read]) stays true until it
//     commits. Transactions of different runs may run at once.
//   - Keys compare bytewise. Step IDs, item keys and target keys are
//     compared and ordered as byte strings (SQLite's BINARY collation, a
//     server's "C" collation), so range reads that skip finished items
//     ([ItemQuery] From, To, Last) select the same items on every store.
//   - All or nothing. If the function given to InTx returns an error, or
//     any write in it fails, nothing of the transaction is kept, effects
//     written through [Tx.Target] included.
//   - Times are the caller's. A store keeps the times it is given and
//     compares leases with the times it is given, never its own clock.
package checkpoint
