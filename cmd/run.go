package cmd

import (
	"fmt"
	"os"
	"time"

	"github.com/stepwise-run/stepwise/runner"
)

// runFlags are the flags shared by run and resume.
type runFlags struct {
	Wait         bool          `help:"If another runner holds the run, wait for it instead of exiting 4."`
	RetrySkipped bool          `name:"retry-skipped" help:"Process again the batch items an earlier attempt skipped under the step's skip policy."`
	Progress     string        `default:"auto" enum:"auto,bar,log,none" help:"Batch progress: a live bar on a terminal and a log line every few seconds otherwise (auto), or forced."`
	Lease        time.Duration `default:"30s" help:"Lease length; the runner heartbeats every third of it. A crashed runner's run is taken over when it expires (at once if its process is surely gone: same machine boot and PID namespace, e.g. not another container). An outside call must finish within the lease less a fifth."`
	Force        bool          `help:"Run a succeeded or abandoned run again; completed steps are still skipped."`
	Deliver      string        `env:"STEPWISE_DELIVER" placeholder:"TARGET" help:"After the run, deliver queued notifications (at least once, with stable keys) to stdout, file:PATH or an http(s):// webhook URL."`
}

func (f runFlags) runner(env *Env) (*runner.Runner, *progress, error) {
	st, err := env.Store()
	if err != nil {
		return nil, nil, err
	}
	log := env.Globals.logger(env.Stderr)
	prog := newProgress(f.Progress, env.Stderr, log)
	var deliver runner.Delivery
	if f.Deliver != "" {
		if deliver, err = runner.ParseDelivery(f.Deliver, env.Stdout); err != nil {
			return nil, nil, usageError{fmt.Errorf("--deliver: %w", err)}
		}
	}
	r, err := runner.New(runner.Config{
		Store: st, Jobs: env.Registry, Logger: log,
		Lease: f.Lease, Wait: f.Wait, OnProgress: prog.report, Deliver: deliver,
	})
	return r, prog, err
}

// RunCmd starts or resumes a run of a job.
type RunCmd struct {
	runFlags
	Job        string            `arg:"" help:"Registered job name (see 'stepwise jobs')."`
	Params     map[string]string `short:"p" mapsep:"none" placeholder:"NAME=VALUE" help:"A job parameter; repeat for several. Identifying parameters name the run: the same values resume the same run."`
	ParamsFile string            `type:"existingfile" placeholder:"FILE" help:"JSON object of job parameters; -p values override it."`
	DryRun     bool              `name:"dry-run" help:"Execute the job without claiming the run or writing anything: print each step's planned effects (key: before -> after)."`
}

// Run implements the run command.
func (c *RunCmd) Run(env *Env) error {
	var file []byte
	if c.ParamsFile != "" {
		var err error
		if file, err = os.ReadFile(c.ParamsFile); err != nil {
			return usageError{fmt.Errorf("read --params-file: %w", err)}
		}
	}
	r, prog, err := c.runner(env)
	if err != nil {
		return err
	}
	res, err := r.Run(env.Ctx, runner.Request{Job: c.Job, Values: c.Params, ParamsFile: file, Force: c.Force,
		DryRun: c.DryRun, RetrySkipped: c.RetrySkipped})
	prog.close()
	if c.DryRun {
		printDryRun(env, res)
		return err
	}
	report(env, res, err)
	return err
}

// ResumeCmd resumes a run by ID.
type ResumeCmd struct {
	runFlags
	RunID string `arg:"" name:"run-id" help:"Run ID as shown by 'stepwise runs', e.g. report/2026-11-28."`
}

// Run implements the resume command.
func (c *ResumeCmd) Run(env *Env) error {
	r, prog, err := c.runner(env)
	if err != nil {
		return err
	}
	res, err := r.Resume(env.Ctx, c.RunID, runner.Request{Force: c.Force, RetrySkipped: c.RetrySkipped})
	prog.close()
	report(env, res, err)
	return err
}

// dryRunListed bounds the writes and rejections printed per plan.
const dryRunListed = 10

// printDryRun prints what a dry run would have applied.
func printDryRun(env *Env, res runner.Result) {
	fmt.Fprintf(env.Stdout, "dry run of %s: nothing was applied or checkpointed\n", res.RunID)
	for _, p := range res.DryPlans {
		head := p.Step
		if p.Items > 0 {
			head = fmt.Sprintf("%s (%d items, %d rejected)", p.Step, p.Items, len(p.Rejected))
		}
		fmt.Fprintf(env.Stdout, "%s  on %s\n", head, p.Target)
		for i, w := range p.Writes {
			if i == dryRunListed {
				fmt.Fprintf(env.Stdout, "    ... and %d more keys\n", len(p.Writes)-i)
				break
			}
			fmt.Fprintf(env.Stdout, "    %s: %d -> %d  (version %d -> %d)\n", w.Key, w.OldValue, w.NewValue, w.OldVersion, w.OldVersion+1)
		}
		for i, r := range p.Rejected {
			if i == dryRunListed {
				fmt.Fprintf(env.Stdout, "    ... and %d more rejected\n", len(p.Rejected)-i)
				break
			}
			fmt.Fprintf(env.Stdout, "    rejected %s\n", r)
		}
	}
	fmt.Fprintf(env.Stdout, "%d steps would run, %d are already checkpointed\n", res.Stats.Executed, res.Stats.Skipped)
}

// report prints the one-line outcome of a run on stdout.
func report(env *Env, res runner.Result, err error) {
	if res.Status == "" {
		return
	}
	fmt.Fprintf(env.Stdout, "run %s %s (attempt %d): %d steps executed, %d skipped (checkpointed)\n",
		res.RunID, res.Status, res.Attempt, res.Stats.Executed, res.Stats.Skipped)
	if err != nil && res.Status == "interrupted" {
		fmt.Fprintf(env.Stdout, "resume it with: stepwise resume %s\n", res.RunID)
	}
}

// DispatchCmd delivers queued notifications.
type DispatchCmd struct {
	To    string        `required:"" placeholder:"TARGET" help:"Where to deliver: stdout, file:PATH or an http(s):// webhook URL (POST, Idempotency-Key header)."`
	Every time.Duration `placeholder:"DURATION" help:"Keep dispatching at this interval until interrupted, instead of one pass."`
}

// Run implements the dispatch command.
func (c *DispatchCmd) Run(env *Env) error {
	to, err := runner.ParseDelivery(c.To, env.Stdout)
	if err != nil {
		return usageError{fmt.Errorf("--to: %w", err)}
	}
	if c.Every < 0 {
		return usageError{fmt.Errorf("--every is %s; it cannot be negative", c.Every)}
	}
	st, err := env.Store()
	if err != nil {
		return err
	}
	d := runner.Dispatcher{Store: st, To: to, Logger: env.Logger()}
	for {
		res, err := d.Pass(env.Ctx)
		if err != nil && env.Ctx.Err() == nil {
			return err
		}
		fmt.Fprintf(env.Stderr, "dispatched: %d sent, %d failed (retried later)\n", res.Sent, res.Failed)
		if c.Every == 0 || env.Ctx.Err() != nil {
			return nil
		}
		t := time.NewTimer(c.Every)
		select {
		case <-env.Ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}
