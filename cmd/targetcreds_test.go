package cmd

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

type feeParams struct {
	Key    string `param:"key,key" help:"run key"`
	Ledger string `param:"ledger" format:"database" help:"ledger database"`
}

// feeRegistry has fee: one effect on the ledger's accounts table.
func feeRegistry() *jobs.Registry {
	return oneJob("fee", func(ctx context.Context, run *steps.Run, p feeParams) error {
		table := checkpoint.Table{Name: "accounts", Key: "id", Value: "balance", Version: "version"}
		_, err := steps.Apply(ctx, run, steps.ID("fee"), steps.Target{Location: p.Ledger, Table: table},
			func(ctx context.Context, e *steps.Effects) (string, error) {
				e.Add("acct:1", -1)
				return "charged", nil
			})
		return err
	})
}

// TestShellRunOfATargetTakesNoPasswordFromTheEnvironment: a run that
// names a target (as one started over the API does), run or resumed at the
// shell with --targets and PGPASSWORD set for the checkpoint store, sends
// the target's server no password from the environment: only a target's
// own URL carries credentials, as in serve and worker.
func TestShellRunOfATargetTakesNoPasswordFromTheEnvironment(t *testing.T) {
	const secret = "env-secret-hunter2"
	t.Setenv("PGPASSWORD", secret)
	fake := pgtest.NewFakeServer(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "targets")
	if err := os.WriteFile(file, []byte("ledger=postgres://stepwise@127.0.0.1:"+fake.Port()+"/ledger?sslmode=disable\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "stepwise.db")
	for _, args := range [][]string{
		{"run", "fee", "-p", "key=a", "-p", "ledger=target:ledger", "--targets", file, "--progress", "none"},
		{"resume", "fee/a", "--targets", file, "--progress", "none"},
		{"rerun", "fee/a", "--targets", file, "--progress", "none"},
	} {
		code, text := execWith(t, feeRegistry(), append([]string{"--db", db}, args...)...)
		if code == ExitOK || strings.Contains(text, secret) {
			t.Fatalf("%v against a server refusing every password: exit %d\n%s", args, code, text)
		}
	}
	conns, passwords := fake.Seen()
	if conns == 0 {
		t.Fatal("the fake server saw no connection: the test did not reach the target")
	}
	for _, pw := range passwords {
		if pw == secret {
			t.Fatalf("the target's server received PGPASSWORD (%d connections, passwords %q)", conns, passwords)
		}
	}
}
