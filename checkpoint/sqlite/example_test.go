package sqlite_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
)

// Open a store, claim a run twice (the second claim is refused while the
// first runner's lease is live), and list the runs.
func Example() {
	dir, err := os.MkdirTemp("", "stepwise-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	ctx := context.Background()
	st, err := sqlite.Open(ctx, sqlite.Config{Path: filepath.Join(dir, "stepwise.db")})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()

	// The store never reads the clock: the caller says what time it is.
	now := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	req := checkpoint.ClaimRequest{
		RunID: "report/2026-11-28", Job: "report", RunKey: "2026-11-28",
		Params: []byte(`{"date":"2026-11-28"}`), ParamsHash: "sha256-of-params",
		Owner: "host-a:4242", Now: now, LeaseFor: 30 * time.Second,
	}
	c, err := st.Claim(ctx, req)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("claimed %s: created=%v fence=%d attempt=%d\n", c.Lease.RunID, c.Created, c.Lease.Fence, c.Lease.Attempt)

	req.Owner, req.Now = "host-b:7", now.Add(10*time.Second)
	if _, err := st.Claim(ctx, req); err != nil {
		fmt.Println("second runner:", err)
	}

	runs, err := st.Runs(ctx, checkpoint.RunFilter{Job: "report"})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range runs {
		fmt.Printf("%s %s owner=%s stale at +1m: %v\n", r.ID, r.Status, r.LeaseOwner, r.Stale(now.Add(time.Minute)))
	}
	// Output:
	// claimed report/2026-11-28: created=true fence=1 attempt=1
	// second runner: run report/2026-11-28 is held by host-a:4242 until 2026-11-28T09:00:30Z
	// report/2026-11-28 running owner=host-a:4242 stale at +1m: true
}
