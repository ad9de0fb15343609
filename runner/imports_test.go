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
// checkpoint, and examples use jobs and steps only. The top level is the
// design card's (checkpoint, steps, jobs, runner, cmd, examples); the
// layers below are packages under it. runner/ops (what an operator sees of
// runs and does to them) sits above runner; cmd/internal/httpapi (the HTTP
// API) above ops, and cmd/internal/web (the dashboard's pages, which read
// the ops views and operate through the API) beside it; cmd/internal/bench
// (the workloads of `stepwise bench`) sits beside cmd, which alone imports
// it. cmd imports them all, so the CLI, the API and the dashboard share one
// implementation of every view and operation. The checkpoint contract
// imports no other layer; a backend (checkpoint/sqlite, and any store beside
// it) implements the contract, and outside tests only checkpoint/stores,
// the one store picker (cmd opens the store --db names through it), and
// bench's raw baselines may import one.
var layerAllows = map[string][]string{
	"checkpoint":     {},
	"backend":        {"checkpoint"},
	"checkpointtest": {"checkpoint", "backend"},
	"steps":          {"checkpoint"},
	"jobs":           {"steps", "checkpoint"},
	"runner":         {"jobs", "steps", "checkpoint"},
	"examples":       {"jobs", "steps"},
	"bench":          {"runner", "jobs", "steps", "checkpoint", "backend", "examples"},
	"ops":            {"runner", "jobs", "steps", "checkpoint"},
	"httpapi":        {"ops", "runner", "jobs", "steps", "checkpoint"},
	"web":            {"ops", "runner", "jobs", "steps", "checkpoint"},
	"cmd":            {"httpapi", "web", "ops", "runner", "jobs", "steps", "checkpoint", "backend", "examples", "bench"},
}

// testAllows are the layers a layer's own test files may import besides
// layerAllows: the real stores the tests open.
var testAllows = map[string][]string{
	"backend": {"checkpointtest"},
	"bench":   {"checkpointtest"},
	"steps":   {"checkpointtest", "backend"},
	"jobs":    {"checkpointtest", "backend"},
	"runner":  {"checkpointtest", "backend"},
	"ops":     {"checkpointtest", "backend"},
	"httpapi": {"checkpointtest", "backend", "examples"},
	"web":     {"checkpointtest", "backend", "examples", "httpapi"},
	"cmd":     {"checkpointtest"},
}

// forbidden lists the imports (a path or a path prefix ending in /) a layer
// must not have outside its tests: the contract knows no database driver.
var forbidden = map[string][]string{
	"checkpoint": {"database/sql", "modernc.org/", "github.com/jackc/"},
}

// storePicker is the one backend package the layers above checkpoint may
// import outside tests: checkpoint/stores opens a store (or a tool's
// database) by its location, whatever its backend, and the backends'
// failures have backend-neutral kinds in checkpoint. backendImporters are
// the layers that may import a backend itself: the backends and the
// stores' test helpers, and bench, whose raw baselines measure each
// backend's own SQL.
const storePicker = modulePath + "/checkpoint/stores"

var backendImporters = []string{"backend", "checkpointtest", "bench"}

// subLayers are the packages below a top-level directory that are layers of
// their own, by path below the module (a package below one belongs to it).
var subLayers = map[string]string{
	"runner/ops":           "ops",
	"cmd/internal/httpapi": "httpapi",
	"cmd/internal/web":     "web",
	"cmd/internal/bench":   "bench",
}

// topLevel is the design card's top level: every package of the module sits
// below one of these directories.
var topLevel = []string{"checkpoint", "steps", "jobs", "runner", "cmd", "examples"}

// layerOf returns the layer of a Stepwise package: its sub-layer when it is
// (or sits below) one of subLayers, else its top-level directory ("" for the
// modulePath root; "top-level X" for a directory X the card does not name),
// except below checkpoint, where a package whose name ends
// in "test" is a test helper ("checkpointtest") and any other is a backend.
// ok is false for a package outside the module.
func layerOf(path string) (layer string, ok bool) {
	if path == modulePath {
		return "", true
	}
	rest, ok := strings.CutPrefix(path, modulePath+"/")
	if !ok {
		return "", false
	}
	for prefix, sub := range subLayers {
		if rest == prefix || strings.HasPrefix(rest, prefix+"/") {
			return sub, true
		}
	}
	layer, sub, _ := strings.Cut(rest, "/")
	if !slices.Contains(topLevel, layer) {
		return "top-level " + layer, true // no layer: outside the card's top level
	}
	if layer == "checkpoint" && sub != "" {
		if strings.HasSuffix(sub, "test") {
			return "checkpointtest", true
		}
		return "backend", true
	}
	return layer, true
}

// pkgImports are one package's imports: of its own code, and of its
// in-package test files (compiled into it).
type pkgImports struct {
	Imports, TestImports []string
}

// importViolations checks each package's Stepwise imports against
// layerAllows, testAllows and forbidden, and describes every wrong arrow.
func importViolations(pkgs map[string]pkgImports) []string {
	var bad []string
	for pkg, deps := range pkgs {
		from, ok := layerOf(pkg)
		if !ok {
			continue
		}
		allowed, known := layerAllows[from]
		if !known {
			bad = append(bad, pkg+" is outside the fixed layout (checkpoint, steps, jobs, runner, cmd, examples)")
			continue
		}
		for _, dep := range deps.Imports {
			if to, _ := layerOf(dep); to == "backend" && dep != storePicker && slices.Contains(allowed, "backend") && !slices.Contains(backendImporters, from) {
				bad = append(bad, pkg+" imports "+dep+" (outside tests, only checkpoint/stores picks a backend; "+from+" opens stores through it)")
			}
			for _, f := range forbidden[from] {
				if dep == f || strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f) {
					bad = append(bad, pkg+" imports "+dep+" (the "+from+" layer imports no database driver)")
				}
			}
		}
		check := func(deps []string, allowed []string) {
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
		check(deps.Imports, allowed)
		check(deps.TestImports, append(slices.Clone(allowed), testAllows[from]...))
	}
	slices.Sort(bad)
	return bad
}

func TestImportViolationsCatchesWrongArrows(t *testing.T) {
	p := func(s string) string { return modulePath + "/" + s }
	got := importViolations(map[string]pkgImports{
		p("checkpoint"):                {Imports: []string{"database/sql", p("checkpoint/checkpointtest")}},
		p("checkpoint/checkpointtest"): {Imports: []string{p("checkpoint"), p("checkpoint/sqlite")}},
		p("checkpoint/sqlite"):         {Imports: []string{p("checkpoint"), "database/sql", "modernc.org/sqlite", p("steps")}},
		p("steps"):                     {Imports: []string{p("checkpoint"), p("jobs"), p("checkpoint/sqlite")}, TestImports: []string{p("checkpoint/sqlite")}},
		p("jobs"):                      {Imports: []string{p("steps"), p("runner")}},
		p("runner"):                    {Imports: []string{p("jobs"), p("cmd")}, TestImports: []string{p("checkpoint/checkpointtest")}},
		p("examples/report"):           {Imports: []string{p("jobs"), p("steps"), p("checkpoint")}},
		p("cmd"):                       {Imports: []string{p("checkpoint/sqlite"), p("checkpoint/stores")}, TestImports: []string{p("checkpoint/postgres")}},
		p("cmd/internal/bench"):        {Imports: []string{p("checkpoint/postgres")}},
		p("cmd/stepwise"):              {Imports: []string{p("cmd"), p("examples/report")}},
		p("internal/x"):                {},
		p("httpapi"):                   {},
		p("cmd/internal/web"):          {Imports: []string{p("cmd")}},
		p("runner/ops"):                {Imports: []string{p("cmd/internal/httpapi")}},
		"example.com/other":            {Imports: []string{p("cmd")}},
	})
	want := []string{
		p("checkpoint") + " imports database/sql",
		p("checkpoint") + " imports " + p("checkpoint/checkpointtest"),
		p("checkpoint/sqlite") + " imports " + p("steps"),
		p("cmd") + " imports " + p("checkpoint/sqlite") + " (outside tests, only checkpoint/stores",
		p("cmd/internal/web") + " imports " + p("cmd"),
		p("examples/report") + " imports " + p("checkpoint"),
		p("httpapi") + " is outside",
		p("internal/x") + " is outside",
		p("jobs") + " imports " + p("runner"),
		p("runner") + " imports " + p("cmd"),
		p("runner/ops") + " imports " + p("cmd/internal/httpapi"),
		p("steps") + " imports " + p("checkpoint/sqlite"),
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
		`{{.ImportPath}}|{{join .Imports " "}}|{{join .TestImports " "}}`, modulePath+"/...")
	cmd.Dir = ".."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	imports := map[string]pkgImports{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Split(sc.Text(), "|")
		if len(fields) != 3 {
			continue
		}
		imports[fields[0]] = pkgImports{Imports: strings.Fields(fields[1]), TestImports: strings.Fields(fields[2])}
	}
	for _, must := range []string{"checkpoint", "checkpoint/sqlite", "steps", "jobs", "runner", "cmd"} {
		if _, ok := imports[modulePath+"/"+must]; !ok {
			t.Fatalf("go list did not report %s/%s; got %d packages:\n%s", modulePath, must, len(imports), out)
		}
	}
	for _, v := range importViolations(imports) {
		t.Error(v)
	}
}

// TestTopLevelIsTheDesignCards fails on a file or directory git tracks at
// the top of the repository that the design card does not name (a stray
// log committed by mistake, a package outside the layout).
func TestTopLevelIsTheDesignCards(t *testing.T) {
	gitTool, err := exec.LookPath("git")
	if err != nil {
		t.Fatalf("listing the repository's files needs git: %v", err)
	}
	cmd := exec.Command(gitTool, "ls-files")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	allowed := append([]string{"go.mod", "go.sum", "README.md", ".ci", ".gitignore"}, topLevel...)
	seen := map[string]bool{}
	for _, f := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		top, _, _ := strings.Cut(f, "/")
		if !seen[top] && !slices.Contains(allowed, top) {
			t.Errorf("%s is at the top level; the design card names only %s", top, strings.Join(allowed, ", "))
		}
		seen[top] = true
	}
	if !seen["go.mod"] || !seen["runner"] {
		t.Fatalf("git ls-files listed %d top-level entries without go.mod and runner: not this repository?", len(seen))
	}
}
