package runner

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
)

// batchSizes is a real store that records how many ends each
// FinishAndClaim carried.
type batchSizes struct {
	checkpoint.Backend
	sizes []int
}

func (b *batchSizes) FinishAndClaim(ctx context.Context, ends []checkpoint.Finished, next checkpoint.ClaimNextRequest) ([]checkpoint.Claim, []error, error) {
	b.sizes = append(b.sizes, len(ends))
	return b.Backend.FinishAndClaim(ctx, ends, next)
}

// The ends of several slots that are ready together are recorded in one
// FinishAndClaim, which claims a next run for each; a fenced end is
// refused alone, and its slot still gets a run.
func TestEnderBatchesTheEndsReadyTogether(t *testing.T) {
	ctx := context.Background()
	st := &batchSizes{Backend: checkpointtest.Open(t)}
	now := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	for i := range 6 {
		if _, err := st.Enqueue(ctx, checkpoint.EnqueueRequest{RunID: fmt.Sprintf("e/%d", i), Job: "e", RunKey: fmt.Sprint(i),
			Params: []byte(`{}`), ParamsHash: "h", Now: now.Add(time.Duration(i) * time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	req := func(at time.Time, n int) checkpoint.ClaimNextRequest {
		return checkpoint.ClaimNextRequest{Owner: "w:1", Now: at, LeaseFor: time.Minute, Max: n}
	}
	cs, err := st.ClaimBatch(ctx, req(now.Add(time.Minute), 3))
	if err != nil || len(cs) != 3 {
		t.Fatalf("claim 3: %d, %v", len(cs), err)
	}
	stale := cs[2].Lease
	stale.Fence-- // as if the run had been taken over since
	e := &ender{queue: st, clock: fixedClock{now.Add(90 * time.Second)}, reqs: make(chan endReq, 3), max: 4, claim: req}
	replies := make([]chan endReply, 3)
	for i, l := range []checkpoint.Lease{cs[0].Lease, cs[1].Lease, stale} {
		replies[i] = make(chan endReply, 1)
		e.reqs <- endReq{fin: checkpoint.Finished{Lease: l, Ending: checkpoint.Ending{Status: checkpoint.RunSucceeded, At: now.Add(90 * time.Second)}},
			reply: replies[i]}
	}
	close(e.reqs)
	e.loop(ctx)
	if len(st.sizes) != 1 || st.sizes[0] != 3 {
		t.Fatalf("FinishAndClaim batches %v; want one of the 3 ends ready together", st.sizes)
	}
	for i, ch := range replies {
		rep := <-ch
		if rep.unknown != nil || rep.next == nil || rep.next.Lease.RunID != fmt.Sprintf("e/%d", 3+i) {
			t.Errorf("slot %d: next %v, unknown %v; want its next run e/%d", i, rep.next, rep.unknown, 3+i)
		}
		if fenced := errors.Is(rep.err, checkpoint.ErrFenced); fenced != (i == 2) {
			t.Errorf("slot %d: end %v; want ErrFenced only for the stale lease", i, rep.err)
		}
	}
}

// fixedClock is a Clock that always says t.
type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time                         { return c.t }
func (c fixedClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
