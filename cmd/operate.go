package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"

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

// audit builds the audit record of a manual operation.
func (f operatorFlags) audit(env *Env, runID, command, reason, details string) checkpoint.Audit {
	op := f.identity()
	if op == "" {
		op = "unknown"
	}
	return checkpoint.Audit{RunID: runID, At: env.now(), Operator: op, Command: command, Reason: reason, Details: details}
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
	a := c.audit(env, c.RunID, "recover", c.Reason, "")
	if err := st.Recover(env.Ctx, a, env.now(), c.Force, ownerGone); err != nil {
		// A live runner holds it: exit 4, like abandon and reset. A run
		// that is not running has nothing to recover: refused, exit 5.
		var held *checkpoint.LeaseHeldError
		if errors.Is(err, checkpoint.ErrNotStale) && !errors.As(err, &held) {
			return fmt.Errorf("%w: %w", ErrNeedsDecision, err)
		}
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
	a := c.audit(env, c.RunID, "abandon", c.Reason, "")
	if err := st.Abandon(env.Ctx, a, env.now(), ownerGone); err != nil {
		if errors.Is(err, checkpoint.ErrAlreadySucceeded) {
			// Refused like recover of a run that is not running: exit 5.
			return fmt.Errorf("%w: %w", ErrNeedsDecision, err)
		}
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
	Force  bool   `help:"Reset even though the step's effects applied; they are not undone, and will apply again when the step reruns."`
	JSON   bool   `name:"json" help:"Print the outcome as one JSON object (run_id, operation, step, result, operator, reason, at) instead of a line."`
}

// Run implements the reset command.
func (c *ResetCmd) Run(env *Env) error {
	st, err := env.ExistingStore()
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
	if applied.any() && !c.Force {
		return fmt.Errorf("%w: step %s of %s has applied effects (%s), and resetting it does not undo them: "+
			"the step would apply them again when it reruns:\n  %s\nuse reset --force if that is what you want",
			ErrNeedsDecision, c.Step, c.RunID, applied.count(), strings.Join(applied.lines, "\n  "))
	}
	details := ""
	if applied.any() {
		details = "effects kept: " + strings.Join(applied.lines, "; ")
	}
	a := c.audit(env, c.RunID, "reset --step "+c.Step, c.Reason, details)
	if err := st.ResetSteps(env.Ctx, a, env.now(), []string{c.Step}, ownerGone); err != nil {
		return err
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
	FromStep string `name:"from-step" placeholder:"STEP" help:"Clear this step's checkpoint and those of every step that started after it, then run. Applied effects are not undone: if any of the cleared steps applied effects, it is refused (exit 5, listing them and their amounts) unless --force, and they apply again."`
	Reason   string `help:"Why, for the audit log. Required with --from-step and --accept-changed."`
	JSON     bool   `name:"json" help:"Print the outcome as JSON on stdout (what --from-step cleared goes to the audit log, not stdout)."`
}

// Run implements the rerun command.
func (c *RerunCmd) Run(env *Env) error {
	if err := c.check("rerun", c.Reason, c.identity()); err != nil {
		return err
	}
	st, err := env.ExistingStore()
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
		if !c.AcceptChanged { // else recorded as rerun --accept-changed
			if err := st.RecordAudit(env.Ctx, c.audit(env, c.RunID, "rerun", c.Reason, "")); err != nil {
				return err
			}
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
	clears := fmt.Sprintf("rerun %s from step %s clears %d checkpoints: %s", c.RunID, c.FromStep, len(cleared),
		checkpoint.JoinIDs(checkpointIDs(cleared), 10))
	if applied.any() && !c.Force {
		// Like reset: clearing a step does not undo its effects, and
		// running it again applies them a second time.
		return fmt.Errorf("%w: %s\nalready applied and NOT undone by clearing: %s; rerunning the steps applies them again:\n  %s\n"+
			"use rerun --from-step %s --force --reason \"...\" if that is what you want",
			ErrNeedsDecision, clears, applied.count(), strings.Join(applied.lines, "\n  "), c.FromStep)
	}
	out := env.Stdout
	if c.JSON {
		out = io.Discard // stdout is the one JSON document
	}
	fmt.Fprintln(out, clears)
	if applied.any() {
		fmt.Fprintf(out, "effects already applied are NOT undone (--force): %s stay applied and apply again when their steps rerun:\n  %s\n",
			applied.count(), strings.Join(applied.lines, "\n  "))
	}
	if c.Reason == "" {
		return usageError{fmt.Errorf("rerun --from-step needs --reason \"...\" (recorded in the audit log)")}
	}
	details := fmt.Sprintf("cleared %s", checkpoint.JoinIDs(checkpointIDs(cleared), 50))
	if applied.any() {
		details += "; effects kept: " + strings.Join(applied.lines, "; ")
	}
	if err := st.ResetSteps(env.Ctx, c.audit(env, c.RunID, "rerun --from-step "+c.FromStep, c.Reason, details), env.now(), checkpointIDs(cleared), ownerGone); err != nil {
		return err
	}
	return c.resume(env, c.Force)
}

func (c *RerunCmd) resume(env *Env, force bool) error {
	accept, err := c.acceptance(env, c.operatorFlags, c.RunID, "rerun", c.Reason)
	if err != nil {
		return err
	}
	r, prog, err := c.runner(env)
	if err != nil {
		return err
	}
	res, err := r.Resume(env.Ctx, c.RunID, runner.Request{Force: force, RetrySkipped: c.RetrySkipped, AcceptChanged: accept})
	prog.close()
	if c.JSON {
		return printResultJSON(env, res, err)
	}
	return itemChangedHint(env, report(env, res, err), c.RunID)
}

// runSteps returns a run's step checkpoints in the order they started.
func runSteps(env *Env, st checkpoint.Backend, runID string) ([]checkpoint.Step, error) {
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

// keptEffects are the effects of some steps that applied (or may have):
// clearing the steps does not undo them, and rerunning the steps applies
// them again.
type keptEffects struct {
	lines      []string // one per write of a step, one per batch step
	writes     int      // writes of steps (key changes) that applied or may have
	items      int64    // items done of batch steps
	itemWrites int      // the writes of those items' recorded chunk plans
}

// count says how many effects apply again, e.g. "1 effect and the effects
// of 92 items (45 writes)".
func (k keptEffects) count() string {
	var parts []string
	if k.writes > 0 {
		parts = append(parts, plural(k.writes, "effect"))
	}
	if k.items > 0 {
		p := "the effects of " + plural(int(k.items), "item")
		if k.itemWrites > 0 {
			p += " (" + plural(k.itemWrites, "write") + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " and ")
}

// plural is "1 effect", "2 effects".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func (k keptEffects) any() bool { return len(k.lines) > 0 }

// appliedEffects describes the effects of the given steps that applied, or
// may have: a step's writes (key, before -> after, the amount); a
// separate-store plan recorded but not known to be applied; the completed
// items of a batch step with a target, finished or not, with the net amount
// per key of their chunk plans.
func appliedEffects(env *Env, st checkpoint.Backend, runID string, ss []checkpoint.Step) (keptEffects, error) {
	var out keptEffects
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
					out.writes++
					out.lines = append(out.lines, fmt.Sprintf("%s: %s %s %d -> %d (%+d)%s",
						s.ID, pr.Target, w.Key, w.OldValue, w.NewValue, w.NewValue-w.OldValue, state))
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
					return out, err
				}
			}
			done = 0
			for _, c := range counts {
				if c.Step == s.ID && (c.Status == checkpoint.StepCompleted || c.Status == checkpoint.StepPlanned) {
					done += c.Count
				}
			}
		}
		if done == 0 {
			continue
		}
		net, err := batchNetEffects(env, st, runID, s.ID)
		if err != nil {
			return out, err
		}
		line := fmt.Sprintf("%s: %d items applied their effects to %s", s.ID, done, sum.Target)
		out.items += done
		if net.plans > 0 {
			out.itemWrites += net.writes
			line += fmt.Sprintf(": %d writes in %d chunks, net %s", net.writes, net.plans, net)
		}
		out.lines = append(out.lines, line)
	}
	return out, nil
}

// PruneCmd deletes old runs' payloads, keeping tombstones.
type PruneCmd struct {
	operatorFlags
	OlderThan ageFlag `required:"" name:"older-than" placeholder:"DURATION" help:"Prune succeeded and abandoned runs that finished longer ago than this (e.g. 90d, 720h)."`
	DryRun    bool    `name:"dry-run" help:"Only say what would be pruned."`
	Reason    string  `default:"retention" help:"Why, for the audit log."`
	JSON      bool    `name:"json" help:"Print what was pruned (or would be) as JSON: run IDs, step payloads, item checkpoints, bytes."`
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
	a := c.audit(env, "", "prune --older-than "+string(c.OlderThan), c.Reason, "")
	cutoff := env.now().Add(-d)
	res, err := st.Prune(env.Ctx, a, cutoff, c.DryRun)
	if err != nil {
		return err
	}
	if c.JSON {
		v := pruneView{DryRun: c.DryRun, OlderThan: string(c.OlderThan), Cutoff: cutoff.Format(time.RFC3339),
			Runs: res.Runs, Steps: res.Steps, Items: res.Items, Bytes: res.Bytes}
		if v.Runs == nil {
			v.Runs = []string{}
		}
		return writeJSON(env.Stdout, v)
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
	RunID  string `arg:"" name:"run-id" help:"Run that stopped with exit 5 on an outside call of unknown outcome."`
	Step   string `required:"" help:"The outside call's step ID, as the error named it."`
	As     string `required:"" enum:"done,retry" help:"done: the call happened (checked in the outside system); retry: it did not, call again."`
	Output string `default:"null" help:"With --as done: the call's result as JSON, returned to later steps."`
	Reason string `required:"" help:"What you checked, for the audit log."`
	JSON   bool   `name:"json" help:"Print the outcome as one JSON object (run_id, operation, step, result, operator, reason, at) instead of a line."`
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
	a := c.audit(env, c.RunID, "resolve --step "+c.Step+" --as "+c.As, c.Reason, "output "+preview(c.Output, 200))
	if err := st.ResolveStep(env.Ctx, a, env.now(), c.Step, c.As == "done", []byte(c.Output), ownerGone); err != nil {
		if errors.Is(err, checkpoint.ErrNotUnknown) {
			// Refused like every operation that does not apply: exit 5.
			return fmt.Errorf("%w: %w", ErrNeedsDecision, err)
		}
		return err
	}
	if c.JSON {
		return writeOperation(env, a, "resolve", c.Step, "resolved as "+c.As)
	}
	fmt.Fprintf(env.Stdout, "step %s of %s resolved as %s; continue with `%s resume %s`\n", c.Step, c.RunID, c.As, env.Name, c.RunID)
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
