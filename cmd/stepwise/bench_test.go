package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/cmd/internal/bench"
)

// benchRows are the workloads `stepwise bench` reports, in order.
var benchRows = []string{
	"per-step durable commit (steps.Do, no-op)",
	"per-step durable commit, one same-store effect (steps.Apply)",
	"chunked transfer posting (settle job, chunk 1000, same store)",
	"rerun of the finished run (forced; every step replays)",
	"rerun, every item done but the post step unmarked",
	"queue claims, 1 claimers (ClaimNext + Finish)",
	"queue claims, 4 claimers (ClaimNext + Finish)",
	"queue claims, 16 claimers (ClaimNext + Finish)",
	"queue drain, 2 slots (runner.Worker)",
	"queue drain, 3 slots (runner.Worker)",
}

// tinyBench runs bench on tiny sizes in a directory of the test's own and
// checks it left nothing behind there, nor at --db. It stays on SQLite
// whatever STEPWISE_TEST_STORE says: these tests hold the SQLite table
// (raw SQLite baselines, synchronous=full) and its files.
func tinyBench(t *testing.T, extra ...string) (stdout, stderr string) {
	t.Helper()
	dir := t.TempDir()
	db := filepath.Join(dir, "stepwise.db")
	args := append([]string{"--db", db, "bench", "--items", "300", "--steps", "10", "--accounts", "10", "--claims", "40", "--drain", "30", "--slots", "2,3", "--dir", dir}, extra...)
	stdout, stderr = mustRun(t, cmd.ExitOK, args...)
	left, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("bench left %d files behind in --dir (the first: %s)", len(left), left[0].Name())
	}
	wantContains(t, "bench progress", stderr, "bench: per-step durable commits", "bench: chunked posting", "bench: reruns")
	return stdout, stderr
}

var columnGap = regexp.MustCompile(`\s{3,}`)

func TestBenchTable(t *testing.T) {
	t.Parallel()
	out, _ := tinyBench(t)
	wantContains(t, "bench output", out, "300 transfers over 10 accounts, chunk 1000; synchronous=full",
		"workload", "ours", "raw SQLite", "ratio", "goal")
	lines := strings.Split(out, "\n")
	goals := []string{">= 0.9", ">= 0.95", ">= 0.6", "<= 1.5", "-", ">= 0.5", ">= 0.5", ">= 0.5", ">= 0.5", ">= 0.5"} // the unmarked rerun reads the source: reported, no goal
	units := []string{"steps/s", "steps/s", "items/s", "s", "s", "claims/s", "claims/s", "claims/s", "runs/s", "runs/s"}
	for i, name := range benchRows {
		var row []string
		for _, l := range lines {
			if strings.HasPrefix(l, name+"   ") {
				row = columnGap.Split(strings.TrimSpace(l), -1)
				break
			}
		}
		if len(row) != 6 {
			t.Errorf("row %q: got columns %q, want name, ours, raw, ratio, goal, verdict\n%s", name, row, out)
			continue
		}
		ours, raw := figure(t, row[1], units[i]), figure(t, row[2], units[i])
		ratio, err := strconv.ParseFloat(row[3], 64)
		if err != nil || ratio <= 0 || math.IsInf(ratio, 0) {
			t.Errorf("row %q: ratio %q is not a positive number: %v", name, row[3], err)
		}
		// The printed ratio is ours/raw, to its two decimals (the
		// figures are rounded too).
		if want := ours / raw; math.Abs(ratio-want) > 0.02*want+0.01 {
			t.Errorf("row %q: ratio %.2f, but ours/raw is %.3f/%.3f = %.3f", name, ratio, ours, raw, want)
		}
		if row[4] != goals[i] {
			t.Errorf("row %q: goal %q, want %q", name, row[4], goals[i])
		}
		if goals[i] == "-" && row[5] != "-" || goals[i] != "-" && row[5] != "met" && row[5] != "MISSED" {
			t.Errorf("row %q: verdict %q, want met or MISSED (\"-\" with no goal)", name, row[5])
		}
	}
	m := regexp.MustCompile(`peak memory of the chunked posting \(300 transfers\): Go heap ([0-9.]+) MiB, Go runtime total ([0-9.]+) MiB, RSS ([0-9.]+) MiB .*goal <= 100 MiB at 1000000 transfers: (met|MISSED)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no peak memory line in:\n%s", out)
	}
	for _, v := range m[1:4] {
		if f, err := strconv.ParseFloat(v, 64); err != nil || f <= 0 {
			t.Errorf("memory figure %q is not a positive number", v)
		}
	}
}

// figure parses a printed figure such as "6.51k steps/s" or "0.213 s".
func figure(t *testing.T, s, unit string) float64 {
	t.Helper()
	num, u, ok := strings.Cut(s, " ")
	if !ok || u != unit {
		t.Errorf("figure %q: want a number and the unit %q", s, unit)
		return math.NaN()
	}
	mult := 1.0
	switch {
	case strings.HasSuffix(num, "k"):
		num, mult = strings.TrimSuffix(num, "k"), 1e3
	case strings.HasSuffix(num, "M"):
		num, mult = strings.TrimSuffix(num, "M"), 1e6
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 {
		t.Errorf("figure %q is not a positive number", s)
	}
	return v * mult
}

func TestBenchJSON(t *testing.T) {
	t.Parallel()
	out, _ := tinyBench(t, "--json")
	var rep bench.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output is not JSON: %v\n%s", err, out)
	}
	if rep.Items != 300 || rep.Steps != 10 || rep.Accounts != 10 || rep.Chunk != 1000 || rep.Synchronous != "full" {
		t.Errorf("report header %+v", rep)
	}
	if len(rep.Results) != len(benchRows) {
		t.Fatalf("%d results, want %d: %+v", len(rep.Results), len(benchRows), rep.Results)
	}
	for i, r := range rep.Results {
		if r.Name != benchRows[i] {
			t.Errorf("result %d is %q, want %q", i, r.Name, benchRows[i])
		}
		if r.Ours <= 0 || r.Raw <= 0 || r.Ratio <= 0 || math.Abs(r.Ratio-r.Ours/r.Raw) > 1e-9*r.Ratio {
			t.Errorf("result %q: ours %v, raw %v, ratio %v; want positive figures and ratio = ours/raw", r.Name, r.Ours, r.Raw, r.Ratio)
		}
		if r.Goal == "" || r.Unit == "" {
			t.Errorf("result %q has no goal or unit: %+v", r.Name, r)
		}
	}
	if m := rep.Memory; m.Items != 300 || m.PeakGoHeapMiB <= 0 || m.PeakGoTotalMiB < m.PeakGoHeapMiB || m.GoalMiB != 100 || m.GoalItems != 1_000_000 {
		t.Errorf("memory %+v", m)
	}
	// The field names are part of the output's contract.
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"items", "steps", "results", "memory", "synchronous"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("--json output has no %q field", k)
		}
	}
	first := raw["results"].([]any)[0].(map[string]any)
	for _, k := range []string{"name", "unit", "ours", "raw", "ratio", "goal", "met"} {
		if _, ok := first[k]; !ok {
			t.Errorf("--json results have no %q field", k)
		}
	}
}

func TestBenchBadInput(t *testing.T) {
	t.Parallel()
	_, errOut := mustRun(t, cmd.ExitUsage, "bench", "--items", "0")
	wantContains(t, "bench error", errOut, "--items (0)")
}
