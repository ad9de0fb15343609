package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stepwise-run/stepwise/checkpoint"
)

// sqlFence is every write transaction's first statement: stepwise_fence
// (migration 0005) locks the run row FOR KEY SHARE, which a claim's FOR
// UPDATE conflicts with, and raises codeFenced when the run is at another
// fence than the lease's (codeNoRun when it is gone), so nothing queued
// behind it runs. Under READ COMMITTED a plain read of the fence is not
// enough: a claim could commit between the check and our commit. With the
// lock held until we commit, a claim either committed before (the lock
// waits for it, then reads its raised fence: this attempt is fenced) or
// waits for our commit (and then reads our writes).
const sqlFence = `SELECT stepwise_fence($1, $2)`

// SQLSTATE codes raised by the store's own functions (migration 0005).
const (
	codeFenced  = "SWF01" // the run is at another fence; DETAIL holds it
	codeNoRun   = "SWF02" // the run does not exist
	codeRefused = "SWR01" // a checkpoint write changed fewer rows than it must
	// codePartitionFenced: a partition's write found it claimed since, no
	// longer running, or gone (migration 0008); MESSAGE says which.
	codePartitionFenced = "SWF03"
)

// pgTx is the checkpoint.Tx of one InTx call.
//
// Writes that need no result to go on (PutStep, ResetStep, PutItems,
// PutNewItems, Enqueue, PutChunkPlan, FinishChunk, RefuseItemChanges), made before
// anything else, are not sent but queued. If fn returns nil having made
// only such writes, InTx sends them in ONE batch outside BEGIN/COMMIT,
// behind the fence check: the server runs a batch (one Sync) as one
// implicit transaction, so an error in any statement (a fenced run
// included) rolls all of it back. A lone step checkpoint goes by itself,
// as one statement that checks and locks the fence (deferredWrite.alone):
// one round trip and one statement, as an autocommit insert costs.
//
// Any other call (a Target's statements, Conn, AcceptItemChanges) first
// sends the queued writes through an explicit transaction, which opens
// lazily: its first statement goes to the server in one batch with BEGIN
// and the fence check, and InTx sends COMMIT at the end.
//
// Once it is open, writes that need no result (those above and a
// Target's Write) are pending: they go ahead of the next statement that
// needs results, in its batch, or with COMMIT in one batch. Each raises
// (codeRefused) where the call would have been refused; the server then
// skips the rest of the batch, COMMIT included, and the store rolls back
// and reports the refusal as that call's error.
type pgTx struct {
	ctx   context.Context
	s     *Store
	conn  *pgx.Conn
	lease checkpoint.Lease
	begun bool // BEGIN was sent: the transaction must be ended
	// queued holds the writes made before the transaction opened, in the
	// order they were made.
	queued []deferredWrite
	// pending holds the writes made after the transaction opened, not yet
	// sent: they go ahead of the next statement that needs results, or
	// with COMMIT in InTx's last round trip. Each raises where the write
	// would be refused, aborting the transaction (the server skips the
	// rest of the pipeline, COMMIT included).
	pending []pendingWrite
	// direct: Conn handed the connection to job code, whose own SQL must
	// see every write made before it: from then on writes are sent as they
	// are made, never held.
	direct bool
	// part, in a partition's chunk transaction (InPartitionTx), is the
	// partition written: the transaction is fenced by its row, not the
	// run's, and refuses step checkpoints.
	part *checkpoint.PartitionWrite
	// failed is the error that ended the transaction's usefulness (fenced,
	// or a statement failed, aborting it on the server): every later call
	// returns it and InTx rolls back whatever fn returns.
	failed error
}

// deferredWrite is a write queued for the one-round-trip batch: lone are
// its statements there, each of which raises (aborting the batch) where
// the write would be refused; now makes the write through the explicit
// transaction, reporting a refusal as the call would have.
type deferredWrite struct {
	lone []*pgx.QueuedQuery
	now  func() error
	// alone, when not nil, is the write as one statement that checks the
	// run's fence and locks its row FOR KEY SHARE itself, and changes
	// exactly one row when the write is accepted: InTx sends it by
	// itself, with no fence check ahead of it and no batch, when it is
	// the only write queued.
	alone *pgx.QueuedQuery
}

// pendingWrite is a statement queued in the open transaction: explain,
// when not nil, turns its error into the call's, run after the
// transaction was rolled back (on the idle connection).
type pendingWrite struct {
	q       *pgx.QueuedQuery
	explain func(error) error
}

// InTx implements checkpoint.Store: fn's writes commit together, and only
// if the run is still at the lease's fence when each was made (the fence
// lock held to the commit makes that the fence at commit).
//
// A write fn makes before anything else is reported from InTx, not from
// the call (which returns nil): a refused step checkpoint is InTx's
// *checkpoint.StepConflictError, a fenced run InTx's ErrFenced, and fn
// cannot act on them. What such a write is given is copied, not kept.
func (s *Store) InTx(ctx context.Context, l checkpoint.Lease, fn func(checkpoint.Tx) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return s.wrap("write run "+l.RunID, err)
	}
	defer conn.Release()
	return s.runTx(&pgTx{ctx: ctx, s: s, conn: conn.Conn(), lease: l}, fn)
}

// runTx runs fn on t and ends t: one round trip for queued writes only,
// else COMMIT with the pending ones (see pgTx).
func (s *Store) runTx(t *pgTx, fn func(checkpoint.Tx) error) error {
	ctx, l := t.ctx, t.lease
	ferr := fn(t)
	if ferr == nil {
		ferr = t.failed
	}
	if ferr == nil && t.part != nil && t.part.Progress != nil {
		ferr = t.partitionProgress(t.part.Progress())
	}
	if ferr == nil && !t.begun && len(t.queued) > 0 {
		ferr = t.sendQueued()
		if !t.begun {
			return s.wrap("write run "+l.RunID, ferr)
		}
		// A queued statement failed: the writes were made again in an
		// explicit transaction, open now, which ends below.
	}
	if !t.begun {
		return ferr
	}
	if ferr != nil {
		rollback(ctx, t.conn)
		return s.wrap("write run "+l.RunID, ferr)
	}
	if len(t.pending) > 0 {
		return t.commitPending()
	}
	if err := commit(ctx, t.conn); err != nil {
		rollback(ctx, t.conn)
		return s.wrap("commit writes of run "+l.RunID, err)
	}
	return nil
}

// commitPending sends the pending writes and COMMIT in one batch. If one
// is refused (or fails), the server skips the rest of the batch, COMMIT
// included, and the transaction, aborted, is rolled back.
func (t *pgTx) commitPending() error {
	b := &pgx.Batch{}
	for _, w := range t.pending {
		b.QueuedQueries = append(b.QueuedQueries, w.q)
	}
	b.Queue("COMMIT")
	br := t.conn.SendBatch(t.ctx, b)
	if err := t.readPending(br); err != nil {
		return t.s.wrap("write run "+t.lease.RunID, err)
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && tag.String() != "COMMIT" {
		err = fmt.Errorf("postgres: transaction rolled back at commit (%s)", tag.String())
	}
	if err != nil {
		rollback(t.ctx, t.conn)
		return t.s.wrap("commit writes of run "+t.lease.RunID, err)
	}
	return nil
}

// readPending reads the results of the pending writes, sent at the head
// of br. On an error it closes br, rolls the transaction back, and
// returns (and records) the failed write's own error.
func (t *pgTx) readPending(br pgx.BatchResults) error {
	p := t.pending
	t.pending = nil
	for _, w := range p {
		_, err := br.Exec()
		if err == nil {
			continue
		}
		br.Close()
		rollback(t.ctx, t.conn)
		if w.explain != nil {
			err = w.explain(err)
		}
		return t.fail(err)
	}
	return nil
}

// isRefusal tells whether err is a checkpoint write's refusal
// (stepwise_expect_rows).
func isRefusal(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == codeRefused
}

// pipelining tells whether a write that needs no result is to wait for
// the next round trip: the transaction is open and healthy.
func (t *pgTx) pipelining() bool { return t.begun && t.failed == nil && !t.direct }

// pend queues a statement in the open transaction.
func (t *pgTx) pend(q *pgx.QueuedQuery, explain func(error) error) {
	t.pending = append(t.pending, pendingWrite{q: q, explain: explain})
}

// sendQueued sends the fence check and the queued writes in one batch,
// outside a transaction block: one implicit transaction, committed at its
// Sync when every statement succeeded, rolled back entirely when one
// failed. When one failed other than by the fence, the writes are made
// again through the explicit transaction, so a refused step checkpoint
// that is our own earlier commit still succeeds, and any error reads as
// that call's own.
func (t *pgTx) sendQueued() error {
	if len(t.queued) == 1 && t.queued[0].alone != nil && t.part == nil {
		return t.sendAlone(t.queued[0].alone)
	}
	b := &pgx.Batch{}
	t.queueFence(b)
	for _, w := range t.queued {
		b.QueuedQueries = append(b.QueuedQueries, w.lone...)
	}
	br := t.conn.SendBatch(t.ctx, b)
	var err error
	for range b.QueuedQueries {
		if _, err = br.Exec(); err != nil {
			break
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		t.queued = nil
		return nil
	}
	err = t.fenceError(err)
	var pe *pgconn.PgError
	if errors.Is(err, checkpoint.ErrFenced) || errors.Is(err, checkpoint.ErrNotFound) ||
		!errors.As(err, &pe) || t.conn.IsClosed() || t.conn.PgConn().TxStatus() != 'I' {
		// Fenced, gone, or not known to be rolled back (a lost
		// connection may have committed, as a lost COMMIT may).
		t.queued = nil
		return err
	}
	// The server refused a statement: nothing of the batch was kept.
	return t.flush()
}

// sendAlone sends the only queued write as one autocommit statement (see
// deferredWrite.alone): one round trip, and no pipeline, as a raw insert
// costs. When it changed no row (the run fenced, gone, or the step
// already finished) or the server refused it, nothing was kept, and the
// write is made again through the explicit transaction, whose fence
// check and reads say why, as the batch's fallback does.
func (t *pgTx) sendAlone(q *pgx.QueuedQuery) error {
	tag, err := t.conn.Exec(t.ctx, q.SQL, q.Arguments...)
	if err == nil && tag.RowsAffected() == 1 {
		t.queued = nil
		return nil
	}
	var pe *pgconn.PgError
	if err != nil && (!errors.As(err, &pe) || t.conn.IsClosed() || t.conn.PgConn().TxStatus() != 'I') {
		// Not known to be rolled back (a lost connection may have
		// committed, as a lost COMMIT may).
		t.queued = nil
		return err
	}
	return t.flush()
}

// fenceError turns the fence function's errors into checkpoint's, as
// the fence was reported before it moved to the server; others pass.
func (t *pgTx) fenceError(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case codeFenced:
		fence, perr := strconv.ParseInt(pe.Detail, 10, 64)
		if perr != nil {
			return fmt.Errorf("%w: %s; this attempt (%d) writes nothing more", checkpoint.ErrFenced, pe.Message, t.lease.Attempt)
		}
		return fmt.Errorf("%w: run %s is at fence %d, this attempt (%d) holds fence %d; it writes nothing more",
			checkpoint.ErrFenced, t.lease.RunID, fence, t.lease.Attempt, t.lease.Fence)
	case codeNoRun:
		return fmt.Errorf("%w: run %s is not in %s", checkpoint.ErrNotFound, t.lease.RunID, t.s.where)
	case codePartitionFenced:
		return fmt.Errorf("%w: %s; this holder writes nothing more", checkpoint.ErrFenced, pe.Message)
	}
	return err
}

// Conn returns the connection of the transaction tx belongs to, when tx
// is a PostgreSQL store's, for job code that adds its own SQL to the
// checkpoint's transaction; the transaction is open (and the run's fence
// checked) once Conn returns, with the writes made before it; from then
// on the transaction's writes are sent as they are made, so the job's own
// SQL on the connection sees each of them. It returns
// an error wrapping checkpoint.ErrFenced when the run was claimed by
// another runner.
func Conn(tx checkpoint.Tx) (*pgx.Conn, error) {
	t, ok := tx.(*pgTx)
	if !ok {
		return nil, fmt.Errorf("postgres: %T is not a PostgreSQL store's transaction", tx)
	}
	if err := t.open(); err != nil {
		return nil, err
	}
	t.direct = true
	return t.conn, nil
}

// deferring tells whether a write that needs no result is to be queued:
// nothing has been sent yet.
func (t *pgTx) deferring() bool { return !t.begun && t.failed == nil }

// later queues a write: lone are its statements for the one-round-trip
// batch, now makes it through the explicit transaction.
func (t *pgTx) later(now func() error, lone ...*pgx.QueuedQuery) error {
	t.queued = append(t.queued, deferredWrite{lone: lone, now: now})
	return nil
}

// write makes a write of b's statements, which need no results: queued
// while nothing has been sent, sent now otherwise. wrap, when not nil,
// gives a failed statement's error the call's context.
func (t *pgTx) write(b *pgx.Batch, wrap func(error) error) error {
	now := func() error {
		_, err := t.exec(b)
		if err != nil && wrap != nil {
			return t.fail(wrap(err))
		}
		return err
	}
	if t.pipelining() {
		for _, q := range b.QueuedQueries {
			t.pend(&pgx.QueuedQuery{SQL: q.SQL, Arguments: q.Arguments}, wrap)
		}
		return nil
	}
	if !t.deferring() {
		return now()
	}
	lone := make([]*pgx.QueuedQuery, len(b.QueuedQueries))
	for i, q := range b.QueuedQueries {
		lone[i] = &pgx.QueuedQuery{SQL: q.SQL, Arguments: q.Arguments}
	}
	return t.later(now, lone...)
}

// flush makes the queued writes through the explicit transaction (the
// first opens it), in the order they were made.
func (t *pgTx) flush() error {
	q := t.queued
	t.queued = nil
	for _, w := range q {
		if err := w.now(); err != nil {
			return t.fail(err)
		}
	}
	return nil
}

// send sends b through the explicit transaction, after the queued writes;
// if b opens it, BEGIN and the fence check go ahead of b's statements in
// the same round trip, and send reads their results. The caller reads its
// own results, then Closes. A fenced check aborts the transaction, so
// nothing pipelined behind it runs.
func (t *pgTx) send(b *pgx.Batch) (pgx.BatchResults, error) {
	if t.failed != nil {
		return nil, t.failed
	}
	if err := t.flush(); err != nil {
		return nil, err
	}
	if t.begun {
		if len(t.pending) == 0 {
			return t.conn.SendBatch(t.ctx, b), nil
		}
		ob := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(t.pending)+len(b.QueuedQueries))}
		for _, w := range t.pending {
			ob.QueuedQueries = append(ob.QueuedQueries, w.q)
		}
		ob.QueuedQueries = append(ob.QueuedQueries, b.QueuedQueries...)
		br := t.conn.SendBatch(t.ctx, ob)
		if err := t.readPending(br); err != nil {
			return nil, err
		}
		return br, nil
	}
	t.begun = true
	ob := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 2+len(b.QueuedQueries))}
	ob.Queue("BEGIN")
	t.queueFence(ob)
	ob.QueuedQueries = append(ob.QueuedQueries, b.QueuedQueries...)
	br := t.conn.SendBatch(t.ctx, ob)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, t.fail(err)
	}
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, t.fail(t.fenceError(err))
	}
	return br, nil
}

// open opens the transaction, if no statement has been sent yet, with the
// queued writes.
func (t *pgTx) open() error {
	if t.failed != nil {
		return t.failed
	}
	if err := t.flush(); err != nil || (t.begun && len(t.pending) == 0) {
		return err
	}
	br, err := t.send(&pgx.Batch{})
	if err != nil {
		return err
	}
	return t.fail(br.Close())
}

// exec runs statements that need no results but their row counts, in one
// round trip (opening the transaction with them if needed).
func (t *pgTx) exec(b *pgx.Batch) ([]pgconn.CommandTag, error) {
	n := len(b.QueuedQueries)
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
