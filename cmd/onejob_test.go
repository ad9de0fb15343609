package cmd

import (
	"context"

	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// oneJob is a registry of one job, name, running fn: the scaffolding of
// the tests that need a job of their own shape (a target parameter, say).
func oneJob[P any](name string, fn func(ctx context.Context, run *steps.Run, p P) error) *jobs.Registry {
	var reg jobs.Registry
	reg.MustRegister(jobs.Define(name, fn))
	return &reg
}
