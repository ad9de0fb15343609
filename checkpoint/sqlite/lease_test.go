package sqlite_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
)

const leaseRunID = "report/2026-11-28"

func runInfo(t *testing.T, st checkpoint.Store, id string) checkpoint.RunInfo {
	t.Helper()
	info, err := st.Run(context.Background(), id)
	if err != nil {
		t.Fatalf("run %s: %v", id, err)
	}
	return info
}

func TestClaimCreates(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	c := mustClaim(t, st, claimReq(leaseRunID, "a:1", claimNow))
	if !c.Created || c.TookOverFrom != "" {
		t.Errorf("first claim: Created %v TookOverFrom %q; want created, no takeover", c.Created, c.TookOverFrom)
	}
	want := checkpoint.Lease{RunID: leaseRunID, Fence: 1, Attempt: 1, Owner: "a:1"}
	if c.Lease != want {
		t.Errorf("lease = %+v; want %+v", c.Lease, want)
	}
	r := c.Run
	if r.Status != checkpoint.RunRunning || r.LeaseOwner != "a:1" || !r.LeaseUntil.Equal(claimNow.Add(time.Minute)) ||
		!r.CreatedAt.Equal(claimNow) || r.Fence != 1 || r.ParamsHash != "hash-"+testParams {
		t.Errorf("claimed run = %+v; want running, owned by a:1 until %s, fence 1", r, claimNow.Add(time.Minute))
	}
	info := runInfo(t, st, leaseRunID)
	if len(info.Attempts) != 1 {
		t.Fatalf("attempts = %+v; want 1", info.Attempts)
	}
	a := info.Attempts[0]
	if a.Number != 1 || a.Fence != 1 || a.Owner != "a:1" || a.Status != checkpoint.RunRunning || !a.StartedAt.Equal(claimNow) || !a.FinishedAt.IsZero() {
		t.Errorf("attempt = %+v; want number 1, fence 1, a:1, running since %s", a, claimNow)
	}
}

func TestClaimValidatesRequest(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	for name, mutate := range map[string]func(*checkpoint.ClaimRequest){
		"no run ID":      func(r *checkpoint.ClaimRequest) { r.RunID = "" },
		"no owner":       func(r *checkpoint.ClaimRequest) { r.Owner = "" },
		"no now":         func(r *checkpoint.ClaimRequest) { r.Now = time.Time{} },
		"no lease":       func(r *checkpoint.ClaimRequest) { r.LeaseFor = 0 },
		"negative lease": func(r *checkpoint.ClaimRequest) { r.LeaseFor = -time.Second },
	} {
		req := claimReq(leaseRunID, "a:1", claimNow)
		mutate(&req)
		if _, err := st.Claim(context.Background(), req); err == nil {
			t.Errorf("claim with %s: want an error", name)
		}
	}
	if _, err := st.Run(context.Background(), leaseRunID); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("invalid claims created the run (err %v)", err)
	}
}

func TestClaimResumesFailedRun(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	ctx := context.Background()
	c1 := mustClaim(t, st, claimReq(leaseRunID, "a:1", claimNow))
	if err := st.Finish(ctx, c1.Lease, checkpoint.Ending{Status: checkpoint.RunFailed, Error: "step load: boom", At: claimNow.Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	failed := runInfo(t, st, leaseRunID).Run
	if failed.Status != checkpoint.RunFailed || failed.Error != "step load: boom" || failed.LeaseOwner != "" {
		t.Fatalf("after Finish(failed) run = %+v; want failed with its error and no lease", failed)
	}

	c2 := mustClaim(t, st, claimReq(leaseRunID, "b:2", claimNow.Add(time.Hour)))
	if c2.Created || c2.TookOverFrom != "" {
		t.Errorf("resume: Created %v TookOverFrom %q; want neither", c2.Created, c2.TookOverFrom)
	}
	want := checkpoint.Lease{RunID: leaseRunID, Fence: 2, Attempt: 2, Owner: "b:2"}
	if c2.Lease != want {
		t.Errorf("resume lease = %+v; want %+v", c2.Lease, want)
	}
	if c2.Run.Status != checkpoint.RunRunning || c2.Run.Error != "" || c2.Run.Fence != 2 {
		t.Errorf("resumed run = %+v; want running, fence 2, error cleared", c2.Run)
	}
	info := runInfo(t, st, leaseRunID)
	if len(info.Attempts) != 2 {
		t.Fatalf("attempts = %+v; want 2", info.Attempts)
	}
	if a := info.Attempts[0]; a.Status != checkpoint.RunFailed || a.Error != "step load: boom" || !a.FinishedAt.Equal(claimNow.Add(time.Second)) {
		t.Errorf("attempt 1 = %+v; want failed at %s with its error", a, claimNow.Add(time.Second))
	}
	if a := info.Attempts[1]; a.Number != 2 || a.Fence != 2 || a.Owner != "b:2" || a.Status != checkpoint.RunRunning {
		t.Errorf("attempt 2 = %+v; want number 2, fence 2, b:2, running", a)
	}
}

func TestClaimLiveLeaseIsHeld(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	mustClaim(t, st, claimReq(leaseRunID, "a:1", claimNow))
	var gotOwner string
	req := claimReq(leaseRunID, "b:2", claimNow.Add(30*time.Second))
	req.OwnerGone = func(owner string) bool { gotOwner = owner; return false }
	_, err := st.Claim(context.Background(), req)
	var held *checkpoint.LeaseHeldError
	if !errors.As(err, &held) {
		t.Fatalf("claim of a live run: err = %v; want *LeaseHeldError", err)
	}
	if held.Owner != "a:1" || !held.Until.Equal(claimNow.Add(time.Minute)) || held.RunID != leaseRunID {
		t.Errorf("held = %+v; want a:1 until %s", held, claimNow.Add(time.Minute))
	}
	if !strings.Contains(err.Error(), "a:1") || !strings.Contains(err.Error(), "2026-11-28T09:01:00Z") {
		t.Errorf("error %q does not name the owner and the lease end", err)
	}
	if gotOwner != "a:1" {
		t.Errorf("OwnerGone asked about %q; want a:1", gotOwner)
	}
	info := runInfo(t, st, leaseRunID)
	if info.Run.Fence != 1 || info.Run.LeaseOwner != "a:1" || len(info.Attempts) != 1 {
		t.Errorf("refused claim changed the run: %+v, %d attempts", info.Run, len(info.Attempts))
	}
}

func TestClaimTakesOverExpiredLease(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	mustClaim(t, st, claimReq(leaseRunID, "a:1", claimNow))
	// Exactly at the lease's end it has expired.
	c := mustClaim(t, st, claimReq(leaseRunID, "b:2", claimNow.Add(time.Minute)))
	if c.TookOverFrom != "a:1" || c.Lease.Fence != 2 || c.Lease.Attempt != 2 || !c.PreviousLeaseUntil.Equal(claimNow.Add(time.Minute)) {
		t.Errorf("takeover claim = %+v; want TookOverFrom a:1, fence 2, attempt 2, previous lease until %s", c, claimNow.Add(time.Minute))
	}
	info := runInfo(t, st, leaseRunID)
	if info.Run.LeaseOwner != "b:2" || !info.Run.LeaseUntil.Equal(claimNow.Add(2*time.Minute)) {
		t.Errorf("run lease = %s until %s; want b:2 until %s", info.Run.LeaseOwner, info.Run.LeaseUntil, claimNow.Add(2*time.Minute))
	}
	lost := info.Attempts[0]
	if lost.Status != checkpoint.AttemptLost || !lost.FinishedAt.Equal(claimNow.Add(time.Minute)) || !strings.Contains(lost.Error, "b:2") {
		t.Errorf("old attempt = %+v; want status lost at %s, error naming b:2", lost, claimNow.Add(time.Minute))
	}
	if info.Attempts[1].Status != checkpoint.RunRunning {
		t.Errorf("new attempt = %+v; want running", info.Attempts[1])
	}
}

func TestClaimOwnerGoneTakesOverAtOnce(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	mustClaim(t, st, claimReq(leaseRunID, "host:111", claimNow))
	req := claimReq(leaseRunID, "host:222", claimNow.Add(time.Second)) // lease still live
	req.OwnerGone = func(owner string) bool { return owner == "host:111" }
	c := mustClaim(t, st, req)
	if c.TookOverFrom != "host:111" || c.Lease.Fence != 2 {
		t.Errorf("claim = %+v; want immediate takeover from host:111 with fence 2", c)
	}
	// The old lease's end is handed on: a call the dead owner sent may land
	// until then.
	if !c.PreviousLeaseUntil.Equal(claimNow.Add(time.Minute)) {
		t.Errorf("PreviousLeaseUntil = %s; want the taken-over lease's end %s", c.PreviousLeaseUntil, claimNow.Add(time.Minute))
	}
	if a := runInfo(t, st, leaseRunID).Attempts[0]; a.Status != checkpoint.AttemptLost {
		t.Errorf("dead owner's attempt = %+v; want lost", a)
	}
}

func TestClaimShowsOwnerNameOnly(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	const owner = "node1:4242 boot=6f1c pidns=4026531836"
	mustClaim(t, st, claimReq(leaseRunID, owner, claimNow))
	_, err := st.Claim(context.Background(), claimReq(leaseRunID, "node2:1 boot=x pidns=2", claimNow.Add(time.Second)))
	var held *checkpoint.LeaseHeldError
	if !errors.As(err, &held) || held.Owner != owner || err.Error() != "run "+leaseRunID+" is held by node1:4242 until 2026-11-28T09:01:00Z" {
		t.Fatalf("claim of a held run: %v; want the full owner in the error's data and node1:4242 in its message", err)
	}
	// A takeover names the new owner by name in the lost attempt.
	c := mustClaim(t, st, claimReq(leaseRunID, "node2:1 boot=x pidns=2", claimNow.Add(time.Minute)))
	if c.TookOverFrom != owner {
		t.Errorf("TookOverFrom = %q, want the full owner %q", c.TookOverFrom, owner)
	}
	if a := runInfo(t, st, leaseRunID).Attempts[0]; !strings.HasSuffix(a.Error, "taken over by node2:1") {
		t.Errorf("lost attempt's error = %q; want it to end with the new owner's name", a.Error)
	}
	if got := checkpoint.OwnerName("host:1"); got != "host:1" {
		t.Errorf("OwnerName of an old-style owner = %q", got)
	}
}

func TestClaimParamsMismatch(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	mustClaim(t, st, claimReq(leaseRunID, "a:1", claimNow))
	req := claimReq(leaseRunID, "a:1", claimNow.Add(time.Hour))
	req.Params, req.ParamsHash = []byte(`{"date":"2026-11-28","orders":5}`), "other-hash"
	_, err := st.Claim(context.Background(), req)
	var mm *checkpoint.ParamsMismatchError
	if !errors.As(err, &mm) {
		t.Fatalf("claim with other params: err = %v; want *ParamsMismatchError", err)
	}
	if mm.Stored != testParams || mm.Given != `{"date":"2026-11-28","orders":5}` || mm.RunID != leaseRunID {
		t.Errorf("mismatch = %+v; want stored %s, given the new params", mm, testParams)
	}
	if !strings.Contains(err.Error(), testParams) || !strings.Contains(err.Error(), `"orders":5`) {
		t.Errorf("error %q does not show both parameter sets", err)
	}
}

func TestClaimSucceededNeedsForce(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	c := mustClaim(t, st, claimReq(leaseRunID, "a:1", claimNow))
	if err := st.Finish(context.Background(), c.Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: claimNow.Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	_, err := st.Claim(context.Background(), claimReq(leaseRunID, "a:1", claimNow.Add(time.Hour)))
	if !errors.Is(err, checkpoint.ErrAlreadySucceeded) || !strings.Contains(err.Error(), leaseRunID) {
		t.Fatalf("claim of a succeeded run: err = %v; want ErrAlreadySucceeded naming the run", err)
	}
	if r := runInfo(t, st, leaseRunID).Run; r.Fence != 1 || r.Status != checkpoint.RunSucceeded {
		t.Errorf("refused claim changed the run: %+v", r)
	}
	req := claimReq(leaseRunID, "a:1", claimNow.Add(time.Hour))
	req.Force = true
	c2 := mustClaim(t, st, req)
	if c2.Lease.Fence != 2 || c2.Lease.Attempt != 2 || c2.Run.Status != checkpoint.RunRunning || !c2.Run.FinishedAt.IsZero() {
		t.Errorf("forced claim = %+v; want fence 2, attempt 2, running, no finish time", c2)
	}
}

func TestClaimAbandonedNeedsForce(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	c := mustClaim(t, st, claimReq(leaseRunID, "a:1", claimNow))
	if err := st.Finish(context.Background(), c.Lease, checkpoint.Ending{Status: checkpoint.RunFailed, At: claimNow}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.DB().Exec(`UPDATE runs SET status = 'abandoned', error = 'operator gave up' WHERE id = ?`, leaseRunID); err != nil {
		t.Fatal(err)
	}
	_, err := st.Claim(context.Background(), claimReq(leaseRunID, "a:1", claimNow.Add(time.Hour)))
	if !errors.Is(err, checkpoint.ErrAbandoned) || !strings.Contains(err.Error(), "operator gave up") {
		t.Fatalf("claim of an abandoned run: err = %v; want ErrAbandoned with the reason", err)
	}
	req := claimReq(leaseRunID, "a:1", claimNow.Add(time.Hour))
	req.Force = true
	if c2 := mustClaim(t, st, req); c2.Lease.Fence != 2 {
		t.Errorf("forced claim of an abandoned run: fence %d; want 2", c2.Lease.Fence)
	}
}

func TestOldLeaseIsFenced(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	ctx := context.Background()
	old := mustClaim(t, st, claimReq(leaseRunID, "a:1", claimNow)).Lease
	cur := mustClaim(t, st, claimReq(leaseRunID, "b:2", claimNow.Add(2*time.Minute)))
	before := runInfo(t, st, leaseRunID)

	err := st.Heartbeat(ctx, old, claimNow.Add(3*time.Minute), claimNow.Add(10*time.Minute))
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("Heartbeat with the old lease: err = %v; want ErrFenced", err)
	}
	err = st.Finish(ctx, old, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: claimNow.Add(3 * time.Minute)})
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("Finish with the old lease: err = %v; want ErrFenced", err)
	}
	err = st.InTx(ctx, old, func(tx checkpoint.Tx) error {
		// A same-store write made in the transaction goes with it.
		tgt, err := tx.Target(checkpoint.StateTable)
		if err != nil {
			return err
		}
		if err := tgt.Write(ctx, []checkpoint.Write{{Key: "acct:42", NewValue: 1, Insert: true}}); err != nil {
			return err
		}
		return tx.PutStep(checkpoint.Step{ID: "load", Status: checkpoint.StepCompleted, Output: []byte(`1`), Tries: 1, StartedAt: claimNow, FinishedAt: claimNow})
	})
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("InTx PutStep with the old lease: err = %v; want ErrFenced", err)
	}

	after := runInfo(t, st, leaseRunID)
	if after.Run.Status != before.Run.Status || !after.Run.LeaseUntil.Equal(before.Run.LeaseUntil) ||
		after.Run.LeaseOwner != "b:2" || after.Run.Fence != cur.Lease.Fence {
		t.Errorf("fenced writes changed the run: before %+v, after %+v", before.Run, after.Run)
	}
	if a := after.Attempts[0]; a.Status != checkpoint.AttemptLost {
		t.Errorf("fenced Finish changed the old attempt to %q; want it left lost", a.Status)
	}
	if got := allSteps(t, st, leaseRunID); len(got) != 0 {
		t.Errorf("fenced PutStep wrote %+v", got)
	}
	var n int
	if err := st.DB().QueryRow(`SELECT COUNT(*) FROM stepwise_state`).Scan(&n); err != nil || n != 0 {
		t.Errorf("fenced transaction kept %d same-store writes (err %v); want 0", n, err)
	}

	// The current lease still writes (renewed before it expires at +3m:
	// an expired lease is not renewed).
	if err := st.Heartbeat(ctx, cur.Lease, claimNow.Add(150*time.Second), claimNow.Add(10*time.Minute)); err != nil {
		t.Errorf("Heartbeat with the current lease: %v", err)
	}
	if r := runInfo(t, st, leaseRunID).Run; !r.LeaseUntil.Equal(claimNow.Add(10 * time.Minute)) {
		t.Errorf("lease_until after heartbeat = %s; want %s", r.LeaseUntil, claimNow.Add(10*time.Minute))
	}
	if err := putStep(st, cur.Lease, checkpoint.Step{ID: "load", Status: checkpoint.StepCompleted, Output: []byte(`1`), Tries: 1, StartedAt: claimNow, FinishedAt: claimNow}); err != nil {
		t.Errorf("PutStep with the current lease: %v", err)
	}
}

func TestRunStale(t *testing.T) {
	until := claimNow.Add(time.Minute)
	for _, tc := range []struct {
		name string
		run  checkpoint.Run
		now  time.Time
		want bool
	}{
		{"running, lease live", checkpoint.Run{Status: checkpoint.RunRunning, LeaseUntil: until}, claimNow, false},
		{"running, lease ends now", checkpoint.Run{Status: checkpoint.RunRunning, LeaseUntil: until}, until, true},
		{"running, lease expired", checkpoint.Run{Status: checkpoint.RunRunning, LeaseUntil: until}, until.Add(time.Hour), true},
		{"running, no lease", checkpoint.Run{Status: checkpoint.RunRunning}, until, false},
		{"failed, old lease", checkpoint.Run{Status: checkpoint.RunFailed, LeaseUntil: until}, until.Add(time.Hour), false},
		{"succeeded", checkpoint.Run{Status: checkpoint.RunSucceeded}, until.Add(time.Hour), false},
	} {
		if got := tc.run.Stale(tc.now); got != tc.want {
			t.Errorf("%s: Stale = %v; want %v", tc.name, got, tc.want)
		}
	}

	// The same through the store: a claimed run turns stale when its lease
	// ends, and stops being stale once it is finished.
	st := checkpointtest.OpenSQLite(t)
	c := mustClaim(t, st, claimReq(leaseRunID, "a:1", claimNow))
	r := runInfo(t, st, leaseRunID).Run
	if r.Stale(claimNow.Add(59*time.Second)) || !r.Stale(claimNow.Add(61*time.Second)) {
		t.Errorf("stored run Stale at +59s/+61s = %v/%v; want false/true", r.Stale(claimNow.Add(59*time.Second)), r.Stale(claimNow.Add(61*time.Second)))
	}
	if err := st.Finish(context.Background(), c.Lease, checkpoint.Ending{Status: checkpoint.RunInterrupted, At: claimNow}); err != nil {
		t.Fatal(err)
	}
	if r := runInfo(t, st, leaseRunID).Run; r.Stale(claimNow.Add(time.Hour)) {
		t.Errorf("interrupted run is stale: %+v", r)
	}
}
