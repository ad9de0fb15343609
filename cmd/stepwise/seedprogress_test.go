package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/cmd"
)

func TestSeedProgress(t *testing.T) {
	t.Parallel()
	seedArgs := func(extra ...string) []string {
		return append([]string{"--db", testDB(t), "--log-format", "json", "ledger", "seed", "--date", "2026-11-28",
			"--accounts", "20", "--transfers", "1200"}, extra...)
	}
	// Not on a terminal: a log line on stderr when the seed starts (the
	// next one only after a few seconds), stdout as before.
	out, errOut := mustRun(t, cmd.ExitOK, seedArgs()...)
	wantContains(t, "seed output", out, ": 1200 transfers on 2026-11-28 (seed 1)")
	var line struct {
		Message     string
		Done, Total int
	}
	if err := json.Unmarshal([]byte(strings.SplitN(errOut, "\n", 2)[0]), &line); err != nil ||
		line.Message != "seeding transfers" || line.Done != 0 || line.Total != 1200 {
		t.Errorf("the seed's first stderr line is not a JSON progress line of 0 of 1200 transfers (%v):\n%s", err, errOut)
	}
	if strings.Contains(out, "seeding transfers") {
		t.Errorf("progress went to stdout:\n%s", out)
	}
	// Quiet: --json, --progress none and --log-level warn print no progress.
	for _, extra := range [][]string{{"--json"}, {"--progress", "none"}, {"--log-level", "warn"}} {
		args := seedArgs(extra...)
		if extra[0] == "--log-level" {
			args = append(extra, seedArgs()...)
		}
		out, errOut := mustRun(t, cmd.ExitOK, args...)
		if errOut != "" {
			t.Errorf("seed %s wrote to stderr:\n%s", strings.Join(extra, " "), errOut)
		}
		if extra[0] == "--json" && !json.Valid([]byte(out)) {
			t.Errorf("seed --json printed no JSON:\n%s", out)
		}
	}
}
