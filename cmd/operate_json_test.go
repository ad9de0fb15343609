package cmd

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// The manual operations print one JSON object under --json: what a
// script needs to know was done, and by whom.
func TestOperationsJSON(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	decode := func(o opsOut) operationView {
		t.Helper()
		var v operationView
		dec := json.NewDecoder(bytes.NewBufferString(o.stdout))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&v); err != nil || dec.More() {
			t.Fatalf("%v: stdout is not one JSON object: %v\n%s", o.args, err, o)
		}
		return v
	}
	c.staleCrashy("r")
	v := decode(c.want(ExitOK, nil, "recover", "crashy/r", "--reason", "host died", "--operator", "alice", "--json"))
	if v.RunID != "crashy/r" || v.Operation != "recover" || v.Result != "failed (resumable)" || v.Operator != "alice" ||
		v.Reason != "host died" || time.Since(v.At) > time.Hour {
		t.Errorf("recover --json = %+v", v)
	}
	if as := c.wantAudits("crashy/r", "recover"); len(as) == 1 && !as[0].At.Equal(v.At.Truncate(time.Microsecond)) { // the store keeps microseconds
		t.Errorf("recover --json says it was done at %s; the audit log records %s", v.At, as[0].At)
	}
	c.opsPastRun("p", "failed", time.Now().Add(-time.Hour))
	v = decode(c.want(ExitOK, nil, "reset", "crashy/p", "--step", "step/1", "--reason", "redo", "--operator", "bob", "--json"))
	if v.Operation != "reset" || v.Step != "step/1" || v.Result != "cleared" || v.Operator != "bob" {
		t.Errorf("reset --json = %+v", v)
	}
	c.staleCrashy("a")
	v = decode(c.want(ExitOK, nil, "abandon", "crashy/a", "--reason", "bad file", "--operator", "carol", "--json"))
	if v.Operation != "abandon" || v.Result != "abandoned" || v.Operator != "carol" || v.Reason != "bad file" {
		t.Errorf("abandon --json = %+v", v)
	}
	// rerun prints the run's outcome as one JSON document, like resume.
	o := c.want(ExitOK, nil, "rerun", "crashy/p", "--reason", "again", "--json")
	var res struct {
		RunID  string `json:"run_id"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal([]byte(o.stdout), &res); err != nil || res.RunID != "crashy/p" || res.Status != "succeeded" {
		t.Errorf("rerun --json: %+v, %v\n%s", res, err, o)
	}
	// A refusal stays an error on stderr with its exit code; stdout is empty.
	if o := c.want(ExitOperator, nil, "abandon", "crashy/a", "--reason", "again", "--json"); o.stdout != "" {
		t.Errorf("a refused abandon --json printed on stdout: %q", o.stdout)
	}
}
