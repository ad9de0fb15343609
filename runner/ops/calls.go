package ops

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/steps"
)

// MadeCalls are the outside calls (steps.Call) among steps an operation
// would clear that happened, or may have: completed (by the call, or
// resolved as done by an operator), rejected by the outside system, or of
// unknown outcome. Clearing one does not undo it: the step makes the call
// again when it reruns. A call that failed, or was resolved as not done,
// did not happen and is not listed.
type MadeCalls struct {
	// Lines say per call its step, idempotency key and recorded result.
	Lines []string
	// Keys are the calls' idempotency keys.
	Keys []string
}

// Any reports whether any call that happened would be cleared.
func (m MadeCalls) Any() bool { return len(m.Lines) > 0 }

// Count is "1 outside call", "2 outside calls".
func (m MadeCalls) Count() string { return Plural(len(m.Lines), "outside call") }

// OutsideCalls lists the outside calls among ss that happened or may
// have. A step recorded before calls kept a record (checkpoint.Step.Call)
// is not known to be one, unless its outcome is unknown.
func OutsideCalls(ss []checkpoint.Step) (MadeCalls, error) {
	var out MadeCalls
	for _, s := range ss {
		rec, err := checkpoint.DecodeCallRecord(s.Call)
		if err != nil {
			return out, fmt.Errorf("step %s: %w", s.ID, err)
		}
		if rec == nil && s.Status != checkpoint.StepCalling {
			continue
		}
		key := s.RunID + "/" + s.ID
		if rec != nil && rec.Key != "" {
			key = rec.Key
		}
		var result string
		switch s.Status {
		case checkpoint.StepCompleted:
			result = "completed, result " + preview(string(s.Output), 200)
			if rec.Resolved != nil {
				result = fmt.Sprintf("resolved as done by %s at %s, result %s", rec.Resolved.Operator,
					rec.Resolved.At.UTC().Format(time.RFC3339), preview(string(s.Output), 200))
			}
		case checkpoint.StepRejected:
			result = "rejected by the outside system: " + preview(s.Error, 200)
		case checkpoint.StepCalling:
			result = "outcome unknown (its intent is recorded, its result is not): it may have happened"
		default:
			continue
		}
		out.Keys = append(out.Keys, key)
		out.Lines = append(out.Lines, fmt.Sprintf("%s: idempotency key %s, %s", s.ID, key, result))
	}
	return out, nil
}

// clearRefusal is the refusal's text for clearing steps that applied
// effects or made outside calls (what is the operation's own sentence).
func clearRefusal(what string, applied KeptEffects, calls MadeCalls) error {
	var parts []string
	if applied.Any() {
		parts = append(parts, fmt.Sprintf("already applied and NOT undone by clearing: %s; rerunning the steps applies them again:\n  %s",
			applied.Count(), strings.Join(applied.Lines, "\n  ")))
	}
	if calls.Any() {
		parts = append(parts, fmt.Sprintf("already made and NOT undone by clearing: %s; rerunning the steps makes them again "+
			"(an outside system that does not deduplicate by idempotency key acts twice):\n  %s",
			calls.Count(), strings.Join(calls.Lines, "\n  ")))
	}
	return fmt.Errorf("%w: %s\n%s", ErrNeedsDecision, what, strings.Join(parts, "\n"))
}

// resetRefusal is the refusal's text for resetting a step that applied
// effects or made an outside call.
func resetRefusal(runID, step string, applied KeptEffects, calls MadeCalls) error {
	var parts []string
	if applied.Any() {
		parts = append(parts, fmt.Sprintf("step %s of %s has applied effects (%s), and resetting it does not undo them: "+
			"the step would apply them again when it reruns:\n  %s", step, runID, applied.Count(), strings.Join(applied.Lines, "\n  ")))
	}
	if calls.Any() {
		parts = append(parts, fmt.Sprintf("step %s of %s is an outside call that was made or may have been (%s), and resetting it "+
			"does not undo it: the step would make the call again when it reruns (an outside system that does not deduplicate "+
			"by idempotency key acts twice):\n  %s", step, runID, calls.Count(), strings.Join(calls.Lines, "\n  ")))
	}
	return fmt.Errorf("%w: %s", ErrNeedsDecision, strings.Join(parts, "\n"))
}

// clearedDetails is the audit details of clearing steps: the effects kept
// and the calls cleared, with their keys and results.
func clearedDetails(details string, applied KeptEffects, calls MadeCalls) string {
	add := func(s string) {
		if details != "" {
			details += "; "
		}
		details += s
	}
	if applied.Any() {
		add("effects kept: " + strings.Join(applied.Lines, "; "))
	}
	if calls.Any() {
		add("outside calls cleared (made again on rerun): " + strings.Join(calls.Lines, "; "))
	}
	return details
}

// OutputShapeError is returned by Resolve when the output given for an
// outside call does not fit the step's Go output type: the job could not
// decode it. Shape is the type's, as the step recorded it.
type OutputShapeError struct {
	RunID, Step string
	Shape       string
	Err         error
}

func (e *OutputShapeError) Error() string {
	return fmt.Sprintf("the output for step %s of %s does not fit its output type %s: %s",
		e.Step, e.RunID, e.Shape, strings.TrimPrefix(e.Err.Error(), steps.ErrShape.Error()+": "))
}

// Unwrap returns ErrBadOutput and the mismatch (steps.ErrShape).
func (e *OutputShapeError) Unwrap() []error { return []error{ErrBadOutput, e.Err} }

// checkResolveOutput checks an output for step s against the shape its
// call recorded, if any.
func checkResolveOutput(s checkpoint.Step, output []byte) error {
	shape, err := steps.CheckCallOutput(s.Call, output)
	if errors.Is(err, steps.ErrShape) {
		return &OutputShapeError{RunID: s.RunID, Step: s.ID, Shape: shape.String(), Err: err}
	}
	return err
}
