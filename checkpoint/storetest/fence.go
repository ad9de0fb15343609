package storetest

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// fenceKind is one kind of fenced write the race runs.
type fenceKind struct {
	name string
	// setup prepares the kind on a database where a and b are two hosts.
	setup func(e *env, a, b checkpoint.Store) fencedWrite
}

// fencedWrite is what one kind of fenced write does in a race round.
type fencedWrite struct {
	// prepare, if set, writes what the fenced write needs (a step to
	// reset, a plan to finish) in a transaction of its own before the race.
	prepare func(tx checkpoint.Tx, round int) error
	// write makes A's fenced write inside A's transaction.
	write func(tx checkpoint.Tx, round int) error
	// rows is how many rows of A's write visible can count.
	rows int
	// visible counts the rows of A's write that st shows for the run:
	// rows when all of it committed, 0 when none did.
	visible func(st checkpoint.Store, runID string, round int) (int, error)
}

// fenceKinds are the fenced writes of the contract, each raced against a
// takeover. Every write a Tx offers is here.
func fenceKinds() []fenceKind {
	return []fenceKind{
		{name: "Step", setup: raceStep},
		{name: "ResetStep", setup: raceResetStep},
		{name: "Items", setup: raceItems},
		{name: "AcceptItemChanges", setup: raceAcceptItems},
		{name: "RefuseItemChanges", setup: raceRefuseItems},
		{name: "ChunkPlan", setup: raceChunkPlan},
		{name: "FinishChunk", setup: raceFinishChunk},
		{name: "Outbox", setup: raceOutbox},
		{name: "SameStoreTarget", setup: raceSameStoreTarget}, // tx.Target: targets.go
	}
}

func testFenceRace(t *testing.T, h Harness) {
	// The kinds race side by side, each on a database of its own: a round
	// mostly waits (for B to block, for A's commit), so they all run at
	// once. Under the race detector a round is CPU-bound instead, and too
	// many at once starve the timers and lock waits that pace it, so as
	// many run at once as there are CPUs.
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, len(fenceKinds())+1)
	if raceDetector {
		slots = make(chan struct{}, runtime.GOMAXPROCS(0))
	}
	race := func(name string, fn func(t *testing.T)) {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			t.Run(name, fn)
		})
	}
	for _, k := range fenceKinds() {
		race(k.name, func(t *testing.T) { raceKind(t, h, k) })
	}
	race("ScheduleSettle", func(t *testing.T) { raceScheduleSettle(t, h) })
	t.Run("StaleLeaseWritesNothing", func(t *testing.T) { testStaleLeaseWritesNothing(t, h) })
}

// raceKind runs the rounds of one kind of fenced write on a fresh database.
func raceKind(t *testing.T, h Harness, k fenceKind) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	w := k.setup(e, a, b)
	var waited, fenced int
	for round := range h.Rounds {
		if e.raceRound(a, b, w, round) {
			waited++
		} else {
			fenced++
		}
		if t.Failed() {
			t.Fatalf("round %d of %d failed", round+1, h.Rounds)
		}
	}
	t.Logf("%d rounds: B's claim waited for A's commit %d times, A's commit was fenced %d times", h.Rounds, waited, fenced)
}

// bResult is what B's claim returned and saw.
type bResult struct {
	claim checkpoint.Claim
	err   error
	// early is true when the claim returned before A was let commit.
	early bool
	// seen counts A's rows B read right after its claim returned.
	seen    int
	seenErr error
}

// raceRound runs one round: A claims a fresh run and opens a transaction
// that makes w's write; while it is open, B claims the run, taking it over
// (by expiry on even rounds, by a dead owner on odd ones); then A commits.
// Either A's commit is fenced and nothing of it is visible, or B's claim
// waited for it and sees all of it. It reports whether B waited.
//
// Longer than 80 lines: one round of the race, its interleaving and both judgements kept in one place to be read as one.
func (e *env) raceRound(a, b checkpoint.Store, w fencedWrite, round int) (waited bool) {
	t := e.t
	runID := fmt.Sprintf("race/%04d", round)
	ca := e.claim(a, runID, ownerA, t0)
	if w.prepare != nil {
		e.inTx(a, ca.Lease, func(tx checkpoint.Tx) error { return w.prepare(tx, round) })
	}

	written, release := make(chan struct{}), make(chan struct{})
	errA := make(chan error, 1)
	go func() {
		errA <- a.InTx(e.ctx, ca.Lease, func(tx checkpoint.Tx) error {
			if err := w.write(tx, round); err != nil {
				return err
			}
			close(written)
			<-release
			return nil
		})
	}()
	select {
	case <-written:
	case err := <-errA:
		t.Fatalf("round %d: A's write failed before B claimed: %v", round, err)
	}

	var released atomic.Bool
	bDone := make(chan bResult, 1)
	go func() {
		req := claimReq(runID, ownerB, t0.Add(lease)) // A's lease has run out
		if round%2 == 1 {
			req.Now = t0.Add(time.Second) // A's lease is live, but its owner is gone
			req.OwnerGone = func(owner string) bool { return owner == ownerA }
		}
		c, err := b.Claim(e.ctx, req)
		r := bResult{claim: c, err: err, early: !released.Load()}
		if err == nil {
			r.seen, r.seenErr = w.visible(b, runID, round)
		}
		bDone <- r
	}()
	// Give B's claim a moment to run into A's open transaction; whether
	// it blocks there or goes ahead, the outcome is judged by what
	// committed, not by this timer.
	var br bResult
	bReturned := false
	timer := time.NewTimer(e.h.BlockFor)
	select {
	case <-timer.C:
	case br = <-bDone:
		bReturned = true
		timer.Stop()
	}
	released.Store(true)
	close(release)
	ea := <-errA
	if !bReturned {
		br = <-bDone
	}

	if br.err != nil {
		t.Fatalf("round %d: B's takeover claim failed: %v (A's commit: %v); a claim over an expired or dead owner's lease must succeed", round, br.err, ea)
	}
	if br.seenErr != nil {
		t.Fatalf("round %d: B's read after its claim: %v", round, br.seenErr)
	}
	if br.claim.Lease.Fence != ca.Lease.Fence+1 || br.claim.TookOverFrom != ownerA {
		t.Errorf("round %d: B's claim = fence %d from %q; want fence %d taken over from %q", round, br.claim.Lease.Fence, br.claim.TookOverFrom, ca.Lease.Fence+1, ownerA)
	}
	want := 0
	switch {
	case ea == nil:
		if br.early {
			t.Errorf("round %d: both: B's claim returned before A was let commit, and A's commit then succeeded under the old fence", round)
		}
		if br.seen != w.rows {
			t.Errorf("round %d: both: A's commit succeeded, but B's claim did not wait for it: right after the claim B saw %d of A's %d rows", round, br.seen, w.rows)
		}
		want, waited = w.rows, true
	case errors.Is(ea, checkpoint.ErrFenced):
		if br.seen != 0 {
			t.Errorf("round %d: A's commit was fenced, yet B saw %d of A's %d rows", round, br.seen, w.rows)
		}
	default:
		t.Fatalf("round %d: A's commit failed with %v; want success or ErrFenced", round, ea)
	}
	n, err := w.visible(b, runID, round)
	if err != nil {
		t.Fatalf("round %d: read back after the race: %v", round, err)
	}
	if n != want {
		t.Errorf("round %d: after the race B sees %d of A's %d rows; want %d (A's commit returned %v)", round, n, w.rows, want, ea)
	}
	return waited
}

func raceStep(e *env, _, _ checkpoint.Store) fencedWrite {
	return fencedWrite{
		write: func(tx checkpoint.Tx, round int) error {
			return tx.PutStep(completed("load", fmt.Sprintf(`{"round":%d}`, round)))
		},
		rows: 1,
		visible: func(st checkpoint.Store, runID string, round int) (int, error) {
			n := 0
			err := st.Steps(e.ctx, runID, func(s checkpoint.Step) error {
				if s.ID == "load" && string(s.Output) == fmt.Sprintf(`{"round":%d}`, round) {
					n++
				}
				return nil
			})
			return n, err
		},
	}
}

func raceResetStep(e *env, _, _ checkpoint.Store) fencedWrite {
	return fencedWrite{
		prepare: func(tx checkpoint.Tx, round int) error {
			return tx.PutStep(checkpoint.Step{ID: "batch", Status: checkpoint.StepRunning, StartedAt: t0, FinishedAt: t0})
		},
		write: func(tx checkpoint.Tx, round int) error { return tx.ResetStep("batch") },
		rows:  1,
		visible: func(st checkpoint.Store, runID string, round int) (int, error) {
			n := 1 // the reset is visible when the step is gone
			err := st.Steps(e.ctx, runID, func(s checkpoint.Step) error {
				if s.ID == "batch" {
					n = 0
				}
				return nil
			})
			return n, err
		},
	}
}

// raceItemKeys are the items a race round writes.
var raceItemKeys = []string{"T-1", "T-2", "T-3"}

// countItems counts the items of step that match.
func countItems(e *env, st checkpoint.Store, runID, step string, match func(checkpoint.Item) bool) (int, error) {
	n := 0
	err := st.Items(e.ctx, checkpoint.ItemQuery{RunID: runID, Step: step, Keys: raceItemKeys}, func(it checkpoint.Item) error {
		if match(it) {
			n++
		}
		return nil
	})
	return n, err
}

func raceItems(e *env, _, _ checkpoint.Store) fencedWrite {
	return fencedWrite{
		write: func(tx checkpoint.Tx, round int) error {
			var items []checkpoint.Item
			for _, k := range raceItemKeys {
				items = append(items, checkpoint.Item{Step: "post", Key: k, Status: checkpoint.StepCompleted, Output: []byte(`1`)})
			}
			return tx.PutItems(items)
		},
		rows: len(raceItemKeys),
		visible: func(st checkpoint.Store, runID string, round int) (int, error) {
			return countItems(e, st, runID, "post", func(it checkpoint.Item) bool { return it.Status == checkpoint.StepCompleted })
		},
	}
}

func raceRefuseItems(e *env, _, _ checkpoint.Store) fencedWrite {
	changes := make([]checkpoint.ItemChange, 0, len(raceItemKeys))
	for _, k := range raceItemKeys {
		changes = append(changes, checkpoint.ItemChange{Step: "post", Key: k, Change: "changed", Fingerprint: []byte("new"), Items: 1})
	}
	return fencedWrite{
		prepare: func(tx checkpoint.Tx, round int) error { return nil },
		write:   func(tx checkpoint.Tx, round int) error { return tx.RefuseItemChanges("post", t0, changes) },
		rows:    len(raceItemKeys),
		visible: func(st checkpoint.Store, runID string, round int) (int, error) {
			got, err := st.ItemChanges(e.ctx, runID, "post")
			return len(got), err
		},
	}
}

func raceAcceptItems(e *env, _, _ checkpoint.Store) fencedWrite {
	items := func(fp string) []checkpoint.Item {
		var out []checkpoint.Item
		for _, k := range raceItemKeys {
			out = append(out, checkpoint.Item{Step: "post", Key: k, Status: checkpoint.StepCompleted, Fingerprint: []byte(fp)})
		}
		return out
	}
	return fencedWrite{
		prepare: func(tx checkpoint.Tx, round int) error { return tx.PutItems(items("old")) },
		write: func(tx checkpoint.Tx, round int) error {
			return tx.AcceptItemChanges(audit(fmt.Sprintf("race/%04d", round), "accept", t0), items("new"), nil)
		},
		rows: len(raceItemKeys),
		visible: func(st checkpoint.Store, runID string, round int) (int, error) {
			return countItems(e, st, runID, "post", func(it checkpoint.Item) bool { return string(it.Fingerprint) == "new" })
		},
	}
}

// plannedChunk writes a planned chunk plan of step "post" and its planned
// items.
func plannedChunk(tx checkpoint.Tx) error {
	if err := tx.PutChunkPlan(checkpoint.ChunkPlan{Step: "post", EffectID: "post@1.c1", Plan: []byte(`{"writes":[]}`)}); err != nil {
		return err
	}
	var items []checkpoint.Item
	for _, k := range raceItemKeys {
		items = append(items, checkpoint.Item{Step: "post", Key: k, Status: checkpoint.StepPlanned, Chunk: "post@1.c1"})
	}
	return tx.PutItems(items)
}

// chunkPlanned reports whether post@1.c1 is listed as planned.
func chunkPlanned(e *env, st checkpoint.Store, runID string) (bool, error) {
	plans, err := st.ChunkPlans(e.ctx, runID, "post")
	for _, p := range plans {
		if p.EffectID == "post@1.c1" {
			return true, err
		}
	}
	return false, err
}

func raceChunkPlan(e *env, _, _ checkpoint.Store) fencedWrite {
	return fencedWrite{
		write: func(tx checkpoint.Tx, round int) error { return plannedChunk(tx) },
		rows:  1 + len(raceItemKeys),
		visible: func(st checkpoint.Store, runID string, round int) (int, error) {
			n, err := countItems(e, st, runID, "post", func(it checkpoint.Item) bool {
				return it.Status == checkpoint.StepPlanned && it.Chunk == "post@1.c1"
			})
			if err != nil {
				return 0, err
			}
			planned, err := chunkPlanned(e, st, runID)
			if planned {
				n++
			}
			return n, err
		},
	}
}

func raceFinishChunk(e *env, _, _ checkpoint.Store) fencedWrite {
	return fencedWrite{
		prepare: func(tx checkpoint.Tx, round int) error { return plannedChunk(tx) },
		write:   func(tx checkpoint.Tx, round int) error { return tx.FinishChunk("post", "post@1.c1") },
		rows:    1 + len(raceItemKeys),
		visible: func(st checkpoint.Store, runID string, round int) (int, error) {
			n, err := countItems(e, st, runID, "post", func(it checkpoint.Item) bool { return it.Status == checkpoint.StepCompleted })
			if err != nil {
				return 0, err
			}
			planned, err := chunkPlanned(e, st, runID)
			if !planned {
				n++
			}
			return n, err
		},
	}
}

func raceOutbox(e *env, a, _ checkpoint.Store) fencedWrite {
	capability[outbox](e.t, a, "outbox")
	return fencedWrite{
		write: func(tx checkpoint.Tx, round int) error {
			return tx.Enqueue(checkpoint.Message{Key: fmt.Sprintf("race/%04d/notify", round), Topic: "settled", Payload: []byte(`{}`), CreatedAt: t0})
		},
		rows: 1,
		visible: func(st checkpoint.Store, runID string, round int) (int, error) {
			ms, err := capability[outbox](e.t, st, "outbox").RunMessages(e.ctx, runID)
			return len(ms), err
		},
	}
}

// raceScheduleSettle races a scheduler's settle against another
// scheduler's takeover. The contract has no transaction to hold open
// around a settle (it is one fenced write), so both start together from a
// barrier: either the settle commits first and the takeover's claim sees
// its mark, or the settle is fenced and the mark does not move.
func raceScheduleSettle(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a := capability[schedules](t, e.open(), "schedule store")
	b := capability[schedules](t, e.open(), "schedule store")
	var settled, fenced int
	for round := range h.Rounds {
		name := fmt.Sprintf("race-%04d", round)
		ca, err := a.ClaimSchedule(e.ctx, checkpoint.ScheduleClaimRequest{Name: name, Owner: ownerA, Now: t0, LeaseFor: lease})
		if err != nil {
			t.Fatalf("round %d: A claims the schedule: %v", round, err)
		}
		fire := t0.Add(time.Hour + time.Duration(round)*time.Microsecond)
		req := checkpoint.ScheduleClaimRequest{Name: name, Owner: ownerB, Now: t0.Add(lease), LeaseFor: lease}
		if round%2 == 1 {
			req.Now = t0.Add(time.Second)
			req.OwnerGone = func(owner string) bool { return owner == ownerA }
		}
		start := make(chan struct{})
		errA := make(chan error, 1)
		go func() {
			<-start
			errA <- a.SettleSchedule(e.ctx, ca.Lease, fire, t0.Add(time.Second))
		}()
		type claimResult struct {
			c   checkpoint.ScheduleClaim
			err error
		}
		bDone := make(chan claimResult, 1)
		go func() {
			<-start
			c, err := b.ClaimSchedule(e.ctx, req)
			bDone <- claimResult{c, err}
		}()
		close(start)
		ea, br := <-errA, <-bDone
		if br.err != nil {
			t.Fatalf("round %d: B's takeover of the schedule failed: %v (A's settle: %v)", round, br.err, ea)
		}
		if br.c.Lease.Fence != ca.Lease.Fence+1 || br.c.TookOverFrom != ownerA {
			t.Errorf("round %d: B's claim = %+v; want fence %d taken over from %s", round, br.c, ca.Lease.Fence+1, ownerA)
		}
		want := t0
		switch {
		case ea == nil:
			want = fire
			settled++
		case errors.Is(ea, checkpoint.ErrFenced):
			fenced++
		default:
			t.Fatalf("round %d: A's settle failed with %v; want success or ErrFenced", round, ea)
		}
		if !sameTime(br.c.State.LastFire, want) {
			t.Errorf("round %d: B's claim saw settle mark %s; want %s (A's settle returned %v)", round, br.c.State.LastFire, want, ea)
		}
		states, err := a.Schedules(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range states {
			if s.Name == name && !sameTime(s.LastFire, want) {
				t.Errorf("round %d: settle mark after the race is %s; want %s (A's settle returned %v)", round, s.LastFire, want, ea)
			}
		}
		if t.Failed() {
			t.Fatalf("round %d of %d failed", round+1, h.Rounds)
		}
	}
	t.Logf("%d rounds: A's settle committed before B's claim %d times, was fenced %d times", h.Rounds, settled, fenced)
}

// testStaleLeaseWritesNothing checks every Tx write under a lease taken
// over is refused with ErrFenced and leaves nothing, one at a time.
func testStaleLeaseWritesNothing(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	ca := e.claim(a, "stale/1", ownerA, t0)
	e.inTx(a, ca.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(checkpoint.Step{ID: "open", Status: checkpoint.StepFailed, StartedAt: t0, FinishedAt: t0}); err != nil {
			return err
		}
		return plannedChunk(tx)
	})
	cb := e.claim(b, "stale/1", ownerB, t0.Add(lease))
	writes := map[string]func(tx checkpoint.Tx) error{
		"PutStep":           func(tx checkpoint.Tx) error { return tx.PutStep(completed("late", `1`)) },
		"PutStep over open": func(tx checkpoint.Tx) error { return tx.PutStep(completed("open", `1`)) },
		"ResetStep":         func(tx checkpoint.Tx) error { return tx.ResetStep("open") },
		"PutItems": func(tx checkpoint.Tx) error {
			return tx.PutItems([]checkpoint.Item{{Step: "late", Key: "k", Status: checkpoint.StepCompleted}})
		},
		"AcceptItemChanges": func(tx checkpoint.Tx) error {
			return tx.AcceptItemChanges(audit("stale/1", "accept", t0), []checkpoint.Item{{Step: "post", Key: "T-1", Fingerprint: []byte("x")}}, nil)
		},
		"RefuseItemChanges": func(tx checkpoint.Tx) error {
			return tx.RefuseItemChanges("post", t0, []checkpoint.ItemChange{{Step: "post", Key: "T-1", Change: "changed", Items: 1}})
		},
		"PutChunkPlan": func(tx checkpoint.Tx) error {
			return tx.PutChunkPlan(checkpoint.ChunkPlan{Step: "late", EffectID: "late@1.c1", Plan: []byte(`{}`)})
		},
		"FinishChunk": func(tx checkpoint.Tx) error { return tx.FinishChunk("post", "post@1.c1") },
		"Enqueue": func(tx checkpoint.Tx) error {
			return tx.Enqueue(checkpoint.Message{Key: "stale/1/late", Topic: "t", Payload: []byte(`{}`), CreatedAt: t0})
		},
	}
	for name, w := range writes {
		if err := a.InTx(e.ctx, ca.Lease, w); !errors.Is(err, checkpoint.ErrFenced) {
			t.Errorf("%s under a lease taken over: %v; want ErrFenced", name, err)
		}
	}
	steps := e.steps(b, "stale/1")
	if len(steps) != 1 || steps["open"].Status != checkpoint.StepFailed {
		t.Errorf("steps after fenced writes = %+v; want only the open step, still failed", steps)
	}
	items := e.items(b, checkpoint.ItemQuery{RunID: "stale/1", Step: "post"})
	for _, it := range items {
		if it.Status != checkpoint.StepPlanned || it.Fingerprint != nil {
			t.Errorf("item after fenced writes = %+v; want it planned without a fingerprint", it)
		}
	}
	if late := e.items(b, checkpoint.ItemQuery{RunID: "stale/1", Step: "late"}); len(late) != 0 {
		t.Errorf("items of the fenced PutItems = %+v; want none", late)
	}
	if planned, err := chunkPlanned(e, b, "stale/1"); err != nil || !planned {
		t.Errorf("chunk plan after the fenced FinishChunk: planned %v, %v; want still planned", planned, err)
	}
	if plans, _ := b.ChunkPlans(e.ctx, "stale/1", "late"); len(plans) != 0 {
		t.Errorf("chunk plans of the fenced PutChunkPlan = %+v; want none", plans)
	}
	if ob, ok := b.(outbox); ok {
		if ms, _ := ob.RunMessages(e.ctx, "stale/1"); len(ms) != 0 {
			t.Errorf("messages after the fenced Enqueue = %+v; want none", ms)
		}
	}
	if op, ok := b.(operator); ok {
		if as, _ := op.Audits(e.ctx, "stale/1"); len(as) != 0 {
			t.Errorf("audit after the fenced AcceptItemChanges = %+v; want none", as)
		}
	}
	// The new owner writes as usual.
	e.inTx(b, cb.Lease, func(tx checkpoint.Tx) error { return tx.PutStep(completed("late", `2`)) })
}
