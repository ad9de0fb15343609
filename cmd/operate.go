package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// ErrNeedsDecision is returned when an operation needs an explicit flag
// (--force, --reason) because of what it would do; exit 5.
var ErrNeedsDecision = errors.New("needs an operator decision")

// ownerGone lets the manual operations treat a run whose runner is surely
// gone (same kernel boot and PID namespace, process exited) as stale at
// once, as run and resume do, instead of refusing it as held until its
// lease expires.
var ownerGone = checkpoint.WithOwnerGone(runner.OwnerGone)

// operatorFlags are the flags of every manual operation.
type operatorFlags struct {
	Operator string `env:"STEPWISE_OPERATOR" help:"Who performs the operation, for the audit log. Defaults to $USER."`
}

// audit builds the audit record of a manual operation.
func (f operatorFlags) audit(env *Env, runID, command, reason, details string) checkpoint.Audit {
	op := f.Operator
	if op == "" {
		op = os.Getenv("USER")
	}
	if op == "" {
		op = "unknown"
	}
	return checkpoint.Audit{RunID: runID, At: env.now(), Operator: op, Command: command, Reason: reason, Details: details}
}

// RecoverCmd marks a stale run failed, resumable.
type RecoverCmd struct {
	operatorFlags
	RunID  string `arg:"" name:"run-id" help:"The stale run (its runner died; 'stepwise runs' marks it stale)."`
	Reason string `default:"runner gone" help:"Why, for the audit log."`
	Force  bool   `help:"Recover even though the lease has not expired (only if you know its runner is gone)."`
}

// Run implements the recover command.
func (c *RecoverCmd) Run(env *Env) error {
	st, err := env.Store()
	if err != nil {
		return err
	}
	if err := st.Recover(env.Ctx, c.audit(env, c.RunID, "recover", c.Reason, ""), env.now(), c.Force, ownerGone); err != nil {
		if errors.Is(err, checkpoint.ErrNotStale) {
			return fmt.Errorf("%w: %w (recover --force forces it)", ErrNeedsDecision, err)
		}
		return err
	}
	fmt.Fprintf(env.Stdout, "run %s marked failed (resumable): resume it with `stepwise resume %s`\n", c.RunID, c.RunID)
	return nil
}

// AbandonCmd gives up on a run.
type AbandonCmd struct {
	operatorFlags
	RunID  string `arg:"" name:"run-id" help:"Run to abandon."`
	Reason string `required:"" help:"Why the run is given up, for the audit log."`
}

// Run implements the abandon command.
func (c *AbandonCmd) Run(env *Env) error {
	st, err := env.Store()
	if err != nil {
		return err
	}
	if err := st.Abandon(env.Ctx, c.audit(env, c.RunID, "abandon", c.Reason, ""), env.now(), ownerGone); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "run %s abandoned: run and resume refuse it unless --force\n", c.RunID)
	return nil
}

// ResetCmd clears one step's checkpoint so it runs again.
type ResetCmd struct {
	operatorFlags
	RunID  string `arg:"" name:"run-id" help:"Run whose step to reset."`
	Step   string `required:"" help:"Step ID to clear (see 'stepwise show RUN_ID')."`
	Reason string `required:"" help:"Why, for the audit log."`
	Force  bool   `help:"Reset even though the step's effects applied; they are not undone, and will apply again when the step reruns."`
}

// Run implements the reset command.
func (c *ResetCmd) Run(env *Env) error {
	st, err := env.Store()
	if err != nil {
		return err
	}
	all, err := runSteps(env, st, c.RunID)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(all, func(s checkpoint.Step) bool { return s.ID == c.Step })
	if i < 0 {
		return usageError{fmt.Errorf("run %s has no step %q (steps: %s)", c.RunID, c.Step, checkpoint.JoinIDs(checkpointIDs(all), 10))}
	}
	applied, err := appliedEffects(env, st, c.RunID, all[i:i+1])
	if err != nil {
		return err
	}
	if len(applied) > 0 && !c.Force {
		return fmt.Errorf("%w: step %s of %s has applied effects, and resetting it does not undo them: "+
			"the step would apply them again when it reruns:\n  %s\nuse reset --force if that is what you want",
			ErrNeedsDecision, c.Step, c.RunID, strings.Join(applied, "\n  "))
	}
	details := ""
	if len(applied) > 0 {
		details = "effects kept: " + strings.Join(applied, "; ")
	}
	if err := st.ResetSteps(env.Ctx, c.audit(env, c.RunID, "reset --step "+c.Step, c.Reason, details), env.now(), []string{c.Step}, ownerGone); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "step %s of %s cleared; it runs again on `stepwise resume %s`\n", c.Step, c.RunID, c.RunID)
	return nil
}

// RerunCmd runs a run again, from the top or from a step.
type RerunCmd struct {
	operatorFlags
	runFlags
	RunID    string `arg:"" name:"run-id" help:"Run to run again."`
	FromStep string `name:"from-step" placeholder:"STEP" help:"Clear this step's checkpoint and those of every step that started after it, then run. Applied effects are not undone."`
	Reason   string `help:"Why, for the audit log. Required with --from-step."`
}

// Run implements the rerun command.
func (c *RerunCmd) Run(env *Env) error {
	st, err := env.Store()
	if err != nil {
		return err
	}
	info, err := st.Run(env.Ctx, c.RunID)
	if err != nil {
		return err
	}
	if r := info.Run; !r.PrunedAt.IsZero() {
		return fmt.Errorf("%w: %s was pruned at %s; its checkpoints are gone, so it cannot run again",
			checkpoint.ErrPruned, r.ID, r.PrunedAt.Format(time.RFC3339))
	}
	if r := info.Run; r.Status == checkpoint.RunAbandoned && !c.Force {
		return fmt.Errorf("%w: %s (%s); rerun --force runs it again", checkpoint.ErrAbandoned, r.ID, r.Error)
	}
	if c.FromStep == "" {
		if info.Run.Status == checkpoint.RunSucceeded && !c.Force {
			return fmt.Errorf("%w: run %s succeeded at %s; `rerun --force` runs its job again, skipping every "+
				"checkpointed step (nothing applies twice); to redo steps use --from-step STEP --reason \"...\"",
				ErrNeedsDecision, c.RunID, info.Run.FinishedAt.Format(time.RFC3339))
		}
		if err := st.RecordAudit(env.Ctx, c.audit(env, c.RunID, "rerun", c.Reason, "")); err != nil {
			return err
		}
		return c.resume(env, c.Force)
	}
	all, err := runSteps(env, st, c.RunID)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(all, func(s checkpoint.Step) bool { return s.ID == c.FromStep })
	if i < 0 {
		return usageError{fmt.Errorf("run %s has no step %q (steps: %s)", c.RunID, c.FromStep, checkpoint.JoinIDs(checkpointIDs(all), 10))}
	}
	cleared := all[i:]
	applied, err := appliedEffects(env, st, c.RunID, cleared)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "rerun %s from step %s clears %d checkpoints: %s\n", c.RunID, c.FromStep, len(cleared),
		checkpoint.JoinIDs(checkpointIDs(cleared), 10))
	if len(applied) > 0 {
		fmt.Fprintf(env.Stdout, "effects already applied are NOT undone; these stay and apply again when their steps rerun:\n  %s\n",
			strings.Join(applied, "\n  "))
	}
	if c.Reason == "" {
		return usageError{fmt.Errorf("rerun --from-step needs --reason \"...\" (recorded in the audit log)")}
	}
	details := fmt.Sprintf("cleared %s", checkpoint.JoinIDs(checkpointIDs(cleared), 50))
	if len(applied) > 0 {
		details += "; effects kept: " + strings.Join(applied, "; ")
	}
	if err := st.ResetSteps(env.Ctx, c.audit(env, c.RunID, "rerun --from-step "+c.FromStep, c.Reason, details), env.now(), checkpointIDs(cleared)); err != nil {
		return err
	}
	return c.resume(env, c.Force)
}

func (c *RerunCmd) resume(env *Env, force bool) error {
	r, prog, err := c.runner(env)
	if err != nil {
		return err
	}
	res, err := r.Resume(env.Ctx, c.RunID, runner.Request{Force: force, RetrySkipped: c.RetrySkipped})
	prog.close()
	report(env, res, err)
	return err
}

// runSteps returns a run's step checkpoints in the order they started.
func runSteps(env *Env, st *checkpoint.SQLite, runID string) ([]checkpoint.Step, error) {
	if _, err := st.Run(env.Ctx, runID); err != nil {
		return nil, err
	}
	var all []checkpoint.Step
	err := st.Steps(env.Ctx, runID, func(s checkpoint.Step) error {
		all = append(all, s)
		return nil
	})
	slices.SortStableFunc(all, func(a, b checkpoint.Step) int { return a.StartedAt.Compare(b.StartedAt) })
	return all, err
}

func checkpointIDs(ss []checkpoint.Step) []string {
	ids := make([]string, len(ss))
	for i, s := range ss {
		ids[i] = s.ID
	}
	return ids
}

// appliedEffects describes the effects of the given steps that applied, or
// may have: a separate-store plan recorded but not known to be applied, and
// the completed items of a batch step with a target, finished or not.
func appliedEffects(env *Env, st *checkpoint.SQLite, runID string, ss []checkpoint.Step) ([]string, error) {
	var out []string
	var counts []checkpoint.ItemCount
	for _, s := range ss {
		if len(s.Plan) > 0 && (s.Status == checkpoint.StepCompleted || s.Status == checkpoint.StepPlanned) {
			var pr steps.PlanRecord
			if json.Unmarshal(s.Plan, &pr) == nil {
				state := ""
				if s.Status == checkpoint.StepPlanned {
					state = " (planned as " + pr.EffectID + "; may have applied: resume finishes it once)"
				}
				for _, w := range pr.Writes {
					out = append(out, fmt.Sprintf("%s: %s %s %d -> %d%s", s.ID, pr.Target, w.Key, w.OldValue, w.NewValue, state))
				}
			}
			continue
		}
		var sum steps.BatchSummary
		if json.Unmarshal(s.Output, &sum) != nil || sum.Target == "" {
			continue
		}
		done := sum.Completed
		if s.Status != checkpoint.StepCompleted {
			if counts == nil {
				var err error
				if counts, err = st.ItemCounts(env.Ctx, runID); err != nil {
					return nil, err
				}
			}
			done = 0
			for _, c := range counts {
				if c.Step == s.ID && (c.Status == checkpoint.StepCompleted || c.Status == checkpoint.StepPlanned) {
					done += c.Count
				}
			}
		}
		if done > 0 {
			out = append(out, fmt.Sprintf("%s: %d items applied their effects to %s", s.ID, done, sum.Target))
		}
	}
	return out, nil
}

// PruneCmd deletes old runs' payloads, keeping tombstones.
type PruneCmd struct {
	operatorFlags
	OlderThan string `required:"" name:"older-than" placeholder:"DURATION" help:"Prune succeeded and abandoned runs that finished longer ago than this (e.g. 90d, 720h)."`
	DryRun    bool   `name:"dry-run" help:"Only say what would be pruned."`
	Reason    string `default:"retention" help:"Why, for the audit log."`
}

// Run implements the prune command.
func (c *PruneCmd) Run(env *Env) error {
	d, err := parseDays(c.OlderThan)
	if err != nil {
		return usageError{fmt.Errorf("--older-than %q: %w", c.OlderThan, err)}
	}
	st, err := env.Store()
	if err != nil {
		return err
	}
	a := c.audit(env, "", "prune --older-than "+c.OlderThan, c.Reason, "")
	res, err := st.Prune(env.Ctx, a, env.now().Add(-d), c.DryRun)
	if err != nil {
		return err
	}
	verb := "pruned"
	if c.DryRun {
		verb = "would prune"
	}
	fmt.Fprintf(env.Stdout, "%s %d runs: %d step payloads, %d item checkpoints, %s freed\n", verb, len(res.Runs), res.Steps, res.Items, bytesText(res.Bytes))
	if len(res.Runs) > 0 {
		fmt.Fprintf(env.Stdout, "runs: %s\n", checkpoint.JoinIDs(res.Runs, 20))
		fmt.Fprintln(env.Stdout, "their run keys stay as tombstones: starting one again is refused")
	}
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
	RunID  string `arg:"" name:"run-id" help:"Run that stopped with exit 5 on an outside call of unknown outcome."`
	Step   string `required:"" help:"The outside call's step ID, as the error named it."`
	As     string `required:"" enum:"done,retry" help:"done: the call happened (checked in the outside system); retry: it did not, call again."`
	Output string `default:"null" help:"With --as done: the call's result as JSON, returned to later steps."`
	Reason string `required:"" help:"What you checked, for the audit log."`
}

// Run implements the resolve command.
func (c *ResolveCmd) Run(env *Env) error {
	if !json.Valid([]byte(c.Output)) {
		return usageError{fmt.Errorf("--output %q is not JSON", c.Output)}
	}
	st, err := env.Store()
	if err != nil {
		return err
	}
	a := c.audit(env, c.RunID, "resolve --step "+c.Step+" --as "+c.As, c.Reason, "output "+preview(c.Output, 200))
	if err := st.ResolveStep(env.Ctx, a, env.now(), c.Step, c.As == "done", []byte(c.Output), ownerGone); err != nil {
		if errors.Is(err, checkpoint.ErrNotUnknown) {
			return usageError{err}
		}
		return err
	}
	fmt.Fprintf(env.Stdout, "step %s of %s resolved as %s; continue with `stepwise resume %s`\n", c.Step, c.RunID, c.As, c.RunID)
	return nil
}
