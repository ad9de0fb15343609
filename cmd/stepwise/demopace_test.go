package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/cmd"
)

// demo --pace holds posting after each chunk, so an interrupt (the
// README's Ctrl-C drill) lands while it posts: with a pace of an hour, the
// demo posts its first chunk of 1000 transfers, waits, and an interrupt
// then ends the wait at once: exit 3, one chunk posted, and the same
// command again (without --pace) posts the rest.
func TestDemoPaceLandsAnInterruptMidPost(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	args := []string{"--db", db, "--log-format", "json", "demo", "--accounts", "40", "--transfers", "3000"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb syncBuffer // the demo writes them while the test reads
	exited := make(chan int, 1)
	go func() {
		exited <- cmd.Execute(ctx, registry(), append(args, "--pace", "1h"), &out, &errb, extraCommands()...)
	}()
	deadline := time.After(30 * time.Second)
	for !strings.Contains(errb.String(), `"done":1000`) {
		select {
		case code := <-exited:
			t.Fatalf("demo --pace 1h exited %d before its first chunk's progress line\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
		case <-deadline:
			t.Fatalf("no progress line of the first chunk in 30s\nstderr:\n%s", errb.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	var code int
	select {
	case code = <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the interrupt did not end the pace's wait within 10s")
	}
	if code != cmd.ExitInterrupted || !strings.Contains(out.String(), "interrupted") {
		t.Fatalf("interrupted demo: exit %d, want 3 (interrupted)\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	show, _ := mustRun(t, cmd.ExitOK, "--db", db, "show", "settle/2026-11-28")
	wantContains(t, "show of the interrupted demo", show, "post        1000  3000   1000")
	again, _ := mustRun(t, cmd.ExitOK, args...)
	wantContains(t, "the demo again", again, "already has 2026-11-28's transfers", "settlement 2026-11-28: 3000 transfers")
}
