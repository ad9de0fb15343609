package cmd

import (
	"context"
	"strings"
	"testing"
)

// TestErrorsCarryNoGoPackagePrefixes: what the command line prints for
// an unknown job, bad parameters and a run not recorded says what is
// wrong without the Go packages' "jobs: " or "checkpoint: " prefixes.
func TestErrorsCarryNoGoPackagePrefixes(t *testing.T) {
	db, side := testFiles(t)
	createDB(t, db)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--db", db, "run", "nope"}, `stepwise: unknown job: "nope"`},
		{crashyArgs(db, "k", side, "steps=many"), `stepwise: bad parameters: -p steps=many: parameter "steps"`},
		{[]string{"--db", db, "show", "crashy/none"}, `stepwise: not found: no run "crashy/none"`},
	} {
		var out, errb syncBuffer
		code := Execute(context.Background(), testRegistry(), c.args, &out, &errb)
		got := errb.String()
		if code == ExitOK || !strings.Contains(got, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want it to say %q", c.args, code, got, c.want)
		}
		for _, p := range []string{"jobs: ", "checkpoint: ", "steps: ", "runner: "} {
			if strings.Contains(got, p) {
				t.Errorf("%v: stderr has the Go package prefix %q: %s", c.args, p, got)
			}
		}
	}
}
