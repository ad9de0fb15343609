package ops_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// goneOwner is a lease owner of this host whose process has exited: a
// child that ran and was reaped.
func goneOwner(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	self := runner.DefaultOwner()
	_, id, _ := strings.Cut(self, " ")
	host, _ := os.Hostname()
	owner := fmt.Sprintf("%s:%d %s", host, cmd.Process.Pid, id)
	if !runner.OwnerGone(owner) {
		t.Fatalf("owner %q of an exited child is not gone", owner)
	}
	return owner
}

// The store collector reports what the store holds, whoever recorded it:
// each job's last success, and its runs by status with stale ones (an
// expired lease, an owner surely gone) apart from live ones; registered
// jobs without a run at 0. Its names pass promlint.
func TestStoreCollectorReadsTheStore(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	now := time.Now().UTC().Truncate(time.Microsecond)
	claim := func(id, owner string, at time.Time) checkpoint.Claim {
		t.Helper()
		job, key, _ := strings.Cut(id, "/")
		c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: id, Job: job, RunKey: key, Params: []byte(`{}`), ParamsHash: "h",
			Owner: owner, Now: at, LeaseFor: time.Minute})
		if err != nil {
			t.Fatalf("claim %s: %v", id, err)
		}
		return c
	}
	finish := func(c checkpoint.Claim, status string, at time.Time) {
		t.Helper()
		if err := st.Finish(ctx, c.Lease, checkpoint.Ending{Status: status, At: at}); err != nil {
			t.Fatal(err)
		}
	}
	live := runner.DefaultOwner()
	finish(claim("settle/1", live, now.Add(-3*time.Hour)), checkpoint.RunSucceeded, now.Add(-2*time.Hour))
	finish(claim("settle/2", live, now.Add(-2*time.Hour)), checkpoint.RunSucceeded, now.Add(-time.Hour))
	finish(claim("settle/3", live, now.Add(-time.Hour)), checkpoint.RunFailed, now.Add(-time.Hour))
	claim("settle/4", live, now)                      // running
	claim("settle/5", live, now.Add(-10*time.Minute)) // lease expired: stale
	claim("settle/6", goneOwner(t), now)              // owner gone: stale

	clock := now
	c, err := ops.NewStoreCollector(ops.StoreCollectorConfig{Store: st, Jobs: []string{"report"}, Now: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	want := fmt.Sprintf(`
# HELP stepwise_job_last_success_timestamp_seconds Unix time at which the job's latest succeeded run ended, read from the store (every process's runs).
# TYPE stepwise_job_last_success_timestamp_seconds gauge
stepwise_job_last_success_timestamp_seconds{job="settle"} %v
# HELP stepwise_runs Runs in the store by job and status, read from the store; stale: marked running, but its lease expired or its runner is gone.
# TYPE stepwise_runs gauge
stepwise_runs{job="report",status="abandoned"} 0
stepwise_runs{job="report",status="failed"} 0
stepwise_runs{job="report",status="interrupted"} 0
stepwise_runs{job="report",status="queued"} 0
stepwise_runs{job="report",status="running"} 0
stepwise_runs{job="report",status="stale"} 0
stepwise_runs{job="report",status="succeeded"} 0
stepwise_runs{job="settle",status="abandoned"} 0
stepwise_runs{job="settle",status="failed"} 1
stepwise_runs{job="settle",status="interrupted"} 0
stepwise_runs{job="settle",status="queued"} 0
stepwise_runs{job="settle",status="running"} 1
stepwise_runs{job="settle",status="stale"} 2
stepwise_runs{job="settle",status="succeeded"} 2
# HELP stepwise_store_up 1 if the latest read of the store for these metrics succeeded within its timeout, else 0 (the store series are then left out).
# TYPE stepwise_store_up gauge
stepwise_store_up 1
`, float64(now.Add(-time.Hour).UnixNano())/1e9)
	names := []string{"stepwise_job_last_success_timestamp_seconds", "stepwise_runs", "stepwise_store_up"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %+v", err, problems)
	}

	// A read serves the scrapes of the next MaxAge (5s); after it, the
	// store is read again and a new success shows.
	finish(claim("settle/7", live, now), checkpoint.RunSucceeded, now.Add(time.Second))
	if got := (gaugeOf(t, reg, "stepwise_runs", "settle", "succeeded")); got != 2 {
		t.Errorf("within MaxAge, succeeded = %v; want the cached 2", got)
	}
	clock = now.Add(5 * time.Second)
	if got := (gaugeOf(t, reg, "stepwise_runs", "settle", "succeeded")); got != 3 {
		t.Errorf("after MaxAge, succeeded = %v; want 3", got)
	}

	// A store that cannot be read says so, and reports no store series.
	st.Close()
	clock = now.Add(time.Minute)
	if got := (gaugeOf(t, reg, "stepwise_store_up", "", "")); got != 0 {
		t.Errorf("on a closed store, stepwise_store_up = %v; want 0", got)
	}
	if n, err := testutil.GatherAndCount(reg, "stepwise_runs"); err != nil || n != 0 {
		t.Errorf("on a closed store, %d stepwise_runs series (%v); want none", n, err)
	}
}

// gaugeOf is the value of the one series of family name with job and
// status (when not empty) in a scrape of reg.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name, job, status string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if (job == "" || labels["job"] == job) && (status == "" || labels["status"] == status) {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no series %s{job=%q,status=%q}", name, job, status)
	return 0
}
