package cmd

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/steps"
)

func TestItemChangedIsAnOperatorDecision(t *testing.T) {
	ce := &steps.ItemChangedError{RunID: "settle/2026-11-28", Step: "post", Key: "T-7", Change: steps.ItemContentChanged, Old: "aa", New: "bb"}
	err := fmt.Errorf("run settle/2026-11-28 failed: %w", ce)
	if code := ExitCode(err); code != ExitOperator {
		t.Fatalf("exit %d for %v, want %d", code, err, ExitOperator)
	}
	hinted := itemChangedHint(&Env{Name: "stepwise"}, err, "")
	if ExitCode(hinted) != ExitOperator {
		t.Fatalf("the hint lost the error: %v", hinted)
	}
	for _, want := range []string{"T-7", "stepwise resume settle/2026-11-28 --accept-changed --reason",
		"stepwise reset settle/2026-11-28 --step post --force"} {
		if !strings.Contains(hinted.Error(), want) {
			t.Errorf("hint lacks %q:\n%v", want, hinted)
		}
	}
	beyond := itemChangedHint(&Env{Name: "stepwise"}, &steps.ItemChangedError{RunID: "r/1", Step: "post", Key: "T-9", Change: steps.ItemBeyondTotal, Declared: 8}, "")
	if !strings.Contains(beyond.Error(), "count is stale") {
		t.Errorf("an item beyond the total should point at the step that counted: %v", beyond)
	}
	if other := fmt.Errorf("plain"); itemChangedHint(&Env{Name: "stepwise"}, other, "r/1") != other {
		t.Error("other errors must pass through unchanged")
	}
}

func TestAcceptChangedNeedsAReason(t *testing.T) {
	c := newOpsCLI(t)
	c.want(ExitUsage, []string{"--accept-changed needs --reason"}, "resume", "opsbatch/k1", "--accept-changed")
	c.want(ExitUsage, []string{"--accept-changed needs --reason"}, "rerun", "opsbatch/k1", "--accept-changed")
}

// An acceptance is audited under a name: with no --operator,
// $STEPWISE_OPERATOR or $USER it is refused, naming how to give one,
// instead of being recorded as "unknown".
func TestAcceptChangedNeedsAnOperator(t *testing.T) {
	c := newOpsCLI(t)
	t.Setenv("USER", "")
	t.Setenv("STEPWISE_OPERATOR", "")
	for _, cmd := range []string{"resume", "rerun"} {
		c.want(ExitUsage, []string{"--accept-changed needs to know who accepts", "--operator", "$STEPWISE_OPERATOR"},
			cmd, "opsbatch/k1", "--accept-changed", "--reason", "checked")
	}
}
