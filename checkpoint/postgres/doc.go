// Package postgres is the PostgreSQL backend of the checkpoint store: the
// same runs, attempts, leases, fences and step and item checkpoints as
// checkpoint's SQLite store, kept in a PostgreSQL database that many runner
// processes on many hosts share.
//
// Import rule: postgres imports checkpoint (the contract) and pgx, never
// steps, jobs, runner or cmd; like checkpoint it never reads the clock for
// anything but what the caller passes (leases use the server's now()).
//
// The common case is to open a store from a URL and hand it to a runner:
//
//	st, err := postgres.Open(ctx, postgres.Config{URL: "postgres://stepwise@db.internal/stepwise"})
//	if err != nil {
//		return err // names the server and database, never the password
//	}
//	defer st.Close()
//
// Open brings the schema up to date under an advisory lock, so hosts that
// start together migrate once. Every write transaction ([Store.InTx])
// first takes FOR KEY SHARE on the run's row and checks the lease's fence;
// a claim takes FOR UPDATE on that row and raises the fence, so a claim
// that commits while a writer is inside InTx waits for it, and a writer
// whose run was claimed writes nothing ([checkpoint.ErrFenced]). A
// transaction of writes that need no result (a step's checkpoint, with
// its outbox message) costs one round trip: the fence check and the writes
// go in one batch outside BEGIN/COMMIT, which the server runs as one
// implicit transaction; its outcome, a refusal included, is InTx's. A
// lone step checkpoint is one statement, the upsert that reads the run
// row at the fence and takes FOR KEY SHARE on it itself.
// Writes made after the transaction opened (a target's compare-and-set,
// checkpoints, items, chunk plans, messages) wait for the next statement
// that needs results, or go with COMMIT: an effect step (read, write,
// checkpoint) and a same-store chunk cost two round trips. Such a write
// returns nil; a refusal (a *[checkpoint.VersionConflictError], a
// *[checkpoint.StepConflictError], [checkpoint.ErrItemFinished]) aborts
// the transaction, COMMIT included, and is returned by that next call or
// by InTx.
//
// Leases are computed on the database clock (now()), so clock skew between
// hosts neither shortens nor stretches them; tests that drive a fake clock
// set [Config.CallerClock].
//
// The store is a complete [checkpoint.Backend]: besides the Store contract
// it offers the operator actions (each locks the run row FOR UPDATE, so it
// waits for a write in flight and then fences its runner out), the
// listings show uses, the outbox and the schedules' fenced leases.
//
// Effect targets ([Store.OpenTarget]) are tables of the store's own
// database (effects commit in the checkpoint's transaction) or of another
// database named by a postgres:// URL: the same store when the URL
// reaches the same cluster (pg_control_system()'s system identifier, or
// the server's address and port when the role may not read it), the same
// database and the same relation under its search_path, however the URL
// is spelled; otherwise a separate target with its own pool of two
// connections, the store's timeouts and application name, and a
// stepwise_applied table beside the table. Locations that are not URLs
// (SQLite files) go to [Config.Targets]. Targets and the store offer
// ReadDB, read-only database/sql connections for job code; [OpenDB] gives
// tools a *sql.DB.
//
// Keys (run, step and item IDs) are stored with COLLATE "C": they compare
// bytewise, as on SQLite.
package postgres
