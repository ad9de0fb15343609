package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/internal/rowscan"
)

const (
	// sqlHeldLeases lists the live leases at ?1 whose owner's details
	// (after its first space) are ?2 ('' for all): of running queued runs
	// (by the runs_running_lease index's terms, which hold only runs in
	// flight), then of running partitions of running runs
	// (partitions_claimable).
	sqlHeldLeases = `SELECT id, job, queue, '' AS step, 0 AS idx, lease_owner, fence, lease_until FROM runs
WHERE status = 'running' AND queue IS NOT NULL AND lease_until > ?1
  AND (?2 = '' OR (instr(lease_owner, ' ') > 0 AND substr(lease_owner, instr(lease_owner, ' ') + 1) = ?2))
UNION ALL
SELECT p.run_id, r.job, coalesce(r.queue, ''), p.step_id, p.idx, p.owner, p.fence, p.lease_until
FROM partitions AS p JOIN runs AS r ON r.id = p.run_id
WHERE p.state = 'running' AND p.lease_until > ?1 AND r.status = 'running'
  AND (?2 = '' OR (instr(p.owner, ' ') > 0 AND substr(p.owner, instr(p.owner, ' ') + 1) = ?2))
ORDER BY 4, 1, 5`
)

// HeldLeases implements checkpoint.TakeoverStore.
func (s *Store) HeldLeases(ctx context.Context, details string, now time.Time) ([]checkpoint.HeldLease, error) {
	rows, err := s.rdb.QueryContext(ctx, sqlHeldLeases, fmtTime(now), details)
	if err != nil {
		return nil, s.wrap("list held leases", err)
	}
	defer rows.Close()
	out, err := rowscan.Collect(rows, func(r rowscan.Rows) (checkpoint.HeldLease, error) {
		var h checkpoint.HeldLease
		var until sql.NullString
		err := r.Scan(&h.RunID, &h.Job, &h.Queue, &h.Step, &h.Index, &h.Owner, &h.Fence, &until)
		h.LeaseUntil = parseTime(until)
		return h, err
	})
	return out, s.wrap("list held leases", err)
}

// TakeOverRun implements checkpoint.TakeoverStore: BEGIN IMMEDIATE keeps
// every other claim and write out while it checks the run is still at
// the fence and takes it.
func (s *Store) TakeOverRun(ctx context.Context, req checkpoint.TakeOverRequest) (checkpoint.Claim, bool, error) {
	if err := req.Validate(true); err != nil {
		return checkpoint.Claim{}, false, err
	}
	var c checkpoint.Claim
	var ok bool
	err := s.tx(ctx, "take over run "+req.RunID, func(tx *sql.Tx) error {
		run, err := scanRun(tx.QueryRowContext(ctx, sqlSelectRun, req.RunID))
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		if run.Status != checkpoint.RunRunning || run.Fence != req.AtFence || run.Queue == "" {
			return nil
		}
		take := checkpoint.Takeover{From: run.LeaseOwner, LeaseUntil: run.LeaseUntil}
		c, err = takeTx(ctx, tx, run, take, req.Owner, req.Now, req.LeaseFor, checkpoint.Limit{})
		ok = err == nil
		return err
	})
	if err != nil {
		return checkpoint.Claim{}, false, err
	}
	return c, ok, nil
}
