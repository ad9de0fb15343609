package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stepwise-run/stepwise/checkpoint"
)

// Every time below is coalesce($now, now()): the server's clock, unless
// the store runs on the caller's (Config.CallerClock). Durations are
// passed in microseconds.
const (
	// sqlCreateRun creates the run with fence 1 and its first attempt in
	// one statement, or does nothing when the run exists.
	sqlCreateRun = `WITH r AS (
    INSERT INTO runs (id, job, run_key, params, params_hash, status, fence, lease_owner, lease_until, created_at, updated_at,
                      limit_key, limit_max)
    VALUES ($1, $2, $3, $4, $5, 'running', 1, $6,
            coalesce($7::timestamptz, now()) + $8::bigint * interval '1 microsecond',
            coalesce($7::timestamptz, now()), coalesce($7::timestamptz, now()),
            nullif($9::text, ''), $10::integer)
    ON CONFLICT (id) DO NOTHING
    RETURNING ` + runCols + `
), a AS (
    INSERT INTO attempts (run_id, number, fence, owner, status, started_at)
    SELECT id, 1, 1, $6, 'running', created_at FROM r
)
SELECT ` + runCols + ` FROM r`
	// sqlLockRun reads the run to claim and locks it FOR UPDATE: a writer
	// inside InTx holds FOR KEY SHARE, so the claim waits for its commit;
	// a claim holding it makes writers wait, then see the raised fence.
	sqlLockRun = `SELECT ` + runCols + `, coalesce($2::timestamptz, now()) FROM runs WHERE id = $1 FOR UPDATE`
	// sqlTakeRun raises the fence, takes the lease, marks unfinished
	// attempts lost and records the new attempt, in one statement. A
	// limit $7 (not '') is recorded with the run.
	sqlTakeRun = `WITH r AS (
    UPDATE runs SET status = 'running', fence = fence + 1, lease_owner = $2,
        lease_until = coalesce($3::timestamptz, now()) + $4::bigint * interval '1 microsecond',
        error = '', updated_at = coalesce($3::timestamptz, now()), finished_at = NULL,
        limit_key = CASE WHEN $7::text = '' THEN limit_key ELSE $7::text END,
        limit_max = CASE WHEN $7::text = '' THEN limit_max ELSE $8::integer END
    WHERE id = $1 AND fence = $5
    RETURNING ` + runCols + `
), lost AS (
    UPDATE attempts SET status = 'lost', finished_at = coalesce($3::timestamptz, now()),
        error = 'runner stopped without recording an end; taken over by ' || $6::text
    WHERE run_id = $1 AND finished_at IS NULL AND EXISTS (SELECT 1 FROM r)
), a AS (
    INSERT INTO attempts (run_id, number, fence, owner, status, started_at)
    SELECT r.id, (SELECT coalesce(max(number), 0) + 1 FROM attempts WHERE run_id = $1), r.fence, $2, 'running', r.updated_at
    FROM r
    RETURNING number
)
SELECT ` + runCols + `, a.number FROM r, a`
	// sqlHeartbeat extends a live lease (still the holder's, running, not
	// expired at $5 or the server's now(); an expired one is not renewed,
	// see checkpoint.LeaseExpired): to $3 on the caller's clock, or by $4
	// from the server's now(). It returns whether it did, and the run's
	// fence, status and lease as they were, to say why not.
	sqlHeartbeat = `WITH u AS (
    UPDATE runs SET lease_until = coalesce($3::timestamptz, now() + $4::bigint * interval '1 microsecond'),
        updated_at = coalesce($5::timestamptz, now())
    WHERE id = $1 AND fence = $2 AND status = 'running' AND lease_until > coalesce($5::timestamptz, now())
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM u), r.fence, r.status, r.lease_until, coalesce($5::timestamptz, now())
FROM runs AS r WHERE r.id = $1`
	// sqlFinish ends the run and its attempt in one statement, checked
	// against the fence; it returns 1 when the run was still ours.
	sqlFinish = `WITH r AS (
    UPDATE runs SET status = $3::text, error = $4::text, lease_owner = NULL, lease_until = NULL,
        updated_at = coalesce($5::timestamptz, now()),
        finished_at = CASE WHEN $3::text IN ('succeeded', 'abandoned') THEN coalesce($5::timestamptz, now()) END,
        available_at = CASE WHEN $7::bigint > 0 THEN coalesce($5::timestamptz, now()) + $7::bigint * interval '1 microsecond'
            ELSE available_at END
    WHERE id = $1 AND fence = $2
    RETURNING id, updated_at
), a AS (
    UPDATE attempts SET status = $3::text, error = $4::text, finished_at = r.updated_at
    FROM r WHERE attempts.run_id = r.id AND attempts.number = $6
)
SELECT count(*) FROM r`
)

// Claim implements checkpoint.Store: BEGIN, the create-or-nothing insert
// and the FOR UPDATE read go in one round trip; a run that exists is then
// taken over by one more statement (fence raised, attempt recorded).
func (s *Store) Claim(ctx context.Context, req checkpoint.ClaimRequest) (checkpoint.Claim, error) {
	if err := req.Validate(s.cfg.CallerClock); err != nil {
		return checkpoint.Claim{}, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return checkpoint.Claim{}, s.wrap("claim run "+req.RunID, err)
	}
	defer conn.Release()
	c, err := s.claim(ctx, conn.Conn(), req)
	if err != nil {
		rollback(ctx, conn.Conn())
		return checkpoint.Claim{}, s.wrap("claim run "+req.RunID, err)
	}
	return c, nil
}

func (s *Store) claim(ctx context.Context, conn *pgx.Conn, req checkpoint.ClaimRequest) (checkpoint.Claim, error) {
	now := s.clock(req.Now)
	lease := req.LeaseFor.Microseconds()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(sqlCreateRun, req.RunID, req.Job, req.RunKey, string(req.Params), req.ParamsHash, req.Owner, now, lease,
		req.Limit.Key, req.Limit.Max)
	b.Queue(sqlLockRun, req.RunID, now)
	br := conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return checkpoint.Claim{}, err
	}
	created, cerr := scanRun(br.QueryRow())
	var dbNow time.Time
	run, lerr := scanRun(br.QueryRow(), &dbNow)
	if err := br.Close(); err != nil {
		return checkpoint.Claim{}, err
	}
	switch {
	case cerr == nil:
		if err := s.checkLimit(ctx, conn, req.RunID, req.Limit, now); err != nil {
			return checkpoint.Claim{}, err
		}
		if err := insertAudits(ctx, conn, req.Audits...); err != nil {
			return checkpoint.Claim{}, err
		}
		if err := commit(ctx, conn); err != nil {
			return checkpoint.Claim{}, err
		}
		return checkpoint.Claim{
			Lease:   checkpoint.Lease{RunID: req.RunID, Fence: 1, Attempt: 1, Owner: req.Owner},
			Run:     created,
			Created: true,
		}, nil
	case !errors.Is(cerr, pgx.ErrNoRows):
		return checkpoint.Claim{}, cerr
	case lerr != nil:
		return checkpoint.Claim{}, lerr
	}
	take, err := checkpoint.MayClaim(run, req, dbNow)
	if err != nil {
		return checkpoint.Claim{}, err
	}
	tookOver, prevUntil := take.From, take.LeaseUntil
	limit := req.Limit
	if limit.IsZero() {
		limit = run.Limit
	}
	if err := s.checkLimit(ctx, conn, run.ID, limit, now); err != nil {
		return checkpoint.Claim{}, err
	}
	previous := run.Status
	var number int
	taken, err := scanRun(conn.QueryRow(ctx, sqlTakeRun, run.ID, req.Owner, now, lease, run.Fence,
		checkpoint.OwnerName(req.Owner), req.Limit.Key, req.Limit.Max), &number)
	if errors.Is(err, pgx.ErrNoRows) {
		// Unreachable while the row is locked FOR UPDATE; kept as a guard.
		return checkpoint.Claim{}, fmt.Errorf("%w: run %s changed while being claimed", checkpoint.ErrFenced, run.ID)
	}
	if err != nil {
		return checkpoint.Claim{}, err
	}
	// After the take, in its transaction: a record refused undoes it.
	if err := insertAudits(ctx, conn, req.Audits...); err != nil {
		return checkpoint.Claim{}, err
	}
	if err := commit(ctx, conn); err != nil {
		return checkpoint.Claim{}, err
	}
	return checkpoint.Claim{
		Lease:              checkpoint.Lease{RunID: run.ID, Fence: taken.Fence, Attempt: number, Owner: req.Owner},
		Run:                taken,
		TookOverFrom:       tookOver,
		PreviousStatus:     previous,
		PreviousLeaseUntil: prevUntil,
	}, nil
}

// Heartbeat implements checkpoint.Store. On the server's clock the lease
// is extended by until - now from the server's now().
func (s *Store) Heartbeat(ctx context.Context, l checkpoint.Lease, now, until time.Time) error {
	ext := until.Sub(now)
	if ext <= 0 {
		return fmt.Errorf("postgres: heartbeat of run %s: until (%v) is not after now (%v)", l.RunID, until, now)
	}
	var (
		renewed   bool
		fence     int64
		status    string
		leaseTill pgtype.Timestamptz
		at        time.Time
	)
	err := s.pool.QueryRow(ctx, sqlHeartbeat, l.RunID, l.Fence, s.clock(until), ext.Microseconds(), s.clock(now)).
		Scan(&renewed, &fence, &status, &leaseTill, &at)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: run %s, attempt %d (fence %d): the run is not recorded", checkpoint.ErrFenced, l.RunID, l.Attempt, l.Fence)
	case err != nil:
		return s.wrap("heartbeat run "+l.RunID, err)
	case renewed:
		return nil
	case fence == l.Fence && status == checkpoint.RunRunning && leaseTill.Valid:
		return checkpoint.LeaseExpired(l, leaseTill.Time, at)
	}
	return fmt.Errorf("%w: run %s, attempt %d (fence %d)", checkpoint.ErrFenced, l.RunID, l.Attempt, l.Fence)
}

// Finish implements checkpoint.Store.
func (s *Store) Finish(ctx context.Context, l checkpoint.Lease, e checkpoint.Ending) error {
	var n int
	if err := s.pool.QueryRow(ctx, sqlFinish, l.RunID, l.Fence, e.Status, e.Error, s.clock(e.At), l.Attempt,
		e.RetryAfter.Microseconds()).Scan(&n); err != nil {
		return s.wrap("finish run "+l.RunID, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: run %s, attempt %d (fence %d)", checkpoint.ErrFenced, l.RunID, l.Attempt, l.Fence)
	}
	return nil
}

// commit commits the connection's transaction. A COMMIT of a transaction
// that failed earlier rolls back, and says so only in its command tag.
func commit(ctx context.Context, conn *pgx.Conn) error {
	tag, err := conn.Exec(ctx, "COMMIT")
	if err != nil {
		return err
	}
	if tag.String() != "COMMIT" {
		return fmt.Errorf("postgres: transaction rolled back at commit (%s)", tag.String())
	}
	return nil
}

// rollback ends a transaction left open on conn. When ctx is done (or the
// rollback fails) the connection is closed instead, which rolls back on
// the server and keeps the pool from reusing it.
func rollback(ctx context.Context, conn *pgx.Conn) {
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return
	}
	if ctx.Err() == nil {
		if _, err := conn.Exec(ctx, "ROLLBACK"); err == nil {
			return
		}
	}
	conn.Close(context.WithoutCancel(ctx))
}
