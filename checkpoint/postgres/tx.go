package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stepwise-run/stepwise/checkpoint"
)

// sqlFenceLock is every write transaction's first statement: it locks the
// run row FOR KEY SHARE, which a claim's FOR UPDATE conflicts with, and
// reads the fence. Under READ COMMITTED a plain read of the fence is not
// enough: a claim could commit between the check and our commit. With the
// lock held until we commit, a claim either committed before (the lock
// waits for it, then reads its raised fence: this attempt is fenced) or
// waits for our commit (and then reads our writes).
const sqlFenceLock = `SELECT fence FROM runs WHERE id = $1 FOR KEY SHARE`

// pgTx is the checkpoint.Tx of one InTx call. Its transaction opens
// lazily: the first write sends BEGIN, the fence lock and the write itself
// in one round trip, so a one-step checkpoint costs two round trips (that
// batch and COMMIT) like an autocommit insert costs one.
type pgTx struct {
	ctx   context.Context
	s     *Store
	conn  *pgx.Conn
	lease checkpoint.Lease
	begun bool // BEGIN was sent: the transaction must be ended
	// failed is the error that ended the transaction's usefulness (fenced,
	// or a statement failed, aborting it on the server): every later call
	// returns it and InTx rolls back whatever fn returns.
	failed error
}

// InTx implements checkpoint.Store: fn's writes commit together, and only
// if the run is still at the lease's fence when each was made (the fence
// lock held to the commit makes that the fence at commit).
func (s *Store) InTx(ctx context.Context, l checkpoint.Lease, fn func(checkpoint.Tx) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return s.wrap("write run "+l.RunID, err)
	}
	defer conn.Release()
	t := &pgTx{ctx: ctx, s: s, conn: conn.Conn(), lease: l}
	ferr := fn(t)
	if ferr == nil {
		ferr = t.failed
	}
	if !t.begun {
		return ferr
	}
	if ferr != nil {
		rollback(ctx, t.conn)
		return s.wrap("write run "+l.RunID, ferr)
	}
	if err := commit(ctx, t.conn); err != nil {
		rollback(ctx, t.conn)
		return s.wrap("commit writes of run "+l.RunID, err)
	}
	return nil
}

// Conn returns the connection of the transaction tx belongs to, when tx
// is a PostgreSQL store's, for job code that adds its own SQL to the
// checkpoint's transaction; the transaction is open (and the run's fence
// checked) once Conn returns. It returns an error wrapping
// checkpoint.ErrFenced when the run was claimed by another runner.
func Conn(tx checkpoint.Tx) (*pgx.Conn, error) {
	t, ok := tx.(*pgTx)
	if !ok {
		return nil, fmt.Errorf("postgres: %T is not a PostgreSQL store's transaction", tx)
	}
	if err := t.open(); err != nil {
		return nil, err
	}
	return t.conn, nil
}

// batch returns a batch that opens the transaction first if it is not
// open yet: BEGIN and the fence lock go ahead of the caller's queries.
func (t *pgTx) batch() *pgx.Batch {
	b := &pgx.Batch{}
	if !t.begun {
		b.Queue("BEGIN")
		b.Queue(sqlFenceLock, t.lease.RunID)
	}
	return b
}

// send sends b and, if b opens the transaction, reads BEGIN's and the
// fence lock's results. The caller reads its own results, then Closes.
// Queries pipelined behind the fence lock run before the fence is known,
// so they must either check the fence themselves or be rolled back: a
// fenced transaction is (t.failed makes InTx roll back).
func (t *pgTx) send(b *pgx.Batch) (pgx.BatchResults, error) {
	if t.failed != nil {
		return nil, t.failed
	}
	opening := !t.begun
	t.begun = true
	br := t.conn.SendBatch(t.ctx, b)
	if !opening {
		return br, nil
	}
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, t.fail(err)
	}
	var fence int64
	err := br.QueryRow().Scan(&fence)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		err = fmt.Errorf("%w: run %s is not in %s", checkpoint.ErrNotFound, t.lease.RunID, t.s.where)
	case err == nil && fence != t.lease.Fence:
		err = fmt.Errorf("%w: run %s is at fence %d, this attempt (%d) holds fence %d; it writes nothing more",
			checkpoint.ErrFenced, t.lease.RunID, fence, t.lease.Attempt, t.lease.Fence)
	}
	if err != nil {
		br.Close()
		return nil, t.fail(err)
	}
	return br, nil
}

// open opens the transaction, if no write has yet.
func (t *pgTx) open() error {
	if t.begun {
		return t.failed
	}
	br, err := t.send(t.batch())
	if err != nil {
		return err
	}
	return t.fail(br.Close())
}

// exec runs statements that need no results but their row counts, in one
// round trip (opening the transaction with them if needed).
func (t *pgTx) exec(b *pgx.Batch) ([]pgconn.CommandTag, error) {
	n := len(b.QueuedQueries)
	if !t.begun {
		n -= 2
	}
	br, err := t.send(b)
	if err != nil {
		return nil, err
	}
	tags := make([]pgconn.CommandTag, 0, n)
	for range n {
		tag, err := br.Exec()
		if err != nil {
			br.Close()
			return nil, t.fail(err)
		}
		tags = append(tags, tag)
	}
	return tags, t.fail(br.Close())
}

// fail records err (when not nil) as the end of the transaction's use: a
// failed statement aborts a PostgreSQL transaction, and a fenced one must
// write nothing.
func (t *pgTx) fail(err error) error {
	if err != nil && t.failed == nil {
		t.failed = err
	}
	return err
}
