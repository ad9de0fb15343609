package cmd

import (
	"errors"
	"fmt"
	"maps"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
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

type backfillPlan struct {
	date, runID, existing, action string
	values                        map[string]string
	force                         bool
}

// Run implements the backfill command.
func (c *BackfillCmd) Run(env *Env) error {
	job, err := env.Registry.Lookup(c.Job)
	if err != nil {
		return err
	}
	dateParam := ""
	for _, p := range job.Params() {
		if p.Key && p.Format == "date" {
			if dateParam != "" {
				return usageError{fmt.Errorf("job %s has two date key parameters (%s, %s); backfill needs exactly one", c.Job, dateParam, p.Name)}
			}
			dateParam = p.Name
		}
	}
	if dateParam == "" {
		return usageError{fmt.Errorf("job %s has no identifying date parameter (a key param with format:\"date\"); backfill needs one", c.Job)}
	}
	from, err1 := time.Parse("2006-01-02", c.From)
	to, err2 := time.Parse("2006-01-02", c.To)
	if err1 != nil || err2 != nil || to.Before(from) {
		return usageError{fmt.Errorf("--from %q and --to %q must be YYYY-MM-DD dates with from <= to", c.From, c.To)}
	}
	if days := int(to.Sub(from).Hours()/24) + 1; days > 3660 {
		return usageError{fmt.Errorf("--from %s --to %s spans %d days; backfill at most ten years at a time", c.From, c.To, days)}
	}
	env.lease = c.Lease
	open := env.Store
	if c.DryRun { // lists only: never creates the database
		open = env.ExistingStore
	}
	st, err := open()
	if err != nil {
		return err
	}
	var plans []backfillPlan
	for d := from; !d.After(to); d = d.AddDate(0, 0, 1) {
		values := maps.Clone(c.Params)
		if values == nil {
			values = map[string]string{}
		}
		values[dateParam] = d.Format("2006-01-02")
		dec, err := job.Decode(values, nil)
		if err != nil {
			return err
		}
		p := backfillPlan{date: values[dateParam], runID: jobs.RunID(c.Job, dec.RunKey), values: values, existing: "-", action: "start"}
		info, err := st.Run(env.Ctx, p.runID)
		switch {
		case errors.Is(err, checkpoint.ErrNotFound):
		case err != nil:
			return err
		default:
			p.existing = info.Run.Status
			p.action, p.force = backfillAction(info.Run, c.Reprocess, env.now())
		}
		plans = append(plans, p)
	}
	if c.JSON && c.DryRun {
		return writeJSON(env.Stdout, viewBackfill(c, plans, nil))
	}
	if !c.JSON {
		tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DATE\tRUN\tNOW\tACTION")
		for _, p := range plans {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.date, p.runID, p.existing, p.action)
		}
		tw.Flush()
	}
	if c.DryRun {
		fmt.Fprintln(env.Stdout, "dry run: nothing started")
		return nil
	}
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
		mu    sync.Mutex
		errs  []error
		wg    sync.WaitGroup
		slots = make(chan struct{}, c.MaxParallel)
		// results[i] is plans[i]'s outcome, for --json.
		results = make([]*runResultView, len(plans))
	)
	for i, p := range plans {
		if p.action != "start" && p.action != "resume" && p.action != "rerun (forced)" {
			continue
		}
		if env.Ctx.Err() != nil {
			break
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			var audits []checkpoint.Audit // committed with the claim
			if p.force {
				audits = append(audits, c.audit(env, p.runID, "backfill --reprocess "+c.Reprocess, "backfill "+c.From+".."+c.To, ""))
			}
			res, err := r.Run(env.Ctx, runner.Request{Job: c.Job, Values: p.values, Force: p.force, Audits: audits})
			mu.Lock()
			defer mu.Unlock()
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
				fmt.Fprintf(env.Stderr, "%s: %s: %v\n", env.Name, p.date, err)
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
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

// backfillAction decides what backfill does with a date that has a run.
func backfillAction(run checkpoint.Run, reprocess string, now time.Time) (action string, force bool) {
	switch {
	case !run.PrunedAt.IsZero():
		return "skip (pruned)", false
	case run.Status == checkpoint.RunRunning && !stale(run, now):
		return "skip (running)", false
	case run.Status == checkpoint.RunQueued:
		return "skip (queued for a worker)", false
	case run.Status == checkpoint.RunSucceeded || run.Status == checkpoint.RunAbandoned:
		if reprocess == "all" {
			return "rerun (forced)", true
		}
		return "skip (" + run.Status + ")", false
	case reprocess == "none":
		return "skip (" + run.Status + "; --reprocess failed resumes it)", false
	}
	return "resume", false
}
