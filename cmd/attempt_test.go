package cmd

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// TestAlreadySucceededRunShowsItsAttempt: `run --json` of a run that had
// already succeeded reports the attempt that made it succeed (from the
// store), never "attempt": 0, and its note has no Go package prefix.
func TestAlreadySucceededRunShowsItsAttempt(t *testing.T) {
	db, side := testFiles(t)
	cli := func(args ...string) opsOut {
		var out, errb syncBuffer
		code := Execute(context.Background(), testRegistry(), args, &out, &errb)
		return opsOut{args: args, code: code, stdout: out.String(), stderr: errb.String()}
	}
	type view struct {
		Status  string `json:"status"`
		Attempt int    `json:"attempt"`
		Note    string `json:"note"`
	}
	decode := func(o opsOut) view {
		t.Helper()
		var v view
		if err := json.Unmarshal([]byte(o.stdout), &v); err != nil || o.code != ExitOK {
			t.Fatalf("%v: exit %d, %v\n%s%s", o.args, o.code, err, o.stdout, o.stderr)
		}
		return v
	}
	run := append(crashyArgs(db, "k", side, "steps=1"), "--json")
	if v := decode(cli(run...)); v.Attempt != 1 || v.Status != "succeeded" {
		t.Fatalf("first run: %+v; want attempt 1 succeeded", v)
	}
	if o := cli("--db", db, "rerun", "crashy/k", "--force", "--reason", "again", "--operator", "ops"); o.code != ExitOK {
		t.Fatalf("rerun --force: exit %d\n%s%s", o.code, o.stdout, o.stderr)
	}
	v := decode(cli(run...))
	if v.Status != "succeeded" || v.Attempt != 2 || !strings.Contains(v.Note, "run already succeeded") || strings.Contains(v.Note, "checkpoint:") {
		t.Errorf("run of a succeeded run: %+v; want attempt 2 (the one that succeeded) and a note without a package prefix", v)
	}
}
