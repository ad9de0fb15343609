// Package jobs defines jobs in Go: a name, a typed parameter struct, the
// function that does the work, and a registry the runner and the CLI look
// jobs up in.
//
// Import rule: jobs imports steps and checkpoint only; runner and cmd import
// it, and examples define their jobs with it.
//
// The common case:
//
//	type Params struct {
//		Date string `param:"date,key" format:"date" help:"business date, YYYY-MM-DD"`
//		Note string `param:"note" help:"free text for the report"`
//	}
//
//	var Report = jobs.Define("report", func(ctx context.Context, run *steps.Run, p Params) error {
//		_, err := steps.Do(ctx, run, steps.ID("load"), func(ctx context.Context) (int, error) { return 42, nil })
//		return err
//	}, jobs.Help("builds the daily report"))
//
//	func init() { registry.MustRegister(Report) }
//
// Parameters marked "key" identify a run: `run report -p date=2026-11-28`
// always means run report/2026-11-28, and starting that key again with other
// parameters is refused. A file parameter tagged format:"path" (or
// format:"existingfile", which must exist) is made absolute when decoded,
// so the run stores where the file is, not where it was typed from.
//
// A request from outside the operator's shell (the HTTP API) names files
// and databases only by the targets the operator configured (Targets,
// RequestValues): the run stores "target:NAME" and the process executing
// it resolves the name from its own Targets (WithTargets, which the
// runner applies from runner.Config.Targets).
package jobs
