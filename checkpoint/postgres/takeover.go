package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/internal/rowscan"
)

const (
	// sqlHeldLeases lists the live leases (at $1 or the server's now())
	// whose owner's details (after its first space) are $2 ('' for all):
	// of running queued runs (by the runs_running_lease index's terms,
	// which hold only runs in flight), then of running partitions of
	// running runs (partitions_claimable).
	sqlHeldLeases = `SELECT id, job, queue, ''::text AS step, 0 AS idx, lease_owner, fence, lease_until FROM runs
WHERE status = 'running' AND queue IS NOT NULL
  AND lease_until > coalesce($1::timestamptz, now())
  AND ($2::text = '' OR (strpos(lease_owner, ' ') > 0 AND substr(lease_owner, strpos(lease_owner, ' ') + 1) = $2::text))
UNION ALL
SELECT p.run_id, r.job, coalesce(r.queue, ''), p.step_id, p.idx, p.owner, p.fence, p.lease_until
FROM partitions AS p JOIN runs AS r ON r.id = p.run_id
WHERE p.state = 'running' AND p.lease_until > coalesce($1::timestamptz, now()) AND r.status = 'running'
  AND ($2::text = '' OR (strpos(p.owner, ' ') > 0 AND substr(p.owner, strpos(p.owner, ' ') + 1) = $2::text))
ORDER BY 4, 1, 5`
)

// HeldLeases implements checkpoint.TakeoverStore.
func (s *Store) HeldLeases(ctx context.Context, details string, now time.Time) ([]checkpoint.HeldLease, error) {
	rows, err := s.pool.Query(ctx, sqlHeldLeases, s.clock(now), details)
	if err != nil {
		return nil, s.wrap("list held leases", err)
	}
	defer rows.Close()
	out, err := rowscan.Collect(rows, func(r rowscan.Rows) (checkpoint.HeldLease, error) {
		var h checkpoint.HeldLease
		var until pgtype.Timestamptz
		err := r.Scan(&h.RunID, &h.Job, &h.Queue, &h.Step, &h.Index, &h.Owner, &h.Fence, &until)
		h.LeaseUntil = tm(until)
		return h, err
	})
	return out, s.wrap("list held leases", err)
}

// TakeOverRun implements checkpoint.TakeoverStore: the run is locked FOR
// UPDATE (waiting for a chunk or write in flight, which holds FOR KEY
// SHARE), checked to be still running at the fence, and taken by the
// statement a claim takes it with.
func (s *Store) TakeOverRun(ctx context.Context, req checkpoint.TakeOverRequest) (checkpoint.Claim, bool, error) {
	if err := req.Validate(s.cfg.CallerClock); err != nil {
		return checkpoint.Claim{}, false, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return checkpoint.Claim{}, false, s.wrap("take over run "+req.RunID, err)
	}
	defer conn.Release()
	c, ok, err := s.takeOverRun(ctx, conn.Conn(), req)
	if err != nil {
		rollback(ctx, conn.Conn())
		return checkpoint.Claim{}, false, s.wrap("take over run "+req.RunID, err)
	}
	return c, ok, nil
}

func (s *Store) takeOverRun(ctx context.Context, conn *pgx.Conn, req checkpoint.TakeOverRequest) (checkpoint.Claim, bool, error) {
	now := s.clock(req.Now)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(sqlLockRun, req.RunID, now)
	br := conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return checkpoint.Claim{}, false, err
	}
	var dbNow time.Time // sqlLockRun's clock, not needed here
	run, err := scanRun(br.QueryRow(), &dbNow)
	if cerr := br.Close(); cerr != nil {
		return checkpoint.Claim{}, false, cerr
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return checkpoint.Claim{}, false, err
	case run.Status == checkpoint.RunRunning && run.Fence == req.AtFence && run.Queue != "":
		return s.takeLocked(ctx, conn, run, req)
	}
	rollback(ctx, conn)
	return checkpoint.Claim{}, false, nil
}

// takeLocked takes over run, locked FOR UPDATE in conn's transaction, and
// commits.
func (s *Store) takeLocked(ctx context.Context, conn *pgx.Conn, run checkpoint.Run, req checkpoint.TakeOverRequest) (checkpoint.Claim, bool, error) {
	now := s.clock(req.Now)
	var number int
	taken, err := scanRun(conn.QueryRow(ctx, sqlTakeRun, run.ID, req.Owner, now, req.LeaseFor.Microseconds(), run.Fence,
		checkpoint.OwnerName(req.Owner), "", 0), &number)
	if err != nil {
		return checkpoint.Claim{}, false, err
	}
	if err := commit(ctx, conn); err != nil {
		return checkpoint.Claim{}, false, err
	}
	return checkpoint.Claim{
		Lease:              checkpoint.Lease{RunID: run.ID, Fence: taken.Fence, Attempt: number, Owner: req.Owner},
		Run:                taken,
		TookOverFrom:       run.LeaseOwner,
		PreviousStatus:     run.Status,
		PreviousLeaseUntil: run.LeaseUntil,
	}, true, nil
}
