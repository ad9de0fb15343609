package runner_test

import (
	"bufio"
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const modulePath = "github.com/stepwise-run/stepwise"

// layerAllows says which Stepwise layers each layer may import, besides
// itself: imports flow one way, cmd -> runner -> jobs -> steps ->
// checkpoint, and examples use jobs and steps only.
var layerAllows = map[string][]string{
	"checkpoint": {},
	"steps":      {"checkpoint"},
	"jobs":       {"steps", "checkpoint"},
	"runner":     {"jobs", "steps", "checkpoint"},
	"examples":   {"jobs", "steps"},
	"cmd":        {"runner", "jobs", "steps", "checkpoint", "examples"},
}

// layerOf returns the top-level directory of a Stepwise package ("" for the
// modulePath root), and whether path is a Stepwise package at all.
func layerOf(path string) (string, bool) {
	if path == modulePath {
		return "", true
	}
	rest, ok := strings.CutPrefix(path, modulePath+"/")
	if !ok {
		return "", false
	}
	layer, _, _ := strings.Cut(rest, "/")
	return layer, true
}

// importViolations checks each package's Stepwise imports against
// layerAllows and describes every wrong arrow.
func importViolations(imports map[string][]string) []string {
	var bad []string
	for pkg, deps := range imports {
		from, ok := layerOf(pkg)
		if !ok {
			continue
		}
		allowed, known := layerAllows[from]
		if !known {
			bad = append(bad, pkg+" is outside the fixed layout (checkpoint, steps, jobs, runner, cmd, examples)")
			continue
		}
		for _, dep := range deps {
			to, ok := layerOf(dep)
			if !ok || to == from {
				continue
			}
			if !slices.Contains(allowed, to) {
				bad = append(bad, pkg+" imports "+dep+" ("+from+" may import only "+strings.Join(allowed, ", ")+")")
			}
		}
	}
	slices.Sort(bad)
	return bad
}

func TestImportViolationsCatchesWrongArrows(t *testing.T) {
	p := func(s string) string { return modulePath + "/" + s }
	got := importViolations(map[string][]string{
		p("checkpoint"):                {"database/sql", p("checkpoint/checkpointtest")},
		p("checkpoint/checkpointtest"): {p("checkpoint")},
		p("steps"):                     {p("checkpoint"), p("jobs")},
		p("jobs"):                      {p("steps"), p("runner")},
		p("runner"):                    {p("jobs"), p("cmd")},
		p("examples/report"):           {p("jobs"), p("steps"), p("checkpoint")},
		p("cmd/stepwise"):              {p("cmd"), p("examples/report")},
		p("internal/x"):                nil,
		"example.com/other":            {p("cmd")},
	})
	want := []string{
		p("examples/report") + " imports " + p("checkpoint"),
		p("internal/x") + " is outside",
		p("jobs") + " imports " + p("runner"),
		p("runner") + " imports " + p("cmd"),
		p("steps") + " imports " + p("jobs"),
	}
	if len(got) != len(want) {
		t.Fatalf("violations =\n%s\nwant %d", strings.Join(got, "\n"), len(want))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("violation %d = %q; want it to start %q", i, got[i], want[i])
		}
	}
}

// TestImportsFlowOneWay lists every package of the modulePath with its imports
// (those of its own test files too, which are compiled into the package)
// and fails on an import against the layering.
func TestImportsFlowOneWay(t *testing.T) {
	goTool, err := exec.LookPath("go") // go test puts GOROOT/bin first on PATH
	if err != nil {
		t.Fatalf("the go command is needed to list imports: %v", err)
	}
	cmd := exec.Command(goTool, "list", "-f",
		`{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}}`, modulePath+"/...")
	cmd.Dir = ".."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	imports := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		imports[fields[0]] = fields[1:]
	}
	for _, must := range []string{"checkpoint", "steps", "jobs", "runner", "cmd"} {
		if _, ok := imports[modulePath+"/"+must]; !ok {
			t.Fatalf("go list did not report %s/%s; got %d packages:\n%s", modulePath, must, len(imports), out)
		}
	}
	for _, v := range importViolations(imports) {
		t.Error(v)
	}
}
