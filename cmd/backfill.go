package cmd

import (
	"cmp"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// BackfillCmd starts one run per business date.
type BackfillCmd struct {
	operatorFlags
	targetFlags
	Job         string            `arg:"" help:"Job whose identifying parameter is a date (format:\"date\")."`
	From        string            `required:"" help:"First business date, YYYY-MM-DD."`
	To          string            `required:"" help:"Last business date, YYYY-MM-DD (inclusive)."`
	Params      map[string]string `short:"p" mapsep:"none" placeholder:"NAME=VALUE" help:"Other job parameters, the same for every date."`
	Reprocess   string            `default:"none" enum:"none,failed,all" help:"Dates that already have a run: none (skip them: only dates without a run start), failed (also resume failed, interrupted and stale runs), all (also rerun succeeded and abandoned runs, forced; checkpointed steps are still skipped)."`
	DryRun      bool              `name:"dry-run" help:"List what would be started, start nothing (and create no file: --db must exist)."`
	MaxParallel int               `name:"max-parallel" default:"1" nonzero:"" help:"Runs going at once (at least 1); a job's concurrency limit still holds (settle: one run per ledger), runs over it wait for room."`
	Lease       time.Duration     `default:"30s" nonzero:"" help:"Lease length of each run."`
	JSON        bool              `name:"json" help:"Print the plan per date and each run's outcome as one JSON document on stdout, instead of a table and a line per run."`
}

// Run implements the backfill command.
func (c *BackfillCmd) Run(env *Env) error {
	req, err := c.request(env)
	if err != nil {
		return err
	}
	env.lease = c.Lease
	if len(c.Target) > 0 || c.Targets != "" {
		env.ownTargetCredentials = true // as run does: only the targets carry credentials
	}
	open := env.Store
	if c.DryRun { // lists only: never creates the database
		open = env.ExistingStore
	}
	st, err := open()
	if err != nil {
		return err
	}
	plans, err := ops.PlanBackfill(env.Ctx, st, req, env.now())
	if err != nil {
		return c.usage(err)
	}
	if c.JSON && c.DryRun {
		return writeJSON(env.Stdout, viewBackfill(c, plans, nil))
	}
	if !c.JSON {
		tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DATE\tRUN\tNOW\tACTION")
		for _, p := range plans {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Date, p.RunID, cmp.Or(p.Existing, "-"), backfillActionText(p))
		}
		tw.Flush()
	}
	if c.DryRun {
		fmt.Fprintln(env.Stdout, "dry run: nothing started")
		return nil
	}
	return c.start(env, st, plans)
}

// request checks the command's job and dates and returns its backfill.
func (c *BackfillCmd) request(env *Env) (ops.BackfillRequest, error) {
	job, err := env.Registry.Lookup(c.Job)
	if err != nil {
		return ops.BackfillRequest{}, err
	}
	if _, err := ops.BackfillDateParam(job); err != nil {
		return ops.BackfillRequest{}, c.usage(err)
	}
	from, err1 := time.Parse(time.DateOnly, c.From)
	to, err2 := time.Parse(time.DateOnly, c.To)
	if err1 != nil || err2 != nil || to.Before(from) {
		return ops.BackfillRequest{}, usageError{fmt.Errorf("--from %q and --to %q must be YYYY-MM-DD dates with from <= to", c.From, c.To)}
	}
	if days := int(to.Sub(from).Hours()/24) + 1; days > ops.MaxBackfillDays {
		return ops.BackfillRequest{}, usageError{fmt.Errorf("--from %s --to %s spans %d days; backfill at most ten years at a time", c.From, c.To, days)}
	}
	return ops.BackfillRequest{Job: job, From: from, To: to, Params: c.Params, Reprocess: ops.Reprocess(c.Reprocess)}, nil
}

// usage makes a refused backfill request a usage error (exit 2).
func (c *BackfillCmd) usage(err error) error {
	if errors.Is(err, ops.ErrBadBackfill) {
		return usageError{err}
	}
	return err
}

// start runs the plans that start a run, --max-parallel at once, and
// reports each outcome.
func (c *BackfillCmd) start(env *Env, st checkpoint.Backend, plans []ops.BackfillPlan) error {
	// Runs over their job's concurrency limit (one settlement per ledger)
	// wait for room: --max-parallel never runs more at once than it allows.
	targets, err := c.targets()
	if err != nil {
		return usageError{err}
	}
	r, err := runner.New(runner.Config{Store: st, Jobs: env.Registry, Logger: env.Logger(), Lease: c.Lease,
		WaitForLimit: true, TracerProvider: env.tracing(true), Targets: targets})
	if err != nil {
		return err
	}
	var (
		errs []error
		// results[i] is plans[i]'s outcome, for --json.
		results = make([]*runResultView, len(plans))
	)
	request := func(p ops.BackfillPlan) runner.Request {
		var audits []checkpoint.Audit // committed with the claim
		if p.Force() {
			audits = append(audits, c.audit(env, p.RunID, "backfill --reprocess "+c.Reprocess, "backfill "+c.From+".."+c.To, ""))
		}
		return runner.Request{Audits: audits}
	}
	ops.RunBackfill(env.Ctx, r, plans, c.MaxParallel, request, func(i int, res runner.Result, err error) {
		var told reported
		if c.JSON {
			v := viewResult(env, res, err)
			results[i] = &v
		} else {
			err = report(env, res, err)
		}
		if errors.As(err, &told) {
			errs = append(errs, told.error) // interrupted: the report said so
		} else if err != nil && !errors.Is(err, checkpoint.ErrAlreadySucceeded) {
			fmt.Fprintf(env.Stderr, "%s: %s: %v\n", env.Name, plans[i].Date, err)
			errs = append(errs, err)
		}
	})
	if c.JSON {
		if err := writeJSON(env.Stdout, viewBackfill(c, plans, results)); err != nil {
			return err
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("backfill: %d of %d runs did not succeed: %w", len(errs), len(plans), errs[0])
	}
	return nil
}

// backfillActionText is a plan's action as the table and --json say it.
func backfillActionText(p ops.BackfillPlan) string {
	switch {
	case p.Action == ops.BackfillRerun:
		return "rerun (forced)"
	case p.ReprocessResumes:
		return "skip (" + p.Why + "; --reprocess failed resumes it)"
	case p.Action == ops.BackfillSkip:
		return "skip (" + p.Why + ")"
	}
	return string(p.Action)
}
