package settlement_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// pauseLease is the lease of TestPausedOwnerCannotStallPastItsLease.
const pauseLease = 6 * time.Second

// TestPausedOwnerCannotStallPastItsLease is issue 23's third point: a
// runner SIGSTOPped inside a chunk's transaction (its run row and the
// chunk's accounts locked) with --lease 6s. The server ends its session
// once it sat idle in the transaction for half the lease (the session's
// timeout follows the lease; it was a fixed 60s), so a second runner
// waiting for the run takes it over once the lease expires and finishes
// it within three leases of the pause. Woken, the paused runner is fenced
// and writes nothing: every transfer is settled exactly once.
func TestPausedOwnerCannotStallPastItsLease(t *testing.T) {
	t.Parallel()
	pgtest.URL(t) // skips, saying why, without PostgreSQL
	s := store{db: pgtest.Schema(t)}
	seed(t, s.db, smallLedger)
	args := func(extra ...string) []string {
		a := []string{"--db", s.db, "--log-level", "warn", "run", "settle", "--progress", "none", "--lease", pauseLease.String()}
		for k, v := range s.values(testDate, 20) {
			a = append(a, "-p", k+"="+v)
		}
		return append(a, extra...)
	}
	spec := func(env []string, extra ...string) crashtest.Spec {
		return crashtest.Spec{Args: args(extra...), Env: append([]string{childEnv + "=1"}, env...), Timeout: 2 * time.Minute}
	}
	owner := crashtest.Start(t, spec([]string{crashtest.PauseAt("step:post#3:before-commit")}))
	owner.WaitStopped()
	paused := time.Now()
	defer owner.Signal(syscall.SIGCONT)

	next := crashtest.Start(t, spec(nil, "--wait"))
	got, ok := next.WaitWithin(3 * pauseLease)
	took := time.Since(paused)
	if !ok {
		next.Signal(syscall.SIGKILL)
		next.Wait()
		t.Fatalf("the second runner had not finished the run %s after the owner paused inside a chunk's transaction "+
			"(lease %s): the paused session's locks outlived the lease\n%s", took.Round(time.Millisecond), pauseLease, next.Output())
	}
	next.WantExit(got, crashtest.Code(cmd.ExitOK))
	t.Logf("run finished by the second runner %s after the owner paused (lease %s)", took.Round(time.Millisecond), pauseLease)

	owner.Signal(syscall.SIGCONT)
	if got := owner.Wait(); got == crashtest.Code(cmd.ExitOK) {
		t.Errorf("the woken owner exited 0; want it fenced out\n%s", owner.Output())
	} else if out := owner.Output(); !strings.Contains(out, "fenced") && !strings.Contains(out, "lease") {
		t.Errorf("the woken owner (%s) does not say it lost the run:\n%s", got, out)
	}
	for _, p := range partitionInvariants(t, s, testDate) {
		t.Error(p)
	}
	st := s.open(t)
	defer st.Close()
	info, err := st.Run(context.Background(), jobs.RunID(settlement.Job.Name(), testDate))
	if err != nil {
		t.Fatal(err)
	}
	if info.Run.Status != checkpoint.RunSucceeded {
		t.Errorf("run is %s after the woken owner ended; want succeeded", info.Run.Status)
	}
}
