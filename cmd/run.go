package cmd

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// runFlags are the flags shared by run and resume.
type runFlags struct {
	targetFlags
	Wait         bool          `help:"If another runner holds the run, or another process holds the database's write lock (at the start or at any write mid-run), wait for it instead of exiting 4."`
	RetrySkipped bool          `name:"retry-skipped" help:"Process again the batch items an earlier attempt skipped under the step's skip policy."`
	Progress     string        `default:"auto" enum:"auto,bar,log,none" help:"Batch progress: a live bar on a terminal and a log line every few seconds otherwise (auto), or forced."`
	Lease        time.Duration `default:"30s" nonzero:"" help:"Lease length; the runner heartbeats every third of it. A crashed runner's run is taken over when it expires (at once if its process is surely gone: same machine boot and PID namespace, e.g. not another container). An outside call must finish within the lease less a fifth."`
	Force        bool          `help:"Run a succeeded or abandoned run again; completed steps are still skipped."`
	Deliver      string        `env:"STEPWISE_DELIVER" placeholder:"TARGET" help:"After the run, deliver queued notifications (at least once, with stable keys) to stdout, file:PATH or an http(s):// webhook URL."`
	// afterChunk is AfterEachChunk's fn (Env.RunJob only).
	afterChunk func(steps.Progress) `kong:"-"`
}

// configure sets what the store must be opened with, before anything
// opens it: the lease its session timeouts follow and, when targets are
// configured, that a target connects with its own credentials only, never
// PGPASSWORD or ~/.pgpass (as in serve and worker): a run naming a target
// may have been started by a request.
func (f runFlags) configure(env *Env) {
	env.lease = f.Lease
	if len(f.Target) > 0 || f.Targets != "" {
		env.ownTargetCredentials = true
	}
}

func (f runFlags) runner(env *Env) (*runner.Runner, *progress, error) {
	targets, err := f.targets()
	if err != nil {
		return nil, nil, usageError{err}
	}
	st, err := env.Store()
	if err != nil {
		return nil, nil, err
	}
	prog := newProgress(f.Progress, env.Stderr)
	log := env.Globals.loggerThrough(env.Stderr, prog)
	var deliver runner.Delivery
	if f.Deliver != "" {
		if deliver, err = runner.ParseDelivery(f.Deliver, env.Stdout); err != nil {
			return nil, nil, usageError{fmt.Errorf("--deliver: %w", err)}
		}
	}
	r, err := runner.New(runner.Config{
		Store: st, Jobs: env.Registry, Logger: log,
		Lease: f.Lease, Wait: f.Wait, OnProgress: chain(prog.hook(), f.afterChunk), ProgressLog: prog.logEvery(), Deliver: deliver,
		TracerProvider: env.tracing(true), Targets: targets,
	})
	return r, prog, err
}

// chain calls a, then b, each if set; nil when neither is.
func chain(a, b func(steps.Progress)) func(steps.Progress) {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return func(p steps.Progress) { a(p); b(p) }
}

// RunCmd starts or resumes a run of a job.
type RunCmd struct {
	runFlags
	Job        string            `arg:"" help:"Registered job name (see '${name} jobs')."`
	Params     map[string]string `short:"p" mapsep:"none" placeholder:"NAME=VALUE" help:"A job parameter; repeat for several. Identifying parameters name the run: the same values resume the same run."`
	ParamsFile string            `type:"existingfile" placeholder:"FILE" help:"JSON object of job parameters; -p values override it."`
	DryRun     bool              `name:"dry-run" help:"Execute the job without claiming the run or writing anything: print each step's planned effects (key: before -> after). The checkpoint database (--db) must exist: a dry run creates no file."`
	JSON       bool              `name:"json" help:"Print the outcome (with --dry-run: every step's full plan) as JSON on stdout."`
}

// Run implements the run command.
func (c *RunCmd) Run(env *Env) error {
	c.configure(env)
	file, err := readParamsFile(c.ParamsFile)
	if err != nil {
		return err
	}
	if c.DryRun { // reads only: never creates the database
		if _, err := env.ReadStore(); err != nil {
			return err
		}
	}
	r, prog, err := c.runner(env)
	if err != nil {
		return err
	}
	res, err := r.Run(env.Ctx, runner.Request{Job: c.Job, Values: c.Params, ParamsFile: file, Force: c.Force,
		DryRun: c.DryRun, RetrySkipped: c.RetrySkipped})
	prog.close()
	switch {
	case c.DryRun && c.JSON:
		return printDryRunJSON(env, res, err)
	case c.DryRun && res.RunID == "" && err != nil:
		return err // refused before it ran: nothing to show
	case c.DryRun:
		printDryRun(env, res)
		return itemChangedHint(env, err, res.RunID)
	case c.JSON:
		return printResultJSON(env, res, err)
	}
	return itemChangedHint(env, report(env, res, err), res.RunID)
}

// ResumeCmd resumes a run by ID.
type ResumeCmd struct {
	runFlags
	operatorFlags
	acceptFlags
	RunID  string `arg:"" name:"run-id" help:"Run ID as shown by '${name} runs', e.g. report/2026-11-28."`
	JSON   bool   `name:"json" help:"Print the outcome as JSON on stdout."`
	Reason string `help:"Why, for the audit log (recorded with the resume's claim, before any step runs). Required with --accept-changed."`
}

// Run implements the resume command.
func (c *ResumeCmd) Run(env *Env) error {
	c.configure(env)
	if _, err := env.ExistingStore(); err != nil { // the run is recorded there
		return err
	}
	rs, err := c.resumption(env, c.operatorFlags, c.RunID, "resume", "", c.Reason)
	if err != nil {
		return err
	}
	r, prog, err := c.runner(env)
	if err != nil {
		return err
	}
	// The resume's audit record (with --reason) commits with its claim.
	res, err := r.Resume(env.Ctx, c.RunID, runner.Request{Force: c.Force, RetrySkipped: c.RetrySkipped,
		AcceptChanged: rs.Accept, Audits: rs.Audits})
	prog.close()
	if c.JSON {
		return printResultJSON(env, res, err)
	}
	return itemChangedHint(env, report(env, res, err), c.RunID)
}

// dryRunListed bounds the writes and rejections printed per plan.
const dryRunListed = 10

// printDryRun prints what a dry run would have applied.
func printDryRun(env *Env, res runner.Result) {
	fmt.Fprintf(env.Stdout, "dry run of %s: nothing was applied or checkpointed\n", res.RunID)
	for _, p := range res.DryPlans {
		if p.Call != "" {
			fmt.Fprintf(env.Stdout, "%s  outside call with idempotency key %s: not called; the dry run stops here, "+
				"as the steps after it need its result\n", p.Step, p.Call)
			continue
		}
		head := p.Step
		if p.Items > 0 {
			head = fmt.Sprintf("%s (%s, %d rejected)", p.Step, plural(p.Items, "item"), len(p.Rejected))
		}
		fmt.Fprintf(env.Stdout, "%s  on %s\n", head, p.Target)
		for i, w := range p.Writes {
			if i == dryRunListed {
				fmt.Fprintf(env.Stdout, "    ... and %s\n", plural(len(p.Writes)-i, "more key"))
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
	verb := "are"
	if res.Stats.Skipped == 1 {
		verb = "is"
	}
	fmt.Fprintf(env.Stdout, "%s would run, %d %s already checkpointed\n", plural(res.Stats.Executed, "step"), res.Stats.Skipped, verb)
}

// report prints the one-line outcome of a run on stdout and returns the
// run's error, marked reported when that line says all of it (an
// interruption), so it is not printed again.
func report(env *Env, res runner.Result, err error) error {
	if res.Status == "" {
		return err
	}
	status := res.Status
	if res.Status == checkpoint.RunFailed && ExitCode(err) == ExitOperator {
		// Recorded failed (resumable), but nothing broke: the run stopped
		// at something only an operator can decide, which the error names.
		status = "stopped for an operator decision"
	}
	fmt.Fprintf(env.Stdout, "run %s %s (attempt %d): %s executed, %d skipped (checkpointed)\n",
		res.RunID, status, res.Attempt, plural(res.Stats.Executed, "step"), res.Stats.Skipped)
	if err != nil && res.Status == checkpoint.RunInterrupted {
		fmt.Fprintf(env.Stdout, "resume it with: %s resume %s\n", env.Name, res.RunID)
		return reported{err}
	}
	if errors.Is(err, checkpoint.ErrTransient) {
		// A database fault the retries did not outlast: once the server
		// answers, the run goes on from its checkpoints.
		fmt.Fprintf(env.Stdout, "resume it with: %s resume %s\n", env.Name, res.RunID)
	}
	return err
}

// reported wraps an error the command has already told the user about in
// its output: Execute exits with its code but does not print it again.
type reported struct{ error }

func (r reported) Unwrap() error { return r.error }

// DispatchCmd delivers queued notifications.
type DispatchCmd struct {
	To    string        `required:"" placeholder:"TARGET" help:"Where to deliver: stdout, file:PATH or an http(s):// webhook URL (POST, Idempotency-Key header)."`
	Every time.Duration `placeholder:"DURATION" nonzero:"" help:"Keep dispatching at this interval (a positive duration such as 30s) until interrupted, instead of one pass."`
	JSON  bool          `name:"json" help:"Print each pass's counts as a line of JSON on stdout instead of text on stderr."`
	// Many dispatchers may run at once against one database: each claims
	// messages for --visibility, hidden from the others meanwhile.
	MaxTries   int           `name:"max-tries" default:"10" nonzero:"" help:"Failed deliveries after which a message is dead: no longer retried, listed by 'outbox --status dead' (at least 1)."`
	Visibility time.Duration `default:"2m" nonzero:"" help:"How long a claimed message stays hidden from other dispatchers (a positive duration). Deliveries start only while a tenth of it is left; a dispatcher that dies mid-batch leaves its messages to another once it ends, delivered again with the same key."`
}

// Run implements the dispatch command.
func (c *DispatchCmd) Run(env *Env) error {
	to, err := runner.ParseDelivery(c.To, env.Stdout)
	if err != nil {
		return usageError{fmt.Errorf("--to: %w", err)}
	}
	if c.JSON && c.To == "stdout" {
		return usageError{errJSONOnStdout}
	}
	st, err := env.Store()
	if err != nil {
		return err
	}
	d := runner.Dispatcher{Store: st, To: to, Logger: env.Logger(), MaxTries: c.MaxTries, VisibleFor: c.Visibility}
	for {
		res, err := d.Pass(env.Ctx)
		if c.JSON {
			v := dispatchView{Sent: res.Sent, Failed: res.Failed, Dead: res.Dead, Left: res.Left}
			if err != nil {
				v.Error = err.Error()
			}
			if werr := writeJSONLine(env.Stdout, v); werr != nil {
				return werr
			}
		}
		if err != nil && env.Ctx.Err() == nil {
			return err
		}
		if !c.JSON {
			fmt.Fprintf(env.Stderr, "dispatched: %d sent, %d failed (retried later)", res.Sent, res.Failed)
			if res.Left > 0 {
				fmt.Fprintf(env.Stderr, ", %d left for the next claim (the --visibility window ran out)", res.Left)
			}
			if res.Dead > 0 {
				fmt.Fprintf(env.Stderr, ", %d dead after --max-tries %d (list them: %s outbox --status dead)", res.Dead, c.MaxTries, env.Name)
			}
			fmt.Fprintln(env.Stderr)
		}
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

// readParamsFile reads --params-file (none when path is empty), as run
// and enqueue take it.
func readParamsFile(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	file, err := os.ReadFile(path)
	if err != nil {
		return nil, usageError{fmt.Errorf("read --params-file: %w", err)}
	}
	return file, nil
}
