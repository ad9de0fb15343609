package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/stores"
	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/runner"
)

// TestServeSettlesAPartitionedDayOnSchedule runs `stepwise serve` (which
// always counts its runs in Prometheus metrics) with a schedule that fires
// a settlement split into four partitions every second: the run succeeds,
// each partition done, and the ledger's day is settled. Before the runner
// took one typed store handle, the scheduler's claim-counting wrapper hid
// the store's partitions and every such run failed with "cannot record
// partitions".
func TestServeSettlesAPartitionedDayOnSchedule(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	ledger := openTestLedger(t, db)
	ctx := context.Background()
	const date = "2026-11-27"
	if err := settlement.Seed(ctx, ledger, settlement.SeedConfig{Accounts: 40, Transfers: 400, Date: date, Seed: 3, Balance: 10_000}); err != nil {
		t.Fatal(err)
	}
	everySecond := runner.Schedule{
		Name: "settle-partitioned", Job: settlement.Job.Name(), Spec: "* * * * * *", Location: time.UTC,
		Key:     func(time.Time) map[string]string { return map[string]string{"date": date} },
		Values:  map[string]string{"partitions": "4", "chunk": "25"},
		Misfire: runner.MisfireRunOnce, Overlap: runner.OverlapForbid,
	}
	serveCtx, stop := context.WithCancel(ctx)
	var out syncBuffer
	served := make(chan int, 1)
	go func() {
		served <- cmd.Execute(serveCtx, registry(), []string{"--db", db, "--log-format", "json", "serve", "--grace", "5s"},
			&out, &out, cmd.Schedules(everySecond))
	}()
	stopped := false
	stopServe := func() {
		if stopped {
			return
		}
		stopped = true
		stop()
		if code := <-served; code != cmd.ExitOK {
			t.Errorf("serve exited %d:\n%s", code, out.String())
		}
	}
	defer stopServe()

	st, err := stores.Open(ctx, db, stores.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	runID := "settle/" + date
	var info checkpoint.RunInfo
	for deadline := time.Now().Add(60 * time.Second); ; {
		info, err = st.Run(ctx, runID)
		if err == nil && info.Run.Status != checkpoint.RunRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the scheduled run %s did not end in 60s (%+v, %v):\n%s", runID, info.Run, err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopServe()
	if info.Run.Status != checkpoint.RunSucceeded {
		t.Fatalf("the scheduled partitioned settlement is %s: %s\nserve's log:\n%s", info.Run.Status, info.Run.Error, out.String())
	}
	if strings.Contains(out.String(), "cannot record partitions") {
		t.Errorf("serve logged that the store cannot record partitions:\n%s", out.String())
	}
	parts, err := st.Partitions(ctx, runID, "post")
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 4 {
		t.Fatalf("the post step has %d partitions, want 4: %+v", len(parts), parts)
	}
	for _, p := range parts {
		if p.State != checkpoint.PartitionDone {
			t.Errorf("partition %d is %s, want done", p.Index, p.State)
		}
	}
	mustRun(t, cmd.ExitOK, "--db", db, "ledger", "check", "--date", date)
}
