package storetest

import (
	"slices"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// apiRunCounts is the API test RunCounts: runs counted by job and status
// in one read, running ones by owner and whether their lease expired,
// each group with its latest end.
func apiRunCounts(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	in := capability[checkpoint.Inspector](t, st, "inspection")
	counts := func(now time.Time) []checkpoint.RunCount {
		t.Helper()
		c, err := in.RunCounts(e.ctx, checkpoint.RunFilter{}, now)
		if err != nil {
			t.Fatalf("RunCounts: %v", err)
		}
		return c
	}
	if c := counts(t0); len(c) != 0 {
		t.Fatalf("RunCounts of an empty store = %+v; want none", c)
	}
	finish := func(c checkpoint.Claim, status string, at time.Time) {
		t.Helper()
		if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: status, At: at}); err != nil {
			t.Fatalf("finish %s: %v", c.Lease.RunID, err)
		}
	}
	finish(e.claim(st, "f/1", ownerA, t0), checkpoint.RunSucceeded, t0.Add(time.Second))
	finish(e.claim(st, "f/2", ownerA, t0), checkpoint.RunSucceeded, t0.Add(3*time.Second))
	finish(e.claim(st, "f/3", ownerA, t0), checkpoint.RunFailed, t0.Add(2*time.Second))
	e.claim(st, "f/4", ownerA, t0)                  // lease until t0+1m
	e.claim(st, "f/5", ownerB, t0)                  // lease until t0+1m
	e.claim(st, "f/6", ownerB, t0.Add(time.Minute)) // lease until t0+2m
	e.claim(st, "g/1", ownerA, t0)
	at := t0.Add(90 * time.Second) // f/4, f/5 and g/1 expired; f/6 not
	want := []checkpoint.RunCount{
		{Job: "f", Status: checkpoint.RunFailed, Count: 1}, // only a success records FinishedAt
		{Job: "f", Status: checkpoint.RunRunning, Owner: ownerA, Expired: true, Count: 1},
		{Job: "f", Status: checkpoint.RunRunning, Owner: ownerB, Count: 1},
		{Job: "f", Status: checkpoint.RunRunning, Owner: ownerB, Expired: true, Count: 1},
		{Job: "f", Status: checkpoint.RunSucceeded, Count: 2, LastFinished: t0.Add(3 * time.Second)},
		{Job: "g", Status: checkpoint.RunRunning, Owner: ownerA, Expired: true, Count: 1},
	}
	got := counts(at)
	slices.SortFunc(got, func(a, b checkpoint.RunCount) int {
		for _, c := range [][2]string{{a.Job, b.Job}, {a.Status, b.Status}, {a.Owner, b.Owner}} {
			if c[0] != c[1] {
				if c[0] < c[1] {
					return -1
				}
				return 1
			}
		}
		switch {
		case a.Expired == b.Expired:
			return 0
		case b.Expired:
			return -1
		}
		return 1
	})
	if !slices.EqualFunc(got, want, func(a, b checkpoint.RunCount) bool {
		return a.Job == b.Job && a.Status == b.Status && a.Owner == b.Owner && a.Expired == b.Expired && a.Count == b.Count &&
			a.LastFinished.Equal(b.LastFinished)
	}) {
		t.Errorf("RunCounts at t0+90s:\n got %+v\nwant %+v", got, want)
	}
}
