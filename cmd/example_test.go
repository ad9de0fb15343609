package cmd_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/examples/report"
	"github.com/stepwise-run/stepwise/jobs"
)

// A program that defines its own jobs gets the whole CLI; Execute is the
// testable form of cmd.Main. Running the same run twice skips every step
// the second time.
func ExampleExecute() {
	dir, _ := os.MkdirTemp("", "stepwise-example")
	defer os.RemoveAll(dir)
	var reg jobs.Registry
	reg.MustRegister(report.Job)

	args := []string{"--db", filepath.Join(dir, "stepwise.db"), "--log-level", "error",
		"run", "report", "-p", "date=2026-11-28", "-p", "orders=3"}
	var out strings.Builder
	code := cmd.Execute(context.Background(), &reg, args, &out, os.Stderr)
	fmt.Print(out.String())
	fmt.Println("exit", code)

	out.Reset()
	code = cmd.Execute(context.Background(), &reg, append(args, "--force"), &out, os.Stderr)
	fmt.Print(out.String())
	fmt.Println("exit", code)
	// Output:
	// run report/2026-11-28 succeeded (attempt 1): 5 steps executed, 0 skipped (checkpointed)
	// exit 0
	// run report/2026-11-28 succeeded (attempt 2): 0 steps executed, 5 skipped (checkpointed)
	// exit 0
}
