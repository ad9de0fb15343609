package cmd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
)

// issue 23.1: enqueue of a failed run's key says what to do instead of
// exiting 0 with nothing done, and `runs` says when a pooled run put back
// after a store fault is tried again.
func TestEnqueueOfAFailedRunAndTheNextTry(t *testing.T) {
	db := testDB(t)
	side := filepath.Join(t.TempDir(), "side.log")
	enqueue := func(key string) opsOut {
		return cliRun(t, []string{"--db", db, "enqueue", "opsledger", "-p", "key=" + key, "-p", "side=" + side})
	}
	for _, k := range []string{"failed", "later"} {
		if o := enqueue(k); o.code != ExitOK {
			t.Fatalf("enqueue %s: %s", k, o)
		}
	}
	st := openStore(t, db)
	ctx := context.Background()
	now := time.Now()
	for _, end := range []checkpoint.Ending{
		{Status: checkpoint.RunFailed, Error: "boom", At: now},
		{Status: checkpoint.RunInterrupted, Error: "store fault", At: now, RetryAfter: time.Hour},
	} {
		c, ok, err := st.ClaimNext(ctx, checkpoint.ClaimNextRequest{Owner: "w:1", Now: now, LeaseFor: time.Minute})
		if err != nil || !ok {
			t.Fatalf("claim: %v, %v", ok, err)
		}
		if err := st.Finish(ctx, c.Lease, end); err != nil {
			t.Fatal(err)
		}
	}
	o := enqueue("failed")
	if o.code != ExitOperator || !strings.Contains(o.stderr, "resume opsledger/failed") || !strings.Contains(o.stderr, "nothing enqueued") {
		t.Errorf("enqueue of a failed run's key: exit %d, want 5 naming the resume command\n%s", o.code, o)
	}
	if o := enqueue("later"); o.code != ExitOK || !strings.Contains(o.stdout, "exists already (interrupted)") {
		t.Errorf("enqueue of a run back in its queue: exit %d, want 0 saying it exists\n%s", o.code, o)
	}
	o = cliRun(t, []string{"--db", db, "runs"})
	if o.code != ExitOK || !strings.Contains(o.stdout, "next try at") {
		t.Errorf("runs does not say when the run back in its queue is tried again:\n%s", o)
	}
}

// issue 23.5: a lone run that failed on a database fault prints the
// resume line, as an interrupted one does; another failure does not.
func TestReportOfAStoreFaultSaysHowToResume(t *testing.T) {
	fault := &runner.StoreFaultError{RunID: "crashy/k", Tries: 6, Err: fmt.Errorf("connection closed: %w", checkpoint.ErrTransient)}
	var out bytes.Buffer
	if err := report(&Env{Stdout: &out, Name: "mytool"}, runner.Result{RunID: "crashy/k", Status: checkpoint.RunFailed, Attempt: 1}, fault); !errors.Is(err, checkpoint.ErrTransient) {
		t.Errorf("report returned %v; want the fault itself", err)
	}
	if want := "resume it with: mytool resume crashy/k\n"; !strings.HasSuffix(out.String(), want) {
		t.Errorf("report of a run failed on a store fault = %q, want it to end %q", out.String(), want)
	}
	out.Reset()
	report(&Env{Stdout: &out, Name: "mytool"}, runner.Result{RunID: "crashy/k", Status: checkpoint.RunFailed, Attempt: 1}, errors.New("bad input"))
	if strings.Contains(out.String(), "resume it with") {
		t.Errorf("report of an ordinary failure = %q; the resume line is for store faults", out.String())
	}
}
