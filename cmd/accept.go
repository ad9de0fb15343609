package cmd

import (
	"errors"
	"fmt"

	"github.com/stepwise-run/stepwise/runner/ops"
	"github.com/stepwise-run/stepwise/steps"
)

// acceptFlags are resume's and rerun's way past batch items whose source
// changed since an earlier attempt (exit 5, *steps.ItemChangedError).
type acceptFlags struct {
	AcceptChanged bool `name:"accept-changed" help:"Go on past the batch items whose source changed that the last exit-5 refusal named, and only those: a finished item whose data changed keeps its outcome and effects and is not processed again, a finished item gone from the source stays as it was, items beyond the source's declared total are processed. A change the refusal did not name (found further on, or an item changed again since) is refused in its turn, exit 5, naming it. Each acceptance is recorded in the audit log with every item accepted and who accepted it; needs --reason and an operator (--operator, $STEPWISE_OPERATOR or $USER)."`
}

// check refuses --accept-changed without a reason or an operator.
func (f acceptFlags) check(command, reason, operator string) error {
	if !f.AcceptChanged {
		return nil
	}
	if reason == "" {
		return usageError{fmt.Errorf("%s --accept-changed needs --reason \"...\" (recorded in the audit log with each item accepted)", command)}
	}
	if operator == "" {
		return usageError{fmt.Errorf("%s --accept-changed needs to know who accepts: pass --operator NAME or set $STEPWISE_OPERATOR "+
			"($USER is not set either); the audit log records each item accepted under that name", command)}
	}
	return nil
}

// resumption checks --accept-changed's needs and returns what an
// operator's resume or rerun (command) claims the run with: its audit
// records, which commit with the claim, and the acceptance, if any.
func (f acceptFlags) resumption(env *Env, op operatorFlags, runID, command, fromStep, reason string) (ops.Resumption, error) {
	if err := f.check(command, reason, op.identity()); err != nil {
		return ops.Resumption{}, err
	}
	return ops.Resume(op.who(reason), runID, command, fromStep, f.AcceptChanged, env.now())
}

// itemChangedHint adds to an *steps.ItemChangedError what the operator
// can type: the library's error says what changed and the choices, in
// words.
func itemChangedHint(env *Env, err error, runID string) error {
	var ce *steps.ItemChangedError
	if !errors.As(err, &ce) {
		return err
	}
	if runID == "" {
		runID = ce.RunID
	}
	name := env.Name
	hint := fmt.Sprintf("if the data is wrong, restore it and run `%s resume %s`; "+
		"if it is right, `%s resume %s --accept-changed --reason \"...\"` goes on past it (audited)", name, runID, name, runID)
	switch ce.Change {
	case steps.ItemBeyondTotal, steps.ItemInserted:
		hint += "; if a step of the run counted the items, its count is stale: `" + name + " reset " + runID +
			" --step STEP --reason \"...\"` on that step makes it count again"
	default:
		hint += fmt.Sprintf("; `%s reset %s --step %s --force --reason \"...\"` processes every item again, applying their effects again", name, runID, ce.Step)
	}
	return fmt.Errorf("%w\n%s", err, hint)
}
