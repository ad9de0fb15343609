package bench

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The claims harness waits for the last claims: with the last few runs in
// slow claimers' hands, the others find nothing to claim many times over
// (the flake "claimer 6 found nothing to claim a thousand times with 4997
// of 5000 done") and stop instead of failing; every run is finished
// before claimUntil returns.
func TestClaimUntilWaitsForTheLastClaims(t *testing.T) {
	const runs, claimers = 20, 8
	var (
		mu       sync.Mutex
		left     = runs
		finished atomic.Int64
		claimed  atomic.Int64
	)
	one := func(string) (func() error, bool, error) {
		mu.Lock()
		defer mu.Unlock()
		if left == 0 {
			return nil, false, nil
		}
		left--
		slow := left < claimers // the last claims finish slowly, as on a loaded machine
		return func() error {
			if slow {
				time.Sleep(3 * time.Second)
			}
			finished.Add(1)
			return nil
		}, true, nil
	}
	if _, err := claimUntil(claimers, &claimed, runs, one); err != nil {
		t.Fatalf("claimUntil: %v", err)
	}
	if claimed.Load() != runs || finished.Load() != runs {
		t.Fatalf("%d claimed, %d finished; want all %d of each when claimUntil returns", claimed.Load(), finished.Load(), runs)
	}
}
