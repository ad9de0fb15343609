package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// TestDryRunPlansAnOutsideCall: --dry-run of a job with a steps.Call
// plans the call (its step and idempotency key), makes no call, stops
// there and exits 0 instead of "failed"; once the call is checkpointed a
// dry run goes past it to the steps after.
func TestDryRunPlansAnOutsideCall(t *testing.T) {
	db := testDB(t)
	createDB(t, db)
	p := newProvider(t)
	cli := func(more ...string) opsOut {
		var out, errb syncBuffer
		args := providerArgs(db, p.srv.URL, more...)
		code := Execute(context.Background(), testRegistry(), args, &out, &errb)
		return opsOut{args: args, code: code, stdout: out.String(), stderr: errb.String()}
	}
	dry := cli("--dry-run")
	if dry.code != ExitOK || !strings.Contains(dry.stdout, "pay  outside call with idempotency key provider/k/pay: not called; the dry run stops here") ||
		!strings.Contains(dry.stdout, "1 step would run, 0 are already checkpointed") {
		t.Fatalf("dry run of a call: exit %d\nstdout:\n%s\nstderr:\n%s", dry.code, dry.stdout, dry.stderr)
	}
	if strings.Contains(dry.stderr+dry.stdout, "failed") {
		t.Errorf("the dry run says failed:\n%s%s", dry.stdout, dry.stderr)
	}
	js := cli("--dry-run", "--json")
	var v struct {
		Plans []struct {
			Step, Call string
		} `json:"plans"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(js.stdout), &v); err != nil || js.code != ExitOK || len(v.Plans) != 1 ||
		v.Plans[0].Step != "pay" || v.Plans[0].Call != "provider/k/pay" || v.Error != "" {
		t.Errorf("--dry-run --json: exit %d, %+v (%v)\n%s%s", js.code, v, err, js.stdout, js.stderr)
	}
	if paid := p.paid(); len(paid) != 0 || p.lookupCount() != 0 {
		t.Errorf("the dry runs reached the provider: paid %v, %d lookups", paid, p.lookupCount())
	}
	st := openStore(t, db)
	if _, err := st.Run(context.Background(), "provider/k"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("after the dry runs the run is recorded (%v); want nothing written", err)
	}
	if real := cli(); real.code != ExitOK {
		t.Fatalf("the real run: exit %d\n%s%s", real.code, real.stdout, real.stderr)
	}
	again := cli("--dry-run", "--force")
	if again.code != ExitOK || strings.Contains(again.stdout, "outside call") || !strings.Contains(again.stdout, "2 are already checkpointed") {
		t.Errorf("dry run after the call was made: exit %d\n%s%s", again.code, again.stdout, again.stderr)
	}
	if paid := p.paid(); len(paid) != 1 {
		t.Errorf("paid %v; want the real run's one payment", paid)
	}
}
