package runner

import (
	"context"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// ender records the ends of a worker's runs for its slots, and claims each
// slot's next run with them: the ends that are ready together (those that
// arrived while the previous batch was being recorded) go in one
// FinishAndClaim, one commit, which claims as many runs as there are ends.
// Nothing waits to fill a batch: a lone end is recorded at once. Several
// recorders may run loop on one ender (enderRecorders).
type ender struct {
	queue checkpoint.QueueStore
	clock Clock
	reqs  chan endReq
	max   int // ends per batch at most (the worker's slots)
	claim func(now time.Time, n int) checkpoint.ClaimNextRequest
}

// enderRecorders is how many batches of ends a worker with slots slots
// records at once: one a slot up to 8 slots, 8 above. A slot's end then
// waits for a round trip of its own while the store keeps up, and ends
// share one when it does not. Fewer (2 for 4 slots) measured 0.44-0.50 of
// the raw drain at 4 slots against 0.75-0.94 with one a slot.
func enderRecorders(slots int) int { return max(1, min(8, slots)) }

// endReq is a slot's end, and where its answer goes.
type endReq struct {
	fin   checkpoint.Finished
	reply chan<- endReply
}

// endReply answers an endReq: err is the end's own outcome (nil, or
// wrapping checkpoint.ErrFenced), next the run the slot takes on, claimed
// at claimedAt (a time read before the claim was sent). unknown is set
// when the batch failed as a whole: the end may or may not be recorded.
type endReply struct {
	err       error
	next      *checkpoint.Claim
	claimedAt time.Time
	unknown   error
}

// loop records batches of ends until reqs is closed.
func (e *ender) loop(ctx context.Context) {
	for r := range e.reqs {
		batch := []endReq{r}
	gather:
		for len(batch) < e.max {
			select {
			case r, ok := <-e.reqs:
				if !ok {
					break gather
				}
				batch = append(batch, r)
			default:
				break gather
			}
		}
		e.record(ctx, batch)
	}
}

// record finishes batch and hands out the runs claimed with it, one a
// slot, in order.
func (e *ender) record(ctx context.Context, batch []endReq) {
	ends := make([]checkpoint.Finished, len(batch))
	for i, r := range batch {
		ends[i] = r.fin
	}
	claimedAt := e.clock.Now()
	cs, results, err := e.queue.FinishAndClaim(ctx, ends, e.claim(claimedAt, len(batch)))
	for i, r := range batch {
		rep := endReply{claimedAt: claimedAt, unknown: err}
		if err == nil {
			rep.err = results[i]
			if i < len(cs) {
				rep.next = &cs[i]
			}
		}
		r.reply <- rep
	}
}
