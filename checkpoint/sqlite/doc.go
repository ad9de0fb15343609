// Package sqlite is the checkpoint store kept in one SQLite file
// (modernc.org/sqlite, no cgo): the default store, which needs no server.
// It implements checkpoint.Backend: the checkpoint.Store contract, the
// operator, inspection, outbox and schedule methods, and effect targets in
// the checkpoint file itself (same store) or in other SQLite files
// (separate store).
//
// Import rule: sqlite imports checkpoint and no other Stepwise package.
// Only cmd (and tests) import it; steps, jobs and runner see a
// checkpoint.Store.
//
// The common case opens the file, creating it and bringing its schema up
// to date, and hands the store to a runner:
//
//	st, err := sqlite.Open(ctx, sqlite.Config{Path: "stepwise.db"})
//	if err != nil {
//		return err // names the file and what is wrong with it
//	}
//	defer st.Close()
//
// The database runs in WAL mode with one writer connection, BEGIN
// IMMEDIATE transactions (so a write transaction holds the database's
// write lock from its first statement: this is how it is fenced at commit
// and serialised) and a busy timeout, plus a pool of query-only
// connections for reads that never wait for the writer. Its schema is
// versioned by embedded migrations (migrations/*.sql) and readable with
// the sqlite3 shell; a database from a newer binary is refused with both
// versions named.
package sqlite
