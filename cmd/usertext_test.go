package cmd

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestErrorsCarryNoGoPackagePrefixes: what the command line prints for
// an unknown job, bad parameters, a run not recorded and a tokens file
// others may read says what is wrong without the Go packages' "jobs: ",
// "checkpoint: " or "httpapi: " prefixes.
func TestErrorsCarryNoGoPackagePrefixes(t *testing.T) {
	db, side := testFiles(t)
	createDB(t, db)
	tokens := filepath.Join(t.TempDir(), "tokens.txt")
	if err := os.WriteFile(tokens, []byte("oncall:operate:"+strings.Repeat("0123456789abcdef", 4)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--db", db, "run", "nope"}, `stepwise: unknown job: "nope"`},
		{crashyArgs(db, "k", side, "steps=many"), `stepwise: bad parameters: -p steps=many: parameter "steps"`},
		{[]string{"--db", db, "show", "crashy/none"}, `stepwise: not found: no run "crashy/none"`},
		{[]string{"--db", db, "serve", "--listen", "127.0.0.1:0", "--tokens", tokens}, "stepwise: --tokens: bad tokens file: " + tokens + " has mode 0644"},
	} {
		var out, errb syncBuffer
		code := Execute(context.Background(), testRegistry(), c.args, &out, &errb)
		got := errb.String()
		if code == ExitOK || !strings.Contains(got, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want it to say %q", c.args, code, got, c.want)
		}
		for _, p := range []string{"jobs: ", "checkpoint: ", "steps: ", "runner: ", "httpapi: "} {
			if strings.Contains(got, p) {
				t.Errorf("%v: stderr has the Go package prefix %q: %s", c.args, p, got)
			}
		}
	}
}
