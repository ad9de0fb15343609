package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// Errors of the operations. Match them with errors.Is.
var (
	// ErrNeedsDecision is wrapped by the refusals of an operation that
	// needs an explicit decision because of what it would do (a *Refusal
	// names what overrides it), and of one that does not apply to the
	// run as it stands (recover of a run that is not running, abandon of
	// a succeeded run, resolve of a step awaiting no decision).
	ErrNeedsDecision = errors.New("needs an operator decision")
	// ErrNeedsReason is returned when an operation that must say why in
	// the audit trail was given no reason.
	ErrNeedsReason = errors.New("a reason is needed")
	// ErrBadOutput is returned when resolve is given an output that is
	// not JSON.
	ErrBadOutput = errors.New("the output is not JSON")
)

// OwnerGone is the dead-owner check the operations give the store: a run
// whose runner is surely gone (same kernel boot and PID namespace,
// process exited) is stale at once, as run and resume treat it, instead
// of being refused as held until its lease expires.
var OwnerGone = checkpoint.WithOwnerGone(runner.OwnerGone)

// Who is who performs an operation and why, for the audit trail.
type Who struct {
	// Operator names who performs it; recorded as "unknown" when empty.
	Operator string
	// Reason says why.
	Reason string
	// Via, if set, says through what it came (e.g. "HTTP API, request
	// 01J…"); it is added to the audit record's details.
	Via string
}

// Audit is the audit record of an operation on runID at now.
func (w Who) Audit(runID, command, details string, now time.Time) checkpoint.Audit {
	op := strings.TrimSpace(w.Operator)
	if op == "" {
		op = "unknown"
	}
	if w.Via != "" {
		if details != "" {
			details += "; "
		}
		details += "via " + w.Via
	}
	return checkpoint.Audit{RunID: runID, At: now, Operator: op, Command: command, Reason: w.Reason, Details: details}
}

// RefusalKind says which decision a *Refusal waits for.
type RefusalKind string

// The refusals an operator overrides with a forced operation.
const (
	// RerunAbandoned: a rerun of an abandoned run.
	RerunAbandoned RefusalKind = "rerun-abandoned"
	// RerunSucceeded: a rerun from the top of a succeeded run.
	RerunSucceeded RefusalKind = "rerun-succeeded"
	// RerunApplied: a rerun from a step that clears steps whose effects
	// applied (they are not undone, and apply again).
	RerunApplied RefusalKind = "rerun-applied"
	// ResetApplied: a reset of a step whose effects applied.
	ResetApplied RefusalKind = "reset-applied"
	// RerunCalled: a rerun from a step that clears outside calls that
	// happened (they are made again).
	RerunCalled RefusalKind = "rerun-called"
	// ResetCalled: a reset of an outside call that happened.
	ResetCalled RefusalKind = "reset-called"
)

// Refusal is an operation refused because of what it would do, until an
// operator forces it. Its message says why in words; each caller adds how
// to force it in its own terms (a flag, a request field).
type Refusal struct {
	Kind  RefusalKind
	RunID string
	Step  string // the step reset, or rerun from; "" for a rerun from the top
	Err   error
}

func (r *Refusal) Error() string { return r.Err.Error() }

// Unwrap returns the error the refusal stands for (ErrNeedsDecision, or
// checkpoint.ErrAbandoned).
func (r *Refusal) Unwrap() error { return r.Err }

// Recover marks a stale run failed (resumable). A run that is not running
// is refused with ErrNeedsDecision (wrapping checkpoint.ErrNotStale); a run
// a live runner holds, with a *checkpoint.LeaseHeldError, unless force.
func Recover(ctx context.Context, st checkpoint.Backend, who Who, runID string, force bool, now time.Time) (checkpoint.Audit, error) {
	a := who.Audit(runID, "recover", "", now)
	if err := who.Check(); err != nil {
		return a, err
	}
	if err := st.Recover(ctx, a, now, force, OwnerGone); err != nil {
		var held *checkpoint.LeaseHeldError
		if errors.Is(err, checkpoint.ErrNotStale) && !errors.As(err, &held) {
			return a, fmt.Errorf("%w: %w", ErrNeedsDecision, err)
		}
		return a, err
	}
	return a, nil
}

// Abandon gives up on a run: run and resume refuse it unless forced. A
// succeeded run is refused with ErrNeedsDecision.
func Abandon(ctx context.Context, st checkpoint.Backend, who Who, runID string, now time.Time) (checkpoint.Audit, error) {
	a := who.Audit(runID, "abandon", "", now)
	if err := who.Check(); err != nil {
		return a, err
	}
	if err := st.Abandon(ctx, a, now, OwnerGone); err != nil {
		if errors.Is(err, checkpoint.ErrAlreadySucceeded) {
			return a, fmt.Errorf("%w: %w", ErrNeedsDecision, err)
		}
		return a, err
	}
	return a, nil
}

// Reset clears one step's checkpoint so it runs again on the next resume.
// Unless force, it is refused (a *Refusal) for a step whose effects
// applied (ResetApplied: they are not undone, and apply again) and for an
// outside call that happened or may have (ResetCalled: it is made again).
// The audit record names what was kept and cleared.
func Reset(ctx context.Context, st checkpoint.Backend, who Who, runID, step string, force bool, now time.Time) (checkpoint.Audit, error) {
	if err := who.Check(); err != nil {
		return checkpoint.Audit{}, err
	}
	fence, all, err := runStepsAt(ctx, st, runID)
	if err != nil {
		return checkpoint.Audit{}, err
	}
	i, err := findStep(runID, step, all)
	if err != nil {
		return checkpoint.Audit{}, err
	}
	applied, err := AppliedEffects(ctx, st, runID, all[i:i+1])
	if err != nil {
		return checkpoint.Audit{}, err
	}
	calls, err := OutsideCalls(all[i : i+1])
	if err != nil {
		return checkpoint.Audit{}, err
	}
	if (applied.Any() || calls.Any()) && !force {
		kind := ResetApplied
		if !applied.Any() {
			kind = ResetCalled
		}
		return checkpoint.Audit{}, &Refusal{Kind: kind, RunID: runID, Step: step, Err: resetRefusal(runID, step, applied, calls)}
	}
	a := who.Audit(runID, "reset --step "+step, clearedDetails("", applied, calls), now)
	return a, changed(st.ResetSteps(ctx, a, now, []string{step}, OwnerGone, checkpoint.WithFence(fence)))
}

// Resolve settles an outside call whose outcome is unknown: done records
// it completed with output (JSON), otherwise the next resume calls again.
// An output that does not fit the type the step decodes it into (the
// shape its call recorded) is refused with an *OutputShapeError. A step
// awaiting no such decision is refused with ErrNeedsDecision; with
// replace, the step's earlier resolution is replaced instead, refused
// with ErrNeedsDecision once a later attempt recorded a step or item
// (checkpoint.WithReplace).
func Resolve(ctx context.Context, st checkpoint.Backend, who Who, runID, step string, done, replace bool, output []byte, now time.Time) (checkpoint.Audit, error) {
	if err := who.Check(); err != nil {
		return checkpoint.Audit{}, err
	}
	if !json.Valid(output) {
		return checkpoint.Audit{}, fmt.Errorf("%w: %q", ErrBadOutput, output)
	}
	details := "output " + preview(string(output), 200)
	if done || replace {
		all, err := RunSteps(ctx, st, runID)
		if err != nil {
			return checkpoint.Audit{}, err
		}
		i, err := findStep(runID, step, all)
		if err != nil {
			return checkpoint.Audit{}, err
		}
		if done {
			if err := checkResolveOutput(all[i], output); err != nil {
				return checkpoint.Audit{}, err
			}
		}
		if replace {
			// What it replaces, for the audit trail (the store refuses
			// it if that is not a resolution).
			details += fmt.Sprintf("; replaces %s, output %s", all[i].Status, preview(string(all[i].Output), 200))
		}
	}
	as, command := "retry", "resolve --step "+step
	if done {
		as = "done"
	}
	command += " --as " + as
	opts := []checkpoint.OperateOption{OwnerGone}
	if replace {
		command += " --replace"
		opts = append(opts, checkpoint.WithReplace())
	}
	a := who.Audit(runID, command, details, now)
	if err := st.ResolveStep(ctx, a, now, step, done, output, opts...); err != nil {
		if errors.Is(err, checkpoint.ErrNotUnknown) || errors.Is(err, checkpoint.ErrNotResolved) || errors.Is(err, checkpoint.ErrResolutionUsed) {
			return a, fmt.Errorf("%w: %w", ErrNeedsDecision, err)
		}
		return a, err
	}
	return a, nil
}

// RerunPlan is what a rerun will do, judged by PlanRerun and carried out
// by Record: nothing to clear (from the top), or the checkpoints from
// FromStep on.
type RerunPlan struct {
	RunID    string
	FromStep string
	// Cleared are the steps a rerun from FromStep clears, in the order
	// they started.
	Cleared []string
	// Applied are the cleared steps' effects that applied: not undone,
	// they apply again.
	Applied KeptEffects
	// Calls are the cleared outside calls that happened: not undone,
	// they are made again.
	Calls MadeCalls
	// fence is the run's fence the plan was judged at: Record clears
	// nothing if the run changed since.
	fence int64
}

// Clears says what a rerun from a step clears ("" from the top).
func (p RerunPlan) Clears() string {
	if p.FromStep == "" {
		return ""
	}
	return fmt.Sprintf("rerun %s from step %s clears %s: %s", p.RunID, p.FromStep, Plural(len(p.Cleared), "checkpoint"),
		checkpoint.JoinIDs(p.Cleared, 10))
}

// PlanRerun judges a rerun of runID, from the top (fromStep "") or from a
// step. Refused: a pruned run (checkpoint.ErrPruned); unless force, an
// abandoned run (RerunAbandoned), a succeeded run from the top
// (RerunSucceeded), steps to clear whose effects applied (RerunApplied)
// or outside calls to clear that happened (RerunCalled).
func PlanRerun(ctx context.Context, st checkpoint.Backend, runID, fromStep string, force bool) (RerunPlan, error) {
	p := RerunPlan{RunID: runID, FromStep: fromStep}
	info, err := st.Run(ctx, runID)
	if err != nil {
		return p, err
	}
	r := info.Run
	if !r.PrunedAt.IsZero() {
		return p, fmt.Errorf("%w: %s was pruned at %s; its checkpoints are gone, so it cannot run again",
			checkpoint.ErrPruned, r.ID, r.PrunedAt.Format(time.RFC3339))
	}
	if r.Status == checkpoint.RunAbandoned && !force {
		return p, &Refusal{Kind: RerunAbandoned, RunID: runID, Err: fmt.Errorf("%w: %s (%s)", checkpoint.ErrAbandoned, r.ID, r.Error)}
	}
	if fromStep == "" {
		if r.Status == checkpoint.RunSucceeded && !force {
			return p, &Refusal{Kind: RerunSucceeded, RunID: runID, Err: fmt.Errorf("%w: run %s succeeded at %s",
				ErrNeedsDecision, runID, r.FinishedAt.Format(time.RFC3339))}
		}
		return p, nil
	}
	fence, all, err := runStepsAt(ctx, st, runID)
	if err != nil {
		return p, err
	}
	p.fence = fence
	i, err := findStep(runID, fromStep, all)
	if err != nil {
		return p, err
	}
	cleared := all[i:]
	p.Cleared = stepIDs(cleared)
	if p.Applied, err = AppliedEffects(ctx, st, runID, cleared); err != nil {
		return p, err
	}
	if p.Calls, err = OutsideCalls(cleared); err != nil {
		return p, err
	}
	if (p.Applied.Any() || p.Calls.Any()) && !force {
		// Like reset: clearing a step does not undo its effects or its
		// calls, and running it again makes them a second time.
		kind := RerunApplied
		if !p.Applied.Any() {
			kind = RerunCalled
		}
		return p, &Refusal{Kind: kind, RunID: runID, Step: fromStep, Err: clearRefusal(p.Clears(), p.Applied, p.Calls)}
	}
	return p, nil
}

// Record carries out the plan before the rerun's attempt: from a step it
// clears the steps, audited in the same transaction, which needs a reason
// (ErrNeedsReason). From the top it records nothing: the rerun's record
// commits with its claim (see Resumption).
func (p RerunPlan) Record(ctx context.Context, st checkpoint.Backend, who Who, now time.Time) error {
	if err := who.Check(); err != nil {
		return err
	}
	if p.FromStep == "" {
		return nil
	}
	if strings.TrimSpace(who.Reason) == "" {
		return fmt.Errorf("%w: a rerun from step %s clears checkpoints; say why, for the audit trail", ErrNeedsReason, p.FromStep)
	}
	details := clearedDetails(fmt.Sprintf("cleared %s", checkpoint.JoinIDs(p.Cleared, 50)), p.Applied, p.Calls)
	return changed(st.ResetSteps(ctx, who.Audit(p.RunID, "rerun --from-step "+p.FromStep, details, now), now, p.Cleared,
		OwnerGone, checkpoint.WithFence(p.fence)))
}

// Resumption is what an operator's resume or rerun claims the run with
// (runner.Request's Audits and AcceptChanged): the records that commit
// in the claim's transaction, before any step runs, and the acceptance of
// changed items, if any.
type Resumption struct {
	Audits []checkpoint.Audit
	Accept *steps.Acceptance
}

// Resume is the Resumption of an operator's resume or rerun (command) of
// runID. Accepting changed items needs a reason and an operator
// (ErrNeedsReason) and is recorded as "COMMAND --accept-changed"; else a
// rerun from the top is recorded as "rerun", a resume with a reason as
// "resume", and a rerun from a step (fromStep) by nothing more: Record
// wrote its record with the steps it cleared. who's text is checked
// (CheckText).
func Resume(who Who, runID, command, fromStep string, accepting bool, now time.Time) (Resumption, error) {
	if err := who.Check(); err != nil {
		return Resumption{}, err
	}
	switch {
	case accepting:
		if strings.TrimSpace(who.Reason) == "" || strings.TrimSpace(who.Operator) == "" {
			return Resumption{}, fmt.Errorf("%w: accepting changed items needs a reason and who accepts them, for the audit trail", ErrNeedsReason)
		}
		a := who.Audit(runID, command+" --accept-changed", "", now)
		return Resumption{Audits: []checkpoint.Audit{a}, Accept: &steps.Acceptance{Operator: a.Operator, Reason: who.Reason}}, nil
	case command == "rerun" && fromStep == "":
		return Resumption{Audits: []checkpoint.Audit{who.Audit(runID, "rerun", "", now)}}, nil
	case command == "resume" && strings.TrimSpace(who.Reason) != "":
		return Resumption{Audits: []checkpoint.Audit{who.Audit(runID, "resume", "", now)}}, nil
	}
	return Resumption{}, nil
}

// RunSteps returns a run's step checkpoints in the order they started;
// checkpoint.ErrNotFound if there is no such run.
func RunSteps(ctx context.Context, st checkpoint.Backend, runID string) ([]checkpoint.Step, error) {
	_, all, err := runStepsAt(ctx, st, runID)
	return all, err
}

// runStepsAt is RunSteps and the run's fence, read before the steps: an
// operation that judged the steps gives it to the store (WithFence), so
// a run changed since is refused rather than judged stale.
func runStepsAt(ctx context.Context, st checkpoint.Backend, runID string) (int64, []checkpoint.Step, error) {
	info, err := st.Run(ctx, runID)
	if err != nil {
		return 0, nil, err
	}
	var all []checkpoint.Step
	err = st.Steps(ctx, runID, func(s checkpoint.Step) error {
		all = append(all, s)
		return nil
	})
	slices.SortStableFunc(all, func(a, b checkpoint.Step) int { return a.StartedAt.Compare(b.StartedAt) })
	return info.Run.Fence, all, err
}

// changed is a store's ErrRunChanged as a refusal that needs the operator
// to judge again.
func changed(err error) error {
	if errors.Is(err, checkpoint.ErrRunChanged) {
		return fmt.Errorf("%w: %w", ErrNeedsDecision, err)
	}
	return err
}

// NoStepError is returned when an operation names a step the run has not
// recorded; Steps are those it has, in the order they started.
type NoStepError struct {
	RunID, Step string
	Steps       []string
}

func (e *NoStepError) Error() string {
	return fmt.Sprintf("run %s has no step %q (steps: %s)", e.RunID, e.Step, checkpoint.JoinIDs(e.Steps, 10))
}

// findStep is the index of step in all, or a *NoStepError.
func findStep(runID, step string, all []checkpoint.Step) (int, error) {
	i := slices.IndexFunc(all, func(s checkpoint.Step) bool { return s.ID == step })
	if i < 0 {
		return -1, &NoStepError{RunID: runID, Step: step, Steps: stepIDs(all)}
	}
	return i, nil
}

func stepIDs(ss []checkpoint.Step) []string {
	ids := make([]string, len(ss))
	for i, s := range ss {
		ids[i] = s.ID
	}
	return ids
}

// preview is s on one line, cut to n bytes.
func preview(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
