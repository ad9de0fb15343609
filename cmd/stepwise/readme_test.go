package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The README's Go snippets are compiled against the module, so a snippet
// that would not build (an unused variable, a renamed function) fails the
// tests. They stay fragments, readable where they stand: the test makes
// each a package of its own and adds what the reader takes for granted.
//
//   - A snippet of declarations is a file as it is. A lone expression
//     becomes `var _ = EXPR`; statements become a function body, with
//     `_ = v` for each variable they declare at the top (the rest of the
//     reader's job would use it).
//   - Imports are added for the packages a snippet names (readmeImports).
//   - readmePrelude declares what the snippets assume from the job around
//     them (a Transfer type, a ctx, the run); a snippet's own declaration
//     of one of those names replaces the prelude's.
//
// The packages exist only in a go build -overlay, never on disk, and
// //line directives make the compiler's errors name README.md's lines.

// readmeImports are the packages a snippet may name without importing.
var readmeImports = map[string]string{
	"context":    "context",
	"errors":     "errors",
	"fmt":        "fmt",
	"http":       "net/http",
	"log":        "log",
	"os":         "os",
	"strings":    "strings",
	"time":       "time",
	"json":       "encoding/json",
	"sql":        "database/sql",
	"checkpoint": "github.com/stepwise-run/stepwise/checkpoint",
	"steps":      "github.com/stepwise-run/stepwise/steps",
	"jobs":       "github.com/stepwise-run/stepwise/jobs",
	"runner":     "github.com/stepwise-run/stepwise/runner",
	"cmd":        "github.com/stepwise-run/stepwise/cmd",
	"settlement": "github.com/stepwise-run/stepwise/examples/settlement",
	"report":     "github.com/stepwise-run/stepwise/examples/report",
}

// readmePrelude is what the snippets take from the code around them.
const readmePrelude = `package readmesnippet

import (
	"context"

	"github.com/stepwise-run/stepwise/steps"
)

var _ = context.Background
var _ = steps.ID

// Day is the count step's output in "Defining a job".
type Day struct{ Transfers, Amount int64 }

// Transfer is one transfer of the day.
type Transfer struct {
	ID, From, To, Account string
	Amount                int64
}

// Receipt is a payment provider's answer.
type Receipt struct {
	ID     string "json:\"id\""
	Amount int64  "json:\"amount\""
}

func countTransfers(ctx context.Context, date string) (Day, error) { return Day{}, nil }

// transfersOf pages through date's transfers; total sizes the progress.
func transfersOf(date string, total int64) steps.Source[Transfer] {
	return steps.Slice([]Transfer(nil), func(t Transfer) string { return t.ID })
}

var accounts = steps.Table{Name: "accounts", Key: "id", Value: "balance", Version: "version"}

type paymentProvider struct{}

func (paymentProvider) Pay(ctx context.Context, account string, amount int64, key string) (Receipt, error) {
	return Receipt{}, nil
}

func (paymentProvider) FindPayment(ctx context.Context, key string) (any, bool, error) { return nil, false, nil }

// What a snippet of statements runs inside: a step of a job.
var (
	ctx      context.Context
	run      *steps.Run
	t        Transfer
	provider paymentProvider
)
`

// snippet is one Go block of the README.
type snippet struct {
	line int // README line of the block's first line of code
	src  string
}

// readmeSnippets returns the README's ```go blocks.
func readmeSnippets(readme string) []snippet {
	var out []snippet
	var cur *snippet
	for i, l := range strings.Split(readme, "\n") {
		switch {
		case cur == nil && strings.TrimSpace(l) == "```go":
			cur = &snippet{line: i + 2}
		case cur != nil && strings.TrimSpace(l) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.src += l + "\n"
		}
	}
	return out
}

// snippetFile makes the source of a snippet's package file, and the names
// it declares at the top level.
func snippetFile(s snippet) (src string, declared []string, err error) {
	const pkg = "package readmesnippet\n\n"
	at := fmt.Sprintf("//line README.md:%d\n", s.line)
	var body string
	fset := token.NewFileSet()
	if f, err := parser.ParseFile(fset, "", pkg+s.src, 0); err == nil {
		body = at + s.src
		for _, d := range f.Decls {
			declared = append(declared, declNames(d)...)
		}
	} else if _, err := parser.ParseExpr(s.src); err == nil {
		body = "var _ =\n" + at + s.src
	} else {
		wrapped := "func _() {\n" + at + s.src + "\n}\n"
		f, err := parser.ParseFile(fset, "", pkg+wrapped, 0)
		if err != nil {
			return "", nil, fmt.Errorf("README.md:%d: a Go block that is neither declarations, an expression nor statements: %w", s.line, err)
		}
		var uses []string
		for _, st := range f.Decls[0].(*ast.FuncDecl).Body.List {
			switch st := st.(type) {
			case *ast.AssignStmt:
				if st.Tok == token.DEFINE {
					for _, e := range st.Lhs {
						if id, ok := e.(*ast.Ident); ok && id.Name != "_" {
							uses = append(uses, "_ = "+id.Name)
						}
					}
				}
			case *ast.DeclStmt:
				for _, n := range declNames(st.Decl) {
					uses = append(uses, "_ = "+n)
				}
			}
		}
		body = "func _() {\n" + at + s.src + "//line readme_wrapper.go:1\n" + strings.Join(uses, "\n") + "\n}\n"
	}
	// The packages the snippet names: identifiers used as X in X.Sel that
	// the file itself does not declare.
	f, err := parser.ParseFile(fset, "", pkg+body, 0)
	if err != nil {
		return "", nil, fmt.Errorf("README.md:%d: %w", s.line, err)
	}
	unresolved := map[string]bool{}
	for _, id := range f.Unresolved { // object resolution finds the names the file does not declare
		unresolved[id.Name] = true
	}
	var imports []string
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && unresolved[id.Name] && readmeImports[id.Name] != "" &&
				!slices.Contains(imports, readmeImports[id.Name]) {
				imports = append(imports, readmeImports[id.Name])
			}
		}
		return true
	})
	sort.Strings(imports)
	var b strings.Builder
	b.WriteString(pkg)
	for _, p := range imports {
		fmt.Fprintf(&b, "import %q\n", p)
	}
	b.WriteString("\n" + body)
	return b.String(), declared, nil
}

// declNames are the names a declaration declares.
func declNames(d ast.Decl) []string {
	var out []string
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Recv == nil {
			out = append(out, d.Name.Name)
		}
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				out = append(out, s.Name.Name)
			case *ast.ValueSpec:
				for _, n := range s.Names {
					out = append(out, n.Name)
				}
			}
		}
	}
	return out
}

// preludeWithout is readmePrelude without its declarations of names.
func preludeWithout(t *testing.T, names []string) []byte {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "prelude.go", readmePrelude, parser.ParseComments)
	if err != nil {
		t.Fatalf("the prelude does not parse: %v", err)
	}
	f.Decls = slices.DeleteFunc(f.Decls, func(d ast.Decl) bool {
		if fd, ok := d.(*ast.FuncDecl); ok {
			return fd.Recv == nil && slices.Contains(names, fd.Name.Name)
		}
		gd := d.(*ast.GenDecl)
		gd.Specs = slices.DeleteFunc(gd.Specs, func(s ast.Spec) bool {
			switch s := s.(type) {
			case *ast.TypeSpec:
				return slices.Contains(names, s.Name.Name)
			case *ast.ValueSpec:
				return slices.ContainsFunc(s.Names, func(n *ast.Ident) bool { return slices.Contains(names, n.Name) })
			}
			return false
		})
		return len(gd.Specs) == 0
	})
	f.Comments = nil // comments of removed declarations would stray
	var b bytes.Buffer
	if err := format.Node(&b, fset, f); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestReadmeGoSnippetsCompile(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	snippets := readmeSnippets(string(readme))
	if len(snippets) < 4 {
		t.Fatalf("found %d Go blocks in README.md; it has at least 4 (is the fence still ```go?)", len(snippets))
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("compiling the README's snippets needs the go command: %v", err)
	}

	tmp := t.TempDir()
	overlay := map[string]string{}
	var pkgs []string
	for i, s := range snippets {
		src, declared, err := snippetFile(s)
		if err != nil {
			t.Fatal(err)
		}
		// A directory that does not exist: the overlay alone holds it.
		dir := filepath.Join(root, "cmd", "stepwise", fmt.Sprintf("readme_snippet_%02d", i+1))
		for name, content := range map[string][]byte{"snippet.go": []byte(src), "prelude.go": preludeWithout(t, declared)} {
			real := filepath.Join(tmp, fmt.Sprintf("%02d_%s", i+1, name))
			if err := os.WriteFile(real, content, 0o644); err != nil {
				t.Fatal(err)
			}
			overlay[filepath.Join(dir, name)] = real
		}
		pkgs = append(pkgs, "./"+filepath.ToSlash(must(filepath.Rel(root, dir))))
	}
	ov, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	ovPath := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ovPath, ov, 0o644); err != nil {
		t.Fatal(err)
	}
	// Build as this test binary was built (-race), so the dependencies
	// come from the build cache instead of being compiled again.
	args := []string{"build", "-overlay", ovPath}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if (s.Key == "-race" && s.Value == "true") || s.Key == "-tags" {
				args = append(args, s.Key+"="+s.Value)
			}
		}
	}
	c := exec.Command(gobin, append(args, pkgs...)...)
	c.Dir = root
	if out, err := c.CombinedOutput(); err != nil {
		var files strings.Builder
		for i := range snippets {
			b, _ := os.ReadFile(filepath.Join(tmp, fmt.Sprintf("%02d_snippet.go", i+1)))
			fmt.Fprintf(&files, "--- snippet %d, as compiled:\n%s\n", i+1, b)
		}
		t.Fatalf("README.md's Go snippets do not compile (%v):\n%s\n%s", err, out, files.String())
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
