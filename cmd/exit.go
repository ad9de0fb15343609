package cmd

import (
	"errors"
	"fmt"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// Exit codes of the stepwise command.
const (
	ExitOK          = 0 // the run succeeded (or had already succeeded)
	ExitFailed      = 1 // the run failed
	ExitUsage       = 2 // bad usage or input
	ExitInterrupted = 3 // interrupted, resumable
	ExitHeld        = 4 // held by another runner, or the lease was lost
	ExitOperator    = 5 // needs an operator decision
)

const exitCodesHelp = `Exit codes: 0 run succeeded (or already had); 1 run failed; 2 bad usage or input;
3 interrupted, resumable; 4 run held by another runner (or lease lost); 5 needs an operator decision
(a changed step, an outside call of unknown outcome, an abandoned or pruned run).

SIGINT/SIGTERM: the current step or chunk finishes or rolls back within $STEPWISE_GRACE (30s),
the attempt is recorded as interrupted and the process exits 3; a second signal ends it at once
(safe: nothing is half-written).`

// usageError marks errors in what the user typed.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// UsageError marks err as a mistake in what the user asked for (exit 2).
func UsageError(err error) error { return usageError{err} }

// ExitCode maps an error to the command's exit code.
func ExitCode(err error) int {
	var (
		held     *checkpoint.LeaseHeldError
		mismatch *checkpoint.ParamsMismatchError
		changed  *steps.StepChangedError
		unknown  *steps.OutcomeUnknownError
		usage    usageError
	)
	switch {
	case err == nil, errors.Is(err, checkpoint.ErrAlreadySucceeded):
		return ExitOK
	case errors.As(err, &changed), errors.As(err, &unknown), errors.Is(err, checkpoint.ErrAbandoned), errors.Is(err, checkpoint.ErrPruned),
		errors.Is(err, ErrNeedsDecision):
		return ExitOperator
	case errors.As(err, &held), errors.Is(err, checkpoint.ErrFenced):
		return ExitHeld
	case errors.Is(err, runner.ErrInterrupted):
		return ExitInterrupted
	case errors.As(err, &usage), errors.As(err, &mismatch), errors.Is(err, jobs.ErrBadParams),
		errors.Is(err, jobs.ErrUnknownJob), errors.Is(err, checkpoint.ErrNotFound),
		errors.Is(err, checkpoint.ErrNoDirectory), errors.Is(err, checkpoint.ErrNotDatabase),
		errors.Is(err, checkpoint.ErrReadOnly), errors.Is(err, checkpoint.ErrTooNew):
		return ExitUsage
	}
	return ExitFailed
}

// errorText is how the command prints err: its message, then what the
// operator can do about it where the library error carries only data. For
// an outside call of unknown outcome (*steps.OutcomeUnknownError) that is
// a rerun when the step reconciles by itself, else the resolve command.
func errorText(err error) string {
	var unknown *steps.OutcomeUnknownError
	if !errors.As(err, &unknown) {
		return err.Error()
	}
	resolve := fmt.Sprintf("`stepwise resolve %s --step %s --as done|retry --reason \"...\"`", unknown.RunID, unknown.Step)
	if unknown.Reconcilable {
		return fmt.Sprintf("%v\nrerun it (`stepwise resume %s`) to reconcile it automatically; settle it by hand with %s "+
			"only after checking the outside system for key %s yourself", err, unknown.RunID, resolve, unknown.Key)
	}
	return fmt.Sprintf("%v\nonce checked, settle it with %s (done: it happened; retry: it did not, call again)", err, resolve)
}
