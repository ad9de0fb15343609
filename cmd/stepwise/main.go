// Command stepwise is the stock Stepwise binary, with the example jobs
// compiled in. Run `stepwise --help` for its commands.
package main

import (
	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/examples/report"
	"github.com/stepwise-run/stepwise/jobs"
)

func main() {
	var reg jobs.Registry
	reg.MustRegister(report.Job)
	cmd.Main(&reg)
}
