package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
)

// Claimers are the numbers of concurrent claimers the claims workload
// measures, each in its own goroutine (one connection each on
// PostgreSQL; SQLite serialises them on its one writer).
var Claimers = []int{1, 4, 16}

// rawClaims is the queue-claim baseline: a minimal queue table of its
// own, claimed by one UPDATE … WHERE id = (SELECT … FOR UPDATE SKIP
// LOCKED LIMIT 1) and finished by one UPDATE, each in its own
// transaction.
type rawClaims interface {
	// claim takes the next queued job for owner; ok false when none.
	claim(ctx context.Context, owner string) (id string, ok bool, err error)
	// finish marks a claimed job done.
	finish(ctx context.Context, id string) error
	// done counts the jobs marked done.
	done(ctx context.Context) (int, error)
}

// claims: ClaimNext + Finish of trivial queued runs, against the raw
// SKIP LOCKED claim + finish, with 1, 4 and 16 claimers. Every run must
// be claimed exactly once on each side.
func (b *bench) claims(n int) error {
	// Over 80 lines: one timed workload, ours and its raw baseline side by side, reads best in one piece.
	for _, c := range Claimers {
		b.say("queue claims with %d claimers: %d queued runs, %d raw queue rows", c, n, n)
		ours, raw, err := b.be.claimSides(b.ctx, fmt.Sprintf("claims%d", c), c, n, true)
		if err != nil {
			return err
		}
		if err := enqueueRuns(b.ctx, ours.Backend, n); err != nil {
			return fmt.Errorf("enqueue: %w", err)
		}
		// Statistics as a queue in service has them, on both sides (the
		// raw side's are taken when it is seeded): a table just filled
		// looks empty to the planner, which then sorts every due run
		// instead of reading the queue's index in order. Only runs, which
		// is full now: attempts is empty until the claims fill it, and
		// ANALYZE of an empty table tells the planner it stays empty. Each
		// claimer's connection then caches plans that read attempts end to
		// end, which nothing corrects where autovacuum is off (as on the
		// CI machines): that measured the missing ANALYZE, not the claim
		// (0.41-0.48 at 1 and 4 claimers on PostgreSQL, against 0.7-0.8
		// with attempts left as a new database has it). A served queue's
		// autovacuum re-analyzes attempts as it grows, and each ANALYZE
		// replans.
		if _, err := ours.db.ExecContext(b.ctx, "ANALYZE runs"); err != nil {
			return fmt.Errorf("analyze runs: %w", err)
		}
		var (
			mu   sync.Mutex
			seen = make(map[string]bool, n)
		)
		oursOne := func(owner string) (func() error, bool, error) {
			now := time.Now()
			cl, ok, err := ours.ClaimNext(b.ctx, checkpoint.ClaimNextRequest{Owner: owner, Now: now, LeaseFor: time.Minute})
			if err != nil || !ok {
				return nil, false, err
			}
			mu.Lock()
			dup := seen[cl.Lease.RunID]
			seen[cl.Lease.RunID] = true
			mu.Unlock()
			if dup {
				return nil, false, fmt.Errorf("run %s claimed twice", cl.Lease.RunID)
			}
			return func() error {
				return ours.Finish(b.ctx, cl.Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: time.Now()})
			}, true, nil
		}
		rawSeen := make(map[string]bool, n)
		rawOne := func(owner string) (func() error, bool, error) {
			id, ok, err := raw.claim(b.ctx, owner)
			if err != nil || !ok {
				return nil, false, err
			}
			mu.Lock()
			dup := rawSeen[id]
			rawSeen[id] = true
			mu.Unlock()
			if dup {
				return nil, false, fmt.Errorf("raw job %s claimed twice", id)
			}
			return func() error { return raw.finish(b.ctx, id) }, true, nil
		}
		// Two halves each, alternating, so drift in the machine's load
		// hits both sides alike.
		var tOurs, tRaw time.Duration
		var doneOurs, doneRaw atomic.Int64 // claimed
		for _, target := range []int64{int64(n / 2), int64(n)} {
			d, err := claimUntil(c, &doneOurs, target, oursOne)
			if err != nil {
				return err
			}
			tOurs += d
			if d, err = claimUntil(c, &doneRaw, target, rawOne); err != nil {
				return err
			}
			tRaw += d
		}
		if len(seen) != n || len(rawSeen) != n {
			return fmt.Errorf("%d runs and %d raw jobs claimed; want %d of each", len(seen), len(rawSeen), n)
		}
		if got, err := raw.done(b.ctx); err != nil || got != n {
			return fmt.Errorf("raw: %d jobs done, want %d (%v)", got, n, err)
		}
		b.rate(fmt.Sprintf("queue claims, %d claimers (ClaimNext + Finish)", c), "claims/s", n, tOurs, tRaw, b.goals.claims,
			"raw: UPDATE … WHERE id = (SELECT … FOR UPDATE SKIP LOCKED LIMIT 1), then an UPDATE marking it done")
	}
	return nil
}

// enqueueRuns queues n trivial runs, from 8 goroutines.
func enqueueRuns(ctx context.Context, q checkpoint.QueueStore, n int) error {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		errs = make(chan error, 8)
	)
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				key := fmt.Sprintf("%06d", i)
				if _, err := q.Enqueue(ctx, checkpoint.EnqueueRequest{RunID: "bench/" + key, Job: "bench", RunKey: key,
					Params: []byte("{}"), ParamsHash: "bench", Now: time.Now().Add(-time.Second)}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// claimStall is how long claimers may find nothing to claim, while no
// claimer claims anything and the target is not reached, before
// claimUntil gives up.
const claimStall = 30 * time.Second

// claimUntil runs c claimers of one until claimed reaches target, each
// finishing what it claimed, and returns how long it took, the last
// finish included. A claimer that finds nothing once target runs are
// claimed stops: the last of them are in other claimers' hands, which
// finish them before claimUntil returns (counting finishes instead made a
// claimer on a loaded machine fail while the others finished the last
// three). One that finds nothing before (a claim in flight holds the last
// rows for an instant) backs off a millisecond and tries again; only
// claimStall without any claimer claiming anything fails.
func claimUntil(c int, claimed *atomic.Int64, target int64, one func(owner string) (finish func() error, ok bool, err error)) (time.Duration, error) {
	var (
		wg       sync.WaitGroup
		errs     = make(chan error, c)
		progress atomic.Int64 // when claimed last grew, in Unix nanoseconds
	)
	start := time.Now()
	progress.Store(start.UnixNano())
	for i := range c {
		owner := fmt.Sprintf("%s claimer-%d", runner.DefaultOwner(), i)
		wg.Go(func() {
			for claimed.Load() < target {
				finish, ok, err := one(owner)
				if err != nil {
					errs <- err
					return
				}
				if !ok {
					if stalled := time.Since(time.Unix(0, progress.Load())); stalled > claimStall && claimed.Load() < target {
						errs <- fmt.Errorf("claimer %d found nothing to claim for %s with %d of %d claimed", i, stalled.Round(time.Second), claimed.Load(), target)
						return
					}
					time.Sleep(time.Millisecond)
					continue
				}
				claimed.Add(1)
				progress.Store(time.Now().UnixNano())
				if err := finish(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return time.Since(start), <-errs
}
