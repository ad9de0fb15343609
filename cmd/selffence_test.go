package cmd

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
)

// A runner that fenced itself exits 4, like one fenced by another runner;
// the library's error names no flag, the command's hint does.
func TestSelfFencedExitsHeld(t *testing.T) {
	t.Parallel()
	lost := &runner.LeaseLostError{RunID: "settle/d", Attempt: 2, Expiry: time.Date(2026, 11, 28, 2, 0, 30, 0, time.UTC),
		Margin: 10 * time.Second, Failures: 3, LastErr: errors.New("connection refused")}
	for _, err := range []error{lost, fmt.Errorf("%w; the attempt was recorded as interrupted", lost),
		fmt.Errorf("%w; its end could not be recorded either (%w)", lost, checkpoint.ErrLocked)} {
		if code := ExitCode(err); code != ExitHeld {
			t.Errorf("ExitCode(%v) = %d; want %d", err, code, ExitHeld)
		}
		if h := hint(err, "stepwise", noWaitFlag); !strings.Contains(h, "--lease") {
			t.Errorf("hint for %v = %q; want it to name --lease", err, h)
		}
		if strings.Contains(err.Error(), "--") {
			t.Errorf("library error %q names a flag", err)
		}
	}
	if !strings.Contains(exitCodesHelp, "self-fenced") {
		t.Error("exit code help does not list self-fencing under exit 4")
	}
}
