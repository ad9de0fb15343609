package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// ErrNeedsDecision is returned when an operation needs an explicit flag
// (--force, --reason) because of what it would do; exit 5. It is
// ops.ErrNeedsDecision, which the shared operations wrap.
var ErrNeedsDecision = ops.ErrNeedsDecision

// operatorFlags are the flags of every manual operation.
type operatorFlags struct {
	Operator string `env:"STEPWISE_OPERATOR" help:"Who performs the operation, for the audit log. Defaults to $USER; --accept-changed is refused when neither is set."`
}

// identity is who performs the operation: --operator, $STEPWISE_OPERATOR
// or $USER; "" when none is set.
func (f operatorFlags) identity() string {
	if op := strings.TrimSpace(f.Operator); op != "" {
		return op
	}
	return strings.TrimSpace(os.Getenv("USER"))
}

// who is the operator and reason of a manual operation, for the audit log.
func (f operatorFlags) who(reason string) ops.Who {
	return ops.Who{Operator: f.identity(), Reason: reason}
}

// audit builds the audit record of a manual operation.
func (f operatorFlags) audit(env *Env, runID, command, reason, details string) checkpoint.Audit {
	return f.who(reason).Audit(runID, command, details, env.now())
}

// cliError gives an error of the shared operations its command-line form:
// a step the run does not have is a usage error (exit 2), and a refusal
// gets the flags that override it (hint).
func cliError(err error, hint func(*ops.Refusal) string) error {
	var (
		nostep  *ops.NoStepError
		refusal *ops.Refusal
	)
	switch {
	case errors.As(err, &nostep):
		return usageError{err}
	case errors.As(err, &refusal) && hint != nil:
		return fmt.Errorf("%w%s", err, hint(refusal))
	}
	return err
}

// RecoverCmd marks a stale run failed, resumable.
type RecoverCmd struct {
	operatorFlags
	RunID  string `arg:"" name:"run-id" help:"The stale run (its runner died; '${name} runs' marks it stale)."`
	Reason string `default:"runner gone" help:"Why, for the audit log."`
	Force  bool   `help:"Recover even though the lease has not expired (only if you know its runner is gone)."`
	JSON   bool   `name:"json" help:"Print the outcome as one JSON object (run_id, operation, step, result, operator, reason, at) instead of a line."`
}

// Run implements the recover command.
func (c *RecoverCmd) Run(env *Env) error {
	st, err := env.ExistingStore()
	if err != nil {
		return err
	}
	// A live runner holds it: exit 4, like abandon and reset. A run that
	// is not running has nothing to recover: refused, exit 5.
	a, err := ops.Recover(env.Ctx, st, c.who(c.Reason), c.RunID, c.Force, env.now())
	if err != nil {
		return err
	}
	if c.JSON {
		return writeOperation(env, a, "recover", "", "failed (resumable)")
	}
	fmt.Fprintf(env.Stdout, "run %s marked failed (resumable): resume it with `%s resume %s`\n", c.RunID, env.Name, c.RunID)
	return nil
}

// AbandonCmd gives up on a run.
type AbandonCmd struct {
	operatorFlags
	RunID  string `arg:"" name:"run-id" help:"Run to abandon."`
	Reason string `required:"" help:"Why the run is given up, for the audit log."`
	JSON   bool   `name:"json" help:"Print the outcome as one JSON object (run_id, operation, step, result, operator, reason, at) instead of a line."`
}

// Run implements the abandon command.
func (c *AbandonCmd) Run(env *Env) error {
	st, err := env.ExistingStore()
	if err != nil {
		return err
	}
	a, err := ops.Abandon(env.Ctx, st, c.who(c.Reason), c.RunID, env.now())
	if err != nil {
		return err
	}
	if c.JSON {
		return writeOperation(env, a, "abandon", "", "abandoned")
	}
	fmt.Fprintf(env.Stdout, "run %s abandoned: run and resume refuse it unless --force\n", c.RunID)
	return nil
}

// ResetCmd clears one step's checkpoint so it runs again.
type ResetCmd struct {
	operatorFlags
	RunID  string `arg:"" name:"run-id" help:"Run whose step to reset."`
	Step   string `required:"" help:"Step ID to clear (see '${name} show RUN_ID')."`
	Reason string `required:"" help:"Why, for the audit log."`
	Force  bool   `help:"Reset even though the step's effects applied, or it is an outside call (steps.Call) that was made or may have been; neither is undone: the effects apply again and the call is made again when the step reruns. Without it the reset is refused (exit 5) naming the effects with their amounts and the calls with their idempotency keys and recorded results."`
	JSON   bool   `name:"json" help:"Print the outcome as one JSON object (run_id, operation, step, result, operator, reason, at) instead of a line."`
}

// Run implements the reset command.
func (c *ResetCmd) Run(env *Env) error {
	st, err := env.ExistingStore()
	if err != nil {
		return err
	}
	a, err := ops.Reset(env.Ctx, st, c.who(c.Reason), c.RunID, c.Step, c.Force, env.now())
	if err != nil {
		return cliError(err, func(*ops.Refusal) string { return "\nuse reset --force if that is what you want" })
	}
	if c.JSON {
		return writeOperation(env, a, "reset", c.Step, "cleared")
	}
	fmt.Fprintf(env.Stdout, "step %s of %s cleared; it runs again on `%s resume %s`\n", c.Step, c.RunID, env.Name, c.RunID)
	return nil
}

// RerunCmd runs a run again, from the top or from a step.
type RerunCmd struct {
	operatorFlags
	runFlags
	acceptFlags
	RunID    string `arg:"" name:"run-id" help:"Run to run again."`
	FromStep string `name:"from-step" placeholder:"STEP" help:"Clear this step's checkpoint and those of every step that started after it, then run. Applied effects and outside calls are not undone: if any of the cleared steps applied effects or made an outside call (steps.Call: completed, resolved as done, rejected or of unknown outcome), it is refused (exit 5, listing the effects with their amounts and the calls with their idempotency keys and recorded results) unless --force, and they apply, or are made, again."`
	Reason   string `help:"Why, for the audit log. Required with --from-step and --accept-changed."`
	JSON     bool   `name:"json" help:"Print the outcome as JSON on stdout (what --from-step cleared goes to the audit log, not stdout)."`
}

// rerunHint is how a refused rerun is forced on the command line.
func rerunHint(r *ops.Refusal) string {
	switch r.Kind {
	case ops.RerunAbandoned:
		return "; rerun --force runs it again"
	case ops.RerunSucceeded:
		return "; `rerun --force` runs its job again, skipping every checkpointed step (nothing applies twice); " +
			"to redo steps use --from-step STEP --reason \"...\""
	case ops.RerunApplied, ops.RerunCalled:
		return fmt.Sprintf("\nuse rerun --from-step %s --force --reason \"...\" if that is what you want", r.Step)
	}
	return ""
}

// Run implements the rerun command.
func (c *RerunCmd) Run(env *Env) error {
	if err := c.check("rerun", c.Reason, c.identity()); err != nil {
		return err
	}
	c.configure(env)
	st, err := env.ExistingStore()
	if err != nil {
		return err
	}
	plan, err := ops.PlanRerun(env.Ctx, st, c.RunID, c.FromStep, c.Force)
	if err != nil {
		return cliError(err, rerunHint)
	}
	if c.FromStep != "" {
		out := env.Stdout
		if c.JSON {
			out = io.Discard // stdout is the one JSON document
		}
		fmt.Fprintln(out, plan.Clears())
		if plan.Applied.Any() {
			fmt.Fprintf(out, "effects already applied are NOT undone (--force): %s stay applied and apply again when their steps rerun:\n  %s\n",
				plan.Applied.Count(), strings.Join(plan.Applied.Lines, "\n  "))
		}
		if plan.Calls.Any() {
			fmt.Fprintf(out, "outside calls already made are NOT undone (--force): %s are made again when their steps rerun:\n  %s\n",
				plan.Calls.Count(), strings.Join(plan.Calls.Lines, "\n  "))
		}
		if c.Reason == "" {
			return usageError{fmt.Errorf("rerun --from-step needs --reason \"...\" (recorded in the audit log)")}
		}
	}
	// Checked before anything is cleared: the claim's record must be
	// writable too.
	rs, err := c.resumption(env, c.operatorFlags, c.RunID, "rerun", c.FromStep, c.Reason)
	if err != nil {
		return err
	}
	if err := plan.Record(env.Ctx, st, c.who(c.Reason), env.now()); err != nil {
		return err
	}
	return c.resume(env, c.Force, rs)
}

// resume claims and runs the run, with the rerun's audit records in the
// claim's transaction.
func (c *RerunCmd) resume(env *Env, force bool, rs ops.Resumption) error {
	r, prog, err := c.runner(env)
	if err != nil {
		return err
	}
	res, err := r.Resume(env.Ctx, c.RunID, runner.Request{Force: force, RetrySkipped: c.RetrySkipped,
		AcceptChanged: rs.Accept, Audits: rs.Audits})
	prog.close()
	if c.JSON {
		return printResultJSON(env, res, err)
	}
	return itemChangedHint(env, report(env, res, err), c.RunID)
}

// PruneCmd deletes old runs' payloads, keeping tombstones.
type PruneCmd struct {
	operatorFlags
	OlderThan ageFlag `required:"" name:"older-than" placeholder:"DURATION" help:"Prune succeeded and abandoned runs that finished longer ago than this (e.g. 90d, 720h)."`
	DryRun    bool    `name:"dry-run" help:"Only say what would be pruned."`
	Reason    string  `default:"retention" help:"Why, for the audit log."`
	JSON      bool    `name:"json" help:"Print what was pruned (or would be) as JSON: run IDs, step payloads, item checkpoints, bytes, idempotency keys."`
}

// Run implements the prune command.
func (c *PruneCmd) Run(env *Env) error {
	d, err := parseDays(string(c.OlderThan))
	if err != nil {
		return usageError{fmt.Errorf("--older-than %q: %w", c.OlderThan, err)}
	}
	st, err := env.ExistingStore()
	if err != nil {
		return err
	}
	now := env.now()
	cutoff := now.Add(-d)
	res, _, err := ops.Prune(env.Ctx, st, c.who(c.Reason), "prune --older-than "+string(c.OlderThan), cutoff, c.DryRun, now)
	if err != nil {
		return err
	}
	if c.JSON {
		v := pruneView{DryRun: c.DryRun, OlderThan: string(c.OlderThan), Cutoff: cutoff.Format(time.RFC3339),
			Runs: res.Runs, Steps: res.Steps, Items: res.Items, Bytes: res.Bytes, IdempotencyKeys: res.IdempotencyKeys}
		if v.Runs == nil {
			v.Runs = []string{}
		}
		return writeJSON(env.Stdout, v)
	}
	verb := "pruned"
	if c.DryRun {
		verb = "would prune"
	}
	fmt.Fprintf(env.Stdout, "%s %s: %s, %s, %s freed, %s\n", verb, plural(len(res.Runs), "run"), plural(int(res.Steps), "step payload"),
		plural(int(res.Items), "item checkpoint"), bytesText(res.Bytes), plural(int(res.IdempotencyKeys), "idempotency key"))
	if len(res.Runs) > 0 {
		fmt.Fprintf(env.Stdout, "runs: %s\n", checkpoint.JoinIDs(res.Runs, 20))
		fmt.Fprintln(env.Stdout, "their run keys stay as tombstones: starting one again is refused")
	}
	return nil
}

// ageFlag is a flag holding a duration parseDays reads ("90d", "720h"),
// checked while parsing. A value such as "-1h" is taken as its value and
// refused in our words, not by kong as a short flag.
type ageFlag string

// Decode implements kong.MapperValue.
func (a *ageFlag) Decode(ctx *kong.DecodeContext) error {
	s, err := numberToken(ctx, "duration")
	if err != nil {
		return err
	}
	if _, err := parseDays(s); err != nil {
		return fmt.Errorf("%q: %w", s, err)
	}
	*a = ageFlag(s)
	return nil
}

// parseDays parses a Go duration, also accepting whole days ("90d").
func parseDays(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.Atoi(n)
		if err != nil || days < 0 {
			return 0, errors.New("want a duration such as 90d or 720h")
		}
		return time.Duration(days) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, errors.New("want a duration such as 90d or 720h")
	}
	return d, nil
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

// ResolveCmd settles an outside call whose outcome is unknown.
type ResolveCmd struct {
	operatorFlags
	RunID   string `arg:"" name:"run-id" help:"Run that stopped with exit 5 on an outside call of unknown outcome."`
	Step    string `required:"" help:"The outside call's step ID, as the error named it."`
	As      string `required:"" enum:"done,retry" help:"done: the call happened (checked in the outside system); retry: it did not, call again."`
	Output  string `default:"null" help:"With --as done: the call's result as JSON, returned to later steps. It must fit the step's Go output type (the shape 'show --json' gives as call.output_shape): a field the type does not have, a required field left out, a value of another JSON type or an integer out of range is refused (exit 2) naming the shape."`
	Replace bool   `help:"Replace this step's earlier resolution (a wrong output, or done that should have been retry), while no later attempt has recorded a step or batch item since it: after that a later step may have used it, and it is refused (exit 5)."`
	Reason  string `required:"" help:"What you checked, for the audit log."`
	JSON    bool   `name:"json" help:"Print the outcome as one JSON object (run_id, operation, step, result, operator, reason, at) instead of a line."`
}

// Run implements the resolve command.
func (c *ResolveCmd) Run(env *Env) error {
	if !json.Valid([]byte(c.Output)) {
		return usageError{fmt.Errorf("--output %q is not JSON", c.Output)}
	}
	st, err := env.ExistingStore()
	if err != nil {
		return err
	}
	a, err := ops.Resolve(env.Ctx, st, c.who(c.Reason), c.RunID, c.Step, c.As == "done", c.Replace, []byte(c.Output), env.now())
	var shape *ops.OutputShapeError
	if errors.As(err, &shape) {
		return usageError{err}
	}
	if err != nil {
		return cliError(err, nil)
	}
	result := "resolved as " + c.As
	if c.Replace {
		result = "resolution replaced: resolved as " + c.As
	}
	if c.JSON {
		return writeOperation(env, a, "resolve", c.Step, result)
	}
	fmt.Fprintf(env.Stdout, "step %s of %s %s; continue with `%s resume %s`\n", c.Step, c.RunID, result, env.Name, c.RunID)
	return nil
}

// operationView is a manual operation's outcome in --json.
type operationView struct {
	RunID     string    `json:"run_id"`
	Operation string    `json:"operation"`
	Step      string    `json:"step,omitempty"`
	Result    string    `json:"result"`
	Operator  string    `json:"operator"`
	Reason    string    `json:"reason"`
	At        time.Time `json:"at"`
}

// writeOperation prints a manual operation's outcome as JSON, from the
// audit row it recorded.
func writeOperation(env *Env, a checkpoint.Audit, op, step, result string) error {
	return writeJSON(env.Stdout, operationView{RunID: a.RunID, Operation: op, Step: step, Result: result,
		Operator: a.Operator, Reason: a.Reason, At: a.At})
}

// plural is "1 effect", "2 effects".
func plural(n int, noun string) string { return ops.Plural(n, noun) }
