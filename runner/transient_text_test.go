package runner_test

import (
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// A run that gave up on a partition's contention says so, and what to
// run, rather than blaming the database.
func TestStoreFaultErrorNamesContention(t *testing.T) {
	err := &runner.StoreFaultError{RunID: "settle/2026-11-29", Tries: 6, Err: &steps.ContendedError{Step: "post", Chunk: "chunk 3 of post",
		Replans: 40, Err: &checkpoint.VersionConflictError{Table: "accounts", Key: "A-1", Expected: 4, Found: 5}}}
	text := err.Error()
	for _, want := range []string{"gave up after contention on its target 6 times in a row", "chunk 3 of post re-planned 40 times",
		"once fewer writers move the target's keys", "resume it with `stepwise resume settle/2026-11-29`"} {
		if !strings.Contains(text, want) {
			t.Errorf("%q does not say %q", text, want)
		}
	}
	if strings.Contains(text, "database answers") {
		t.Errorf("%q blames the database for contention", text)
	}
}
