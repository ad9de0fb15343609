package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

func TestClaimCreatesThenHeldThenTakenOver(t *testing.T) {
	st, _ := openFresh(t)
	ctx := context.Background()
	req := claimReq("settle/2026-11-28", "host-a:1 boot", t0)
	c := mustClaim(t, st, req)
	if !c.Created || c.Lease.Fence != 1 || c.Lease.Attempt != 1 || c.Run.Status != checkpoint.RunRunning {
		t.Fatalf("first claim = %+v; want created, fence 1, attempt 1, running", c)
	}
	if !c.Run.LeaseUntil.Equal(t0.Add(time.Minute)) || !c.Run.CreatedAt.Equal(t0) || string(c.Run.Params) != `{"day":"2026-11-28"}` {
		t.Fatalf("run = %+v; want lease until t0+1m, created t0, params kept", c.Run)
	}

	// A second runner while the lease is live is refused, naming the owner.
	_, err := st.Claim(ctx, claimReq(req.RunID, "host-b:2", t0.Add(30*time.Second)))
	var held *checkpoint.LeaseHeldError
	if !errors.As(err, &held) || held.Owner != "host-a:1 boot" || !held.Until.Equal(t0.Add(time.Minute)) {
		t.Fatalf("claim of a held run: %v; want LeaseHeldError by host-a:1 until t0+1m", err)
	}
	// Heartbeat extends it: at t0+70s it is still held.
	if err := st.Heartbeat(ctx, c.Lease, t0.Add(50*time.Second), t0.Add(110*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Claim(ctx, claimReq(req.RunID, "host-b:2", t0.Add(70*time.Second))); !errors.As(err, &held) {
		t.Fatalf("claim after the heartbeat: %v; want LeaseHeldError", err)
	}
	// Once expired, the next claim takes over: fence 2, attempt 2, the old
	// attempt lost; the old lease is fenced everywhere.
	b := mustClaim(t, st, claimReq(req.RunID, "host-b:2", t0.Add(2*time.Minute)))
	if b.Created || b.Lease.Fence != 2 || b.Lease.Attempt != 2 || b.TookOverFrom != "host-a:1 boot" ||
		b.PreviousStatus != checkpoint.RunRunning || !b.PreviousLeaseUntil.Equal(t0.Add(110*time.Second)) {
		t.Fatalf("take-over = %+v", b)
	}
	if err := st.Heartbeat(ctx, c.Lease, t0.Add(2*time.Minute), t0.Add(3*time.Minute)); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("old lease's heartbeat: %v, want ErrFenced", err)
	}
	if err := st.Finish(ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: t0.Add(2 * time.Minute)}); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("old lease's finish: %v, want ErrFenced", err)
	}
	err = st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		return tx.PutStep(checkpoint.Step{ID: "load", Status: checkpoint.StepCompleted, StartedAt: t0, FinishedAt: t0})
	})
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("old lease's write: %v, want ErrFenced", err)
	}

	if err := st.Finish(ctx, b.Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: t0.Add(3 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	info, err := st.Run(ctx, req.RunID)
	if err != nil {
		t.Fatal(err)
	}
	r := info.Run
	if r.Status != checkpoint.RunSucceeded || r.Fence != 2 || r.LeaseOwner != "" || !r.LeaseUntil.IsZero() || !r.FinishedAt.Equal(t0.Add(3*time.Minute)) {
		t.Fatalf("finished run = %+v", r)
	}
	if len(info.Attempts) != 2 || info.Attempts[0].Status != checkpoint.AttemptLost || info.Attempts[1].Status != checkpoint.RunSucceeded ||
		info.Attempts[1].Fence != 2 || !info.Attempts[1].FinishedAt.Equal(t0.Add(3*time.Minute)) {
		t.Fatalf("attempts = %+v", info.Attempts)
	}

	// A succeeded run is refused unless forced; forced, it is fence 3.
	if _, err := st.Claim(ctx, claimReq(req.RunID, "host-c:3", t0.Add(time.Hour))); !errors.Is(err, checkpoint.ErrAlreadySucceeded) {
		t.Fatalf("claim of a succeeded run: %v", err)
	}
	forced := claimReq(req.RunID, "host-c:3", t0.Add(time.Hour))
	forced.Force = true
	if f := mustClaim(t, st, forced); f.Lease.Fence != 3 || f.Lease.Attempt != 3 || f.PreviousStatus != checkpoint.RunSucceeded || f.TookOverFrom != "" {
		t.Fatalf("forced claim = %+v", f)
	}
}

func TestClaimRefusals(t *testing.T) {
	st, _ := openFresh(t)
	ctx := context.Background()
	c := mustClaim(t, st, claimReq("settle/2026-11-28", "a:1", t0))

	other := claimReq("settle/2026-11-28", "b:2", t0.Add(time.Hour))
	other.ParamsHash = "h2"
	other.Params = []byte(`{"day":"2026-11-29"}`)
	var mismatch *checkpoint.ParamsMismatchError
	if _, err := st.Claim(ctx, other); !errors.As(err, &mismatch) || mismatch.Stored != `{"day":"2026-11-28"}` {
		t.Fatalf("claim with other params: %v", err)
	}
	// A dead owner's live lease is taken over at once.
	gone := claimReq("settle/2026-11-28", "b:2", t0.Add(time.Second))
	gone.OwnerGone = func(owner string) bool { return owner == "a:1" }
	if g := mustClaim(t, st, gone); g.Lease.Fence != 2 || g.TookOverFrom != "a:1" {
		t.Fatalf("claim from a gone owner = %+v", g)
	}
	if err := st.Finish(ctx, checkpoint.Lease{RunID: c.Lease.RunID, Fence: 2, Attempt: 2},
		checkpoint.Ending{Status: checkpoint.RunAbandoned, Error: "operator gave up", At: t0.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Claim(ctx, claimReq("settle/2026-11-28", "c:3", t0.Add(time.Hour))); !errors.Is(err, checkpoint.ErrAbandoned) {
		t.Fatalf("claim of an abandoned run: %v", err)
	}
	if _, err := st.Pool().Exec(ctx, `UPDATE runs SET pruned_at = $1`, t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	forced := claimReq("settle/2026-11-28", "c:3", t0.Add(3*time.Hour))
	forced.Force = true
	if _, err := st.Claim(ctx, forced); !errors.Is(err, checkpoint.ErrPruned) {
		t.Fatalf("forced claim of a pruned run: %v", err)
	}
	if _, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: "x", Owner: "a:1", LeaseFor: time.Minute}); err == nil {
		t.Fatal("a claim without Now on the caller's clock was accepted")
	}
	if _, err := st.Run(ctx, "nope/1"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("Run of a missing run: %v", err)
	}
}

// TestLeaseOnDatabaseClock runs without CallerClock: the lease is the
// server's now() plus the lease length, whatever the caller's clock says.
func TestLeaseOnDatabaseClock(t *testing.T) {
	st := open(t, postgres.Config{URL: pgtest.Schema(t)})
	ctx := context.Background()
	var before time.Time
	if err := st.Pool().QueryRow(ctx, `SELECT now()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	skewed := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC) // a caller's clock 25 years slow
	req := claimReq("settle/2026-11-28", "a:1", skewed)
	req.LeaseFor = time.Hour
	c := mustClaim(t, st, req)
	if d := c.Run.LeaseUntil.Sub(before); d < time.Hour || d > time.Hour+time.Minute {
		t.Fatalf("lease until %v, server time before the claim %v: want about an hour after it", c.Run.LeaseUntil, before)
	}
	// A second claim with a clock far ahead still finds the lease live.
	late := claimReq("settle/2026-11-28", "b:2", skewed.AddDate(50, 0, 0))
	var held *checkpoint.LeaseHeldError
	if _, err := st.Claim(ctx, late); !errors.As(err, &held) {
		t.Fatalf("claim with a fast clock: %v; want LeaseHeldError (the server's clock decides)", err)
	}
	// A heartbeat extends by until - now from the server's now().
	if err := st.Heartbeat(ctx, c.Lease, skewed, skewed.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	info, err := st.Run(ctx, c.Lease.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if d := info.Run.LeaseUntil.Sub(before); d < 2*time.Hour || d > 2*time.Hour+time.Minute {
		t.Fatalf("lease after heartbeat %v; want about two hours after %v", info.Run.LeaseUntil, before)
	}
}
