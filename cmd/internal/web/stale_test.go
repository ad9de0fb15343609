package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/cmd/internal/web"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// goneOwner is the owner string of a process of this host and PID
// namespace that has exited (and been reaped): what a runner killed with
// SIGKILL leaves in its leases.
func goneOwner(t *testing.T) string {
	t.Helper()
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	self := runner.DefaultOwner()
	name, details, ok := strings.Cut(self, " ")
	if !ok {
		t.Fatalf("this process's owner %q has no boot and PID namespace: no owner can be found gone here", self)
	}
	host := name[:strings.LastIndexByte(name, ':')]
	owner := fmt.Sprintf("%s:%d %s", host, c.Process.Pid, details)
	if !runner.OwnerGone(owner) {
		t.Fatalf("the exited process's owner %q is not found gone", owner)
	}
	return owner
}

// A running partition whose runner's process is gone is stale in the
// view `show` and the API give, and on the run page; one whose runner is
// alive, its lease live, is not.
func TestGoneOwnersPartitionIsStale(t *testing.T) {
	ctx := context.Background()
	st, _ := checkpointtest.OpenNew(t)
	gone, alive := goneOwner(t), runner.DefaultOwner()
	now := time.Now()
	const runID = "settle/" + testDate
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: runID, Job: "settle", RunKey: testDate, Params: []byte(`{}`),
		ParamsHash: "h", Owner: alive, Now: now, LeaseFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	head := checkpoint.Step{ID: "post", Status: checkpoint.StepRunning, StartedAt: now, Tries: 1}
	split := []checkpoint.Partition{{Index: 0, Count: 2, Rule: checkpoint.PartitionHash}, {Index: 1, Count: 2, Rule: checkpoint.PartitionHash}}
	if _, err := st.StartPartitioned(ctx, c.Lease, head, split); err != nil {
		t.Fatal(err)
	}
	for i, owner := range []string{gone, alive} {
		_, l, ok, err := st.ClaimPartition(ctx, checkpoint.PartitionClaim{Owner: owner, Now: now, LeaseFor: time.Hour})
		if err != nil || !ok {
			t.Fatalf("claim a partition for %s: %v, %v", owner, ok, err)
		}
		// One item each: the run page shows a batch step from its items.
		w := checkpoint.PartitionWrite{Lease: l, Now: now, LeaseFor: time.Hour}
		item := checkpoint.Item{Step: "post", Key: fmt.Sprintf("T-%d", i), Status: checkpoint.StepCompleted, Output: []byte(`1`)}
		if err := st.InPartitionTx(ctx, w, func(tx checkpoint.Tx) error { return tx.PutItems([]checkpoint.Item{item}) }); err != nil {
			t.Fatal(err)
		}
	}
	v, err := ops.Show(ctx, st, runID, ops.ShowOptions{}, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Partitions) != 2 || !v.Partitions[0].Stale || v.Partitions[1].Stale {
		t.Fatalf("partitions %+v; want #0 (its runner gone) stale, #1 (alive) not", v.Partitions)
	}
	b, err := json.Marshal(v.Partitions[0])
	if err != nil || !strings.Contains(string(b), `"stale":true`) {
		t.Errorf("the API's partition %s (%v); want \"stale\":true", b, err)
	}
	srv := serve(t, web.Config{Store: st})
	resp, body := get(t, srv, "/runs/"+runID)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET the run page: %s\n%s", resp.Status, body)
	}
	rows := strings.Split(body, `data-testid="partition"`)
	if len(rows) != 3 || !strings.Contains(rows[1], `s-stale`) || strings.Contains(rows[2], `s-stale`) {
		t.Errorf("the run page's partition rows do not mark #0 alone stale:\n%s", body)
	}
}
