package ops_test

import (
	"testing"

	"github.com/stepwise-run/stepwise/runner/ops"
)

func TestUserTextDropsGoPackagePrefixes(t *testing.T) {
	for in, want := range map[string]string{
		"steps: checkpoint step count: checkpoint: database is locked": "checkpoint step count: database is locked",
		"dry run of settle/x failed: steps: step pay: boom":            "dry run of settle/x failed: step pay: boom",
		`run settle/x has no step "nope" (steps: count, post)`:         `run settle/x has no step "nope" (steps: count, post)`,
		"the steps: 3 of them":                              "the steps: 3 of them",
		"no checkpoint: here":                               "no checkpoint: here",
		"--tokens: httpapi: bad tokens file: line 1: short": "--tokens: bad tokens file: line 1: short",
	} {
		if got := ops.UserText(in); got != want {
			t.Errorf("UserText(%q) = %q; want %q", in, got, want)
		}
	}
	if got := ops.Sentence("steps: step pay: boom"); got != "Step pay: boom." {
		t.Errorf("Sentence = %q", got)
	}
}
