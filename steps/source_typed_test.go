package steps_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSourceItemFunctionsAreTypedByTheItem holds PartitionBy and
// ItemInput to their item type at compile time: a program passing a
// function of another item type does not build, and the same program
// with the source's own item type does.
func TestSourceItemFunctionsAreTypedByTheItem(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is needed to build the programs: %v", err)
	}
	// Inside the module (a dot directory, which ./... ignores), so the
	// programs import this steps package.
	dir, err := os.MkdirTemp(".", ".typed-source-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	build := func(name, itemType string) (string, error) {
		src := `package main

import "github.com/stepwise-run/stepwise/steps"

type xfer struct{ ID, From string }

func main() {
	src := steps.Slice([]xfer{{ID: "T1", From: "a"}}, func(x xfer) string { return x.ID })
	src = src.PartitionBy(func(x ` + itemType + `) string { return "" })
	src = src.ItemInput(func(x ` + itemType + `) any { return x })
	_ = src
}
`
		file := filepath.Join(dir, name+".go")
		if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(goTool, "build", "-o", os.DevNull, file).CombinedOutput()
		return string(out), err
	}
	if out, err := build("right", "xfer"); err != nil {
		t.Fatalf("the source's own item type does not build: %v\n%s", err, out)
	}
	out, err := build("wrong", "string")
	if err == nil || !strings.Contains(out, "cannot use") {
		t.Fatalf("functions of another item type: build error %v, output %q; want a type error", err, out)
	}
}
