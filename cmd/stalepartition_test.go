package cmd

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
)

// goneOwner is the owner string of a process of this host and PID
// namespace that exited and was reaped, as a runner killed with SIGKILL
// leaves it in its leases.
func goneOwner(t *testing.T) string {
	t.Helper()
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	name, details, ok := strings.Cut(runner.DefaultOwner(), " ")
	if !ok {
		t.Fatalf("this process's owner %q has no boot and PID namespace: no owner can be found gone here", runner.DefaultOwner())
	}
	owner := fmt.Sprintf("%s:%d %s", name[:strings.LastIndexByte(name, ':')], c.Process.Pid, details)
	if !runner.OwnerGone(owner) {
		t.Fatalf("the exited process's owner %q is not found gone", owner)
	}
	return owner
}

// `show` gives a running partition whose runner's process is gone the
// state stale, and `runs` names its owner stale; a partition whose runner
// is alive, under a live lease, stays running.
func TestShowMarksAGoneRunnersPartitionStale(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	createDB(t, db)
	st := openStore(t, db)
	ctx, now := context.Background(), time.Now()
	const runID = "crashy/stale"
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: runID, Job: "crashy", RunKey: "stale", Params: []byte(`{}`),
		ParamsHash: "h", Owner: runner.DefaultOwner(), Now: now, LeaseFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	head := checkpoint.Step{ID: "post", Status: checkpoint.StepRunning, StartedAt: now, Tries: 1}
	split := []checkpoint.Partition{{Index: 0, Count: 2, Rule: checkpoint.PartitionHash}, {Index: 1, Count: 2, Rule: checkpoint.PartitionHash}}
	if _, err := st.StartPartitioned(ctx, c.Lease, head, split); err != nil {
		t.Fatal(err)
	}
	for _, owner := range []string{goneOwner(t), runner.DefaultOwner()} {
		if _, _, ok, err := st.ClaimPartition(ctx, checkpoint.PartitionClaim{Owner: owner, Now: now, LeaseFor: time.Hour}); err != nil || !ok {
			t.Fatalf("claim a partition for %s: %v, %v", owner, ok, err)
		}
	}
	o := cliRun(t, []string{"--db", db, "show", runID})
	if o.code != ExitOK {
		t.Fatalf("show: %s", o)
	}
	if gone, alive := lineWith(o.stdout, "post#0"), lineWith(o.stdout, "post#1"); !strings.Contains(gone, "stale") || !strings.Contains(alive, "running") {
		t.Errorf("show's partitions: %q, %q; want #0 (its runner gone) stale, #1 running\n%s", gone, alive, o)
	}
	o = cliRun(t, []string{"--db", db, "runs"})
	if line := lineWith(o.stdout, runID); o.code != ExitOK || !strings.Contains(line, "(stale)×1") {
		t.Errorf("runs: %q; want the gone runner's partition noted stale\n%s", line, o)
	}
}
