package runner_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// checkpointInterfaces returns the names of the interface types the
// checkpoint contract package declares (its non-test files in dir).
func checkpointInterfaces(t *testing.T, dir string) map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok {
				if _, ok := ts.Type.(*ast.InterfaceType); ok {
					names[ts.Name.Name] = true
				}
			}
			return true
		})
	}
	if !names["Backend"] || !names["Store"] {
		t.Fatalf("found no Backend or Store interface in %s (found %v); the test reads the wrong directory", dir, names)
	}
	return names
}

// capabilityAssertions returns, as "file:line: expr", every type assertion
// and type switch case in the Go file src that asks whether a value is one
// of the checkpoint interfaces named in ifaces, or an interface literal
// mentioning the checkpoint package (a probe for a store's capability, or
// a look through a wrapper).
func capabilityAssertions(fset *token.FileSet, path string, src any, ifaces map[string]bool) ([]string, error) {
	f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	local := ""
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == modulePath+"/checkpoint" {
			local = "checkpoint"
			if imp.Name != nil {
				local = imp.Name.Name
			}
		}
	}
	if local == "" || local == "_" {
		return nil, nil
	}
	// names reports whether type expression e is a checkpoint interface.
	names := func(e ast.Expr) bool {
		found := false
		ast.Inspect(e, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == local {
				_, literal := e.(*ast.InterfaceType)
				found = found || literal || ifaces[sel.Sel.Name]
			}
			return true
		})
		return found
	}
	var bad []string
	report := func(n ast.Node, e ast.Expr) {
		var b strings.Builder
		b.WriteString(fset.Position(n.Pos()).String())
		b.WriteString(": .(")
		b.WriteString(types(e))
		b.WriteString(")")
		bad = append(bad, b.String())
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.TypeAssertExpr:
			if n.Type != nil && names(n.Type) {
				report(n, n.Type)
			}
		case *ast.TypeSwitchStmt:
			for _, c := range n.Body.List {
				for _, e := range c.(*ast.CaseClause).List {
					if names(e) {
						report(e, e)
					}
				}
			}
		}
		return true
	})
	return bad, nil
}

// types prints a type expression the way it reads in source, enough to
// name it in a failure.
func types(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.SelectorExpr:
		return types(e.X) + "." + e.Sel.Name
	case *ast.Ident:
		return e.Name
	case *ast.StarExpr:
		return "*" + types(e.X)
	case *ast.InterfaceType:
		return "interface{...}"
	default:
		return "?"
	}
}

// TestNoCapabilityAssertionsAboveCheckpoint holds the one typed store
// handle: above checkpoint/*, code takes a checkpoint.Backend (which both
// stores implement in full, as each asserts at compile time) and never
// finds out by type assertion what a store can do, so a wrapper cannot hide
// a capability (a scheduler's claim counter once hid partitions that way).
// The one optional part of the contract, QueueWaker, is probed inside
// checkpoint, in one place: checkpoint.Waker. Every Go file of the module
// outside checkpoint/ is parsed, tests included.
func TestNoCapabilityAssertionsAboveCheckpoint(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	ifaces := checkpointInterfaces(t, filepath.Join(root, "checkpoint"))
	fset := token.NewFileSet()
	var bad []string
	seen := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == "checkpoint" || rel == "testdata" || d.Name() == "testdata" || (rel != "." && strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		seen++
		found, err := capabilityAssertions(fset, path, nil, ifaces)
		for _, f := range found {
			bad = append(bad, strings.TrimPrefix(f, root+string(filepath.Separator)))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 100 {
		t.Fatalf("parsed only %d Go files under %s; the walk missed the module", seen, root)
	}
	slices.Sort(bad)
	for _, b := range bad {
		t.Errorf("%s asks a checkpoint interface for a capability by type assertion: take a checkpoint.Backend "+
			"(add the method to the contract, both stores implement it), or probe an optional part in checkpoint", b)
	}
}

// TestCapabilityAssertionsAreFound checks the checker itself on source that
// has each kind of probe, and on source that has none.
func TestCapabilityAssertionsAreFound(t *testing.T) {
	ifaces := map[string]bool{"Store": true, "QueueStore": true, "QueueWaker": true}
	src := `package p

import cp "` + modulePath + `/checkpoint"

func probes(s cp.Store, tx cp.Tx, v any) {
	_, _ = s.(cp.QueueStore)
	_ = s.(interface{ Unwrap() cp.Store })
	switch v.(type) {
	case cp.QueueWaker:
	case int, string:
	}
	_ = v.(cp.Item) // a struct: no capability
	_ = v.(error)
}
`
	fset := token.NewFileSet()
	got, err := capabilityAssertions(fset, "p.go", src, ifaces)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"p.go:6:9: .(cp.QueueStore)", "p.go:7:6: .(interface{...})", "p.go:9:7: .(cp.QueueWaker)"}
	if !slices.Equal(got, want) {
		t.Errorf("found %q; want %q", got, want)
	}
	none, err := capabilityAssertions(fset, "q.go", "package q\n\nfunc f(v any) { _ = v.(error) }\n", ifaces)
	if err != nil || len(none) != 0 {
		t.Errorf("in a file without the checkpoint import found %q, %v; want nothing", none, err)
	}
}
