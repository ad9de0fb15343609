package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stepwise-run/stepwise/checkpoint"
)

// queueChannel is the LISTEN/NOTIFY channel Enqueue notifies; the payload
// is the queue's name.
const queueChannel = "stepwise_queue"

// claimedRunCols are runCols of the candidates c in sqlClaimNext.
const claimedRunCols = `c.id, c.job, c.run_key, c.params, c.params_hash, c.status, c.fence,
       c.lease_owner, c.lease_until, c.error, c.created_at, c.updated_at, c.finished_at, c.pruned_at,
       c.queue, c.priority, c.available_at, c.limit_key, c.limit_max`

const (
	// sqlEnqueueRun creates the queued run, notifying listeners at commit,
	// or does nothing when the run exists.
	sqlEnqueueRun = `WITH r AS (
    INSERT INTO runs (id, job, run_key, params, params_hash, status, fence, created_at, updated_at,
                      queue, priority, available_at, limit_key, limit_max)
    VALUES ($1, $2, $3, $4, $5, 'queued', 0, coalesce($6::timestamptz, now()), coalesce($6::timestamptz, now()),
            $7, $8, greatest(coalesce($6::timestamptz, now()), $9::timestamptz), nullif($10::text, ''), $11::integer)
    ON CONFLICT (id) DO NOTHING
    RETURNING ` + runCols + `
)
SELECT ` + runCols + `, (SELECT count(*) FROM (SELECT pg_notify('` + queueChannel + `', $7::text) FROM r) n) FROM r`

	// sqlClaimNext picks up to $8 due runs of the queues $2 and jobs $3
	// (empty arrays match all) whose limit is not full, in claim order,
	// skipping rows other claims hold (stepwise_claim_candidates, whose
	// plan no statistics can change), and takes those without a limit in
	// the same statement: fence raised, lease taken, an unfinished attempt
	// marked lost, the new attempt recorded. A run with a limit is only
	// returned, for claimNext to lock it again and count the limit's
	// holders under the limit's lock. Limits in $6 were found full by this
	// call already. A queued run has never been claimed, so its claim
	// reads nothing from attempts: no attempt of it can be open and its
	// first is number 1 (the hot path of a busy queue touches attempts
	// only to insert).
	sqlClaimNext = `WITH c AS (
    SELECT ` + runCols + ` FROM stepwise_claim_candidates(coalesce($1::timestamptz, now()), $2::text[], $3::text[], $6::text[], $8::integer)
), r AS (
    UPDATE runs SET status = 'running', fence = runs.fence + 1, lease_owner = $4,
        lease_until = coalesce($1::timestamptz, now()) + $5::bigint * interval '1 microsecond',
        error = '', updated_at = coalesce($1::timestamptz, now()), finished_at = NULL
    FROM c WHERE runs.id = c.id AND c.limit_key IS NULL
    RETURNING runs.id, runs.fence AS new_fence, runs.lease_until AS new_until, runs.updated_at AS new_updated
), lost AS (
    UPDATE attempts SET status = 'lost', finished_at = coalesce($1::timestamptz, now()),
        error = 'runner stopped without recording an end; taken over by ' || $7::text
    FROM c JOIN r ON r.id = c.id
    WHERE attempts.run_id = c.id AND attempts.finished_at IS NULL AND c.status <> 'queued'
), a AS (
    INSERT INTO attempts (run_id, number, fence, owner, status, started_at)
    SELECT c.id, CASE WHEN c.status = 'queued' THEN 1 ELSE (SELECT coalesce(max(number), 0) + 1 FROM attempts WHERE run_id = c.id) END,
        r.new_fence, $4, 'running', r.new_updated
    FROM c JOIN r ON r.id = c.id
    RETURNING run_id, number
)
SELECT ` + claimedRunCols + `, r.new_fence, r.new_until, r.new_updated, a.number
FROM c LEFT JOIN r ON r.id = c.id LEFT JOIN a ON a.run_id = c.id
ORDER BY c.priority DESC, c.available_at, c.id`

	// sqlRelockDue locks run $1 again for a claim if it is as sqlClaimNext
	// found it (fence $2, status $3) and still due.
	sqlRelockDue = `SELECT id FROM runs
WHERE id = $1 AND fence = $2 AND status = $3 AND (status <> 'running' OR lease_until <= coalesce($4::timestamptz, now()))
FOR UPDATE SKIP LOCKED`
	// sqlLimitLock serialises the claims of one limit's runs, on every
	// host, until the transaction ends.
	sqlLimitLock = `SELECT pg_advisory_xact_lock(hashtextextended('stepwise limit ' || coalesce(current_schema(), '') || ' ' || $1::text, 0))`
	// sqlLimitHolders lists the runs other than $3 holding limit $1 with a
	// live lease. Sent after sqlLimitLock, it sees every claim of the
	// limit committed before the lock was granted.
	sqlLimitHolders = `SELECT id FROM runs
WHERE limit_key = $1 AND status = 'running' AND lease_until > coalesce($2::timestamptz, now()) AND id <> $3
ORDER BY id`
)

// Enqueue implements checkpoint.QueueStore. A run it creates notifies
// the workers listening (WakeOnEnqueue) when it commits.
func (s *Store) Enqueue(ctx context.Context, req checkpoint.EnqueueRequest) (checkpoint.EnqueueResult, error) {
	if err := req.Validate(s.cfg.CallerClock); err != nil {
		return checkpoint.EnqueueResult{}, err
	}
	var n int
	run, err := scanRun(s.pool.QueryRow(ctx, sqlEnqueueRun, req.RunID, req.Job, req.RunKey, string(req.Params), req.ParamsHash,
		s.clock(req.Now), req.QueueName(), req.Priority, ts(req.NotBefore), req.Limit.Key, req.Limit.Max), &n)
	if err == nil {
		return checkpoint.EnqueueResult{Run: run, Created: true}, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return checkpoint.EnqueueResult{}, s.wrap("enqueue run "+req.RunID, err)
	}
	run, err = scanRun(s.pool.QueryRow(ctx, sqlSelectRun, req.RunID))
	if err != nil {
		return checkpoint.EnqueueResult{}, s.wrap("enqueue run "+req.RunID, err)
	}
	if err := checkpoint.MayEnqueue(run, req); err != nil {
		return checkpoint.EnqueueResult{}, err
	}
	return checkpoint.EnqueueResult{Run: run}, nil
}

// maxFullLimits is how many runs whose limit turned out full one
// ClaimNext passes over before it reports no run due.
const maxFullLimits = 8

// ClaimNext implements checkpoint.QueueStore: ClaimBatch of one run.
func (s *Store) ClaimNext(ctx context.Context, req checkpoint.ClaimNextRequest) (checkpoint.Claim, bool, error) {
	req.Max = 1
	cs, err := s.ClaimBatch(ctx, req)
	if err != nil || len(cs) == 0 {
		return checkpoint.Claim{}, false, err
	}
	return cs[0], true, nil
}

// ClaimBatch implements checkpoint.QueueStore: runs without a limit are
// picked and taken by one statement (FOR UPDATE SKIP LOCKED) in its own
// transaction; one with a limit is picked and locked by it, then taken
// under the limit's advisory lock if its holders leave room.
func (s *Store) ClaimBatch(ctx context.Context, req checkpoint.ClaimNextRequest) ([]checkpoint.Claim, error) {
	if err := req.Validate(s.cfg.CallerClock); err != nil {
		return nil, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, s.wrap("claim the next queued runs", err)
	}
	defer conn.Release()
	cs, err := s.claimBatch(ctx, conn.Conn(), req, nil, nil)
	if err != nil {
		return nil, s.wrap("claim the next queued runs", err)
	}
	return cs, nil
}

// FinishAndClaim implements checkpoint.QueueStore: every end's sqlFinish
// and the claim go to the server in one batch outside BEGIN/COMMIT, which
// runs as one implicit transaction (one Sync): one round trip and one
// commit. Each finish is a primary-key update checked against its fence;
// one that matches no row (fenced) writes nothing.
func (s *Store) FinishAndClaim(ctx context.Context, ends []checkpoint.Finished, next checkpoint.ClaimNextRequest) ([]checkpoint.Claim, []error, error) {
	if err := next.Validate(s.cfg.CallerClock); err != nil {
		return nil, nil, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, s.wrap("finish runs and claim the next", err)
	}
	defer conn.Release()
	results := make([]error, len(ends))
	cs, err := s.claimBatch(ctx, conn.Conn(), next, ends, results)
	if err != nil {
		return nil, nil, s.wrap("finish runs and claim the next", err)
	}
	return cs, results, nil
}

// claimBatch claims up to req.Max runs on conn, recording ends first in
// the same transaction (their outcomes in results). Once some runs are
// claimed (committed), a later try's error ends the batch with them and
// no error: the next claim meets it again.
func (s *Store) claimBatch(ctx context.Context, conn *pgx.Conn, req checkpoint.ClaimNextRequest, ends []checkpoint.Finished, results []error) ([]checkpoint.Claim, error) {
	want := max(req.Max, 1)
	full := []string{}
	var got []checkpoint.Claim
	for range maxFullLimits {
		// A try ends with its runs taken and, for runs with a limit, each
		// taken, found full (its key is passed over next) or taken by
		// another claim meanwhile.
		taken, limited, err := s.claimTry(ctx, conn, req, want-len(got), full, ends, results)
		ends = nil
		if err != nil {
			rollback(ctx, conn)
			if len(got) > 0 {
				return got, nil
			}
			return nil, err
		}
		got = append(got, taken...)
		for _, cand := range limited {
			if len(got) == want {
				break
			}
			c, ok, fullKey, err := s.claimLimited(ctx, conn, req, cand)
			if err != nil {
				rollback(ctx, conn)
				if len(got) > 0 {
					return got, nil
				}
				return nil, err
			}
			if ok {
				got = append(got, c)
			} else if fullKey != "" {
				full = append(full, fullKey)
			}
		}
		if len(limited) == 0 || len(got) == want {
			break
		}
	}
	return got, nil
}

// claimTry sends one sqlClaimNext for up to n runs (after the finish, if
// set): the claims of the runs it took, and the runs with a limit it only
// picked.
func (s *Store) claimTry(ctx context.Context, conn *pgx.Conn, req checkpoint.ClaimNextRequest, n int, full []string,
	ends []checkpoint.Finished, results []error) (taken []checkpoint.Claim, limited []checkpoint.Run, err error) {
	b := &pgx.Batch{}
	for _, f := range ends {
		l, e := f.Lease, f.Ending
		b.Queue(sqlFinish, l.RunID, l.Fence, e.Status, e.Error, s.clock(e.At), l.Attempt, e.RetryAfter.Microseconds())
	}
	b.Queue(sqlClaimNext, s.clock(req.Now), nonNil(req.Queues), nonNil(req.Jobs), req.Owner, req.LeaseFor.Microseconds(), full,
		checkpoint.OwnerName(req.Owner), n)
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	for i, f := range ends {
		var n int
		if err := br.QueryRow().Scan(&n); err != nil {
			return nil, nil, err
		}
		if n == 0 {
			results[i] = fmt.Errorf("%w: run %s, attempt %d (fence %d)", checkpoint.ErrFenced, f.Lease.RunID, f.Lease.Attempt, f.Lease.Fence)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			newFence         pgtype.Int8
			newUntil, newUpd pgtype.Timestamptz
			number           pgtype.Int4
		)
		run, err := scanRun(rows, &newFence, &newUntil, &newUpd, &number)
		if err != nil {
			return nil, nil, err
		}
		if !number.Valid { // a run with a limit: picked, not taken
			limited = append(limited, run)
			continue
		}
		previous, take := run.Status, takeoverOf(run)
		run.Status, run.Fence, run.LeaseOwner, run.LeaseUntil = checkpoint.RunRunning, newFence.Int64, req.Owner, tm(newUntil)
		run.Error, run.UpdatedAt, run.FinishedAt = "", tm(newUpd), time.Time{}
		taken = append(taken, s.nextClaim(run, int(number.Int32), req.Owner, previous, take))
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	return taken, limited, br.Close()
}

// takeoverOf is what claiming run, as picked, takes over: the lease of a
// running run whose runner's lease expired.
func takeoverOf(run checkpoint.Run) checkpoint.Takeover {
	if run.Status == checkpoint.RunRunning {
		return checkpoint.Takeover{From: run.LeaseOwner, LeaseUntil: run.LeaseUntil}
	}
	return checkpoint.Takeover{}
}

// claimLimited claims run, picked by sqlClaimNext but not taken for its
// limit: it locks it again, unchanged and still due, then counts the
// limit's holders under the limit's lock. fullKey is the run's limit when
// that limit was full; ok false and no fullKey means the run was taken or
// changed meanwhile.
func (s *Store) claimLimited(ctx context.Context, conn *pgx.Conn, req checkpoint.ClaimNextRequest, run checkpoint.Run) (c checkpoint.Claim, ok bool, fullKey string, err error) {
	now := s.clock(req.Now)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(sqlRelockDue, run.ID, run.Fence, run.Status, now)
	br := conn.SendBatch(ctx, b)
	_, err = br.Exec()
	var still string
	if err == nil {
		err = br.QueryRow().Scan(&still)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, pgx.ErrNoRows) { // claimed or changed meanwhile
		rollback(ctx, conn)
		return c, false, "", nil
	}
	if err != nil {
		return c, false, "", err
	}
	holders, err := s.limitHolders(ctx, conn, run.ID, run.Limit, now)
	if err != nil {
		return c, false, "", err
	}
	if len(holders) >= run.Limit.Max {
		rollback(ctx, conn)
		return c, false, run.Limit.Key, nil
	}
	var number pgtype.Int4
	taken, err := scanRun(conn.QueryRow(ctx, sqlTakeRun, run.ID, req.Owner, now, req.LeaseFor.Microseconds(), run.Fence,
		checkpoint.OwnerName(req.Owner), "", 0), &number)
	if err != nil {
		return c, false, "", err
	}
	if err := commit(ctx, conn); err != nil {
		return c, false, "", err
	}
	return s.nextClaim(taken, int(number.Int32), req.Owner, run.Status, takeoverOf(run)), true, "", nil
}

// nextClaim is the Claim ClaimNext returns for a run it took.
func (s *Store) nextClaim(run checkpoint.Run, attempt int, owner, previous string, take checkpoint.Takeover) checkpoint.Claim {
	return checkpoint.Claim{
		Lease:              checkpoint.Lease{RunID: run.ID, Fence: run.Fence, Attempt: attempt, Owner: owner},
		Run:                run,
		PreviousStatus:     previous,
		TookOverFrom:       take.From,
		PreviousLeaseUntil: take.LeaseUntil,
	}
}

// limitHolders takes limit's advisory lock in conn's transaction and lists
// the runs other than runID holding it with a live lease.
func (s *Store) limitHolders(ctx context.Context, conn *pgx.Conn, runID string, limit checkpoint.Limit, now any) ([]string, error) {
	b := &pgx.Batch{}
	b.Queue(sqlLimitLock, limit.Key)
	b.Queue(sqlLimitHolders, limit.Key, now, runID)
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	return ids, br.Close()
}

// checkLimit refuses to start runID, in conn's open transaction, when
// limit's other live holders already number limit.Max. Holding the
// limit's lock until the commit keeps every other claim of it waiting.
func (s *Store) checkLimit(ctx context.Context, conn *pgx.Conn, runID string, limit checkpoint.Limit, now any) error {
	if limit.IsZero() {
		return nil
	}
	holders, err := s.limitHolders(ctx, conn, runID, limit, now)
	if err != nil {
		return err
	}
	if len(holders) >= limit.Max {
		return &checkpoint.LimitReachedError{RunID: runID, Limit: limit, Holders: holders}
	}
	return nil
}

// WakeOnEnqueue implements checkpoint.QueueWaker: it LISTENs on a
// connection of its own (not one of the pool's), and reconnects with a
// jittered backoff when that connection is lost.
func (s *Store) WakeOnEnqueue(ctx context.Context) (<-chan struct{}, error) {
	conn, err := s.listen(ctx)
	if err != nil {
		return nil, err
	}
	ch := make(chan struct{}, 1)
	wake := func() {
		select {
		case ch <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
	go func() {
		defer close(ch)
		backoff := 100 * time.Millisecond
		for {
			if conn == nil {
				t := time.NewTimer(backoff/2 + rand.N(backoff))
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
				backoff = min(2*backoff, 5*time.Second)
				if conn, err = s.listen(ctx); err != nil {
					conn = nil
					continue
				}
				backoff = 100 * time.Millisecond
				wake() // enqueues may have gone unheard meanwhile
			}
			_, err := conn.WaitForNotification(ctx)
			if ctx.Err() != nil {
				conn.Close(context.WithoutCancel(ctx))
				return
			}
			if err != nil {
				conn.Close(context.WithoutCancel(ctx))
				conn = nil
				continue
			}
			wake()
		}
	}()
	return ch, nil
}

// listen opens a connection of its own listening on queueChannel.
func (s *Store) listen(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, s.wrap("listen for enqueued runs", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+queueChannel); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, s.wrap("listen for enqueued runs", err)
	}
	return conn, nil
}

// nonNil returns ss, or an empty slice for nil (an empty array, not NULL).
func nonNil(ss []string) []string {
	if ss == nil {
		return []string{}
	}
	return ss
}

var _ checkpoint.QueueWaker = (*Store)(nil)
