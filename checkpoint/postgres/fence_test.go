package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

// TestFenceRace stands for two hosts: A writes a step inside InTx while B
// claims the run. Either A fails with ErrFenced and nothing of it is
// visible, or B's claim waited for A's commit and sees A's step; never
// both A's commit and a claim that missed it. A plain read of the fence at
// the start of the transaction fails this test: B's claim commits in the
// middle and A commits anyway.
//
// A round is one of three: B claims before A's write (A is fenced); A's
// transaction is open (Conn) when it writes and B claims while it is (B
// waits); or A's step checkpoint is lone, sent in one batch when fn
// returns, racing B's claim (either outcome).
func TestFenceRace(t *testing.T) {
	url := pgtest.Schema(t)
	a := open(t, postgres.Config{URL: url, CallerClock: true, MaxConns: 2})
	b := open(t, postgres.Config{URL: url, CallerClock: true, MaxConns: 2})
	ctx := context.Background()
	const iterations = 200
	var fenced, waited int
	lone := map[bool]int{} // lone checkpoints committed (true) and fenced
	for i := range iterations {
		runID := fmt.Sprintf("race/%03d", i)
		ca := mustClaim(t, a, claimReq(runID, "host-a:1", t0))
		early, opened := i%3 == 0, i%3 == 1
		wrote := make(chan struct{})
		claimed := make(chan struct{})
		type outcome struct {
			fence int64
			saw   int
			err   error
		}
		bDone := make(chan outcome, 1)
		go func() {
			if !early {
				<-wrote
				// Longer in lone rounds, so A's batch goes first in some.
				d := 300
				if !opened {
					d = 1500
				}
				time.Sleep(time.Duration(rand.IntN(d)) * time.Microsecond)
			}
			cb, err := b.Claim(ctx, claimReq(runID, "host-b:2", t0.Add(2*time.Minute)))
			close(claimed)
			if err != nil {
				bDone <- outcome{err: err}
				return
			}
			saw := 0
			err = b.Steps(ctx, runID, func(checkpoint.Step) error { saw++; return nil })
			bDone <- outcome{fence: cb.Lease.Fence, saw: saw, err: err}
		}()
		aErr := a.InTx(ctx, ca.Lease, func(tx checkpoint.Tx) error {
			if early {
				<-claimed
			}
			if opened {
				if _, err := postgres.Conn(tx); err != nil {
					return err
				}
			}
			err := tx.PutStep(checkpoint.Step{ID: "post/T-1", Status: checkpoint.StepCompleted, Output: []byte(`{"ok":true}`),
				StartedAt: t0, FinishedAt: t0})
			if !early {
				close(wrote)
				time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
			}
			return err
		})
		ob := <-bDone
		if ob.err != nil {
			t.Fatalf("iteration %d: B's claim: %v", i, ob.err)
		}
		if ob.fence != 2 {
			t.Fatalf("iteration %d: B's fence %d, want 2", i, ob.fence)
		}
		after := 0
		if err := b.Steps(ctx, runID, func(checkpoint.Step) error { after++; return nil }); err != nil {
			t.Fatal(err)
		}
		if opened && aErr != nil {
			t.Fatalf("iteration %d: A's write in its open transaction: %v; want it committed (B's claim waits for it)", i, aErr)
		}
		if !early && !opened {
			lone[aErr == nil]++
		}
		switch {
		case aErr == nil:
			if ob.saw != 1 {
				t.Fatalf("iteration %d: A committed under fence 1, but B's claim (fence 2) saw %d of its steps: the claim did not wait for A", i, ob.saw)
			}
			waited++
		case errors.Is(aErr, checkpoint.ErrFenced):
			if after != 0 {
				t.Fatalf("iteration %d: A was fenced but %d of its steps are visible", i, after)
			}
			fenced++
		default:
			t.Fatalf("iteration %d: A's write: %v; want nil or ErrFenced", i, aErr)
		}
	}
	t.Logf("%d iterations: A fenced %d, B waited for A %d; of the lone checkpoints %d committed first, %d were fenced",
		iterations, fenced, waited, lone[true], lone[false])
	if fenced == 0 || waited == 0 {
		t.Fatalf("the race exercised one side only (fenced %d, waited %d)", fenced, waited)
	}
}
