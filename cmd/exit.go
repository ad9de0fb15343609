package cmd

import (
	"errors"
	"fmt"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
	"github.com/stepwise-run/stepwise/steps"
)

// Exit codes of the stepwise command. Each means one thing; exitCodesHelp
// lists every case of each.
const (
	ExitOK          = 0 // the run succeeded (or had already succeeded), or the operation was done
	ExitFailed      = 1 // the run failed
	ExitUsage       = 2 // bad usage or input
	ExitInterrupted = 3 // interrupted, resumable
	ExitHeld        = 4 // another process holds it: the run's lease, or the database's write lock
	ExitOperator    = 5 // refused: needs an operator decision
)

const exitCodesHelp = `Exit codes (each means one thing):
  0  the run succeeded (or had already succeeded), or the operation was done.
  1  the run failed (an error in a step beyond its retries, an int64 overflow):
     rerun or resume it.
  2  bad usage or input: an unknown job, run, step, schedule or outbox message; bad or
     changed parameters; a database file that is missing, not a database,
     read-only or too new; a PostgreSQL store that cannot be opened: a bad URL,
     the server down, the login refused, a missing database or privilege, too
     many connections (nothing was written; the same server errors mid-run fail
     the run: exit 1).
  3  interrupted (SIGINT/SIGTERM), resumable: run or resume it again.
  4  another process holds it: a live runner holds the run's lease (run, resume and
     rerun without --wait; recover, abandon, reset and resolve on a live run), this
     runner lost its lease mid-run, this runner could not renew its lease in time and
     stopped itself (self-fenced: the database unreachable or too slow for a third
     of --lease), the job's concurrency limit is full (as many of its runs as it
     allows are running: run and resume without --wait), or the database is
     locked (another process held SQLite's write lock longer than
     --busy-timeout; --wait waits for it).
  5  refused, needs an operator decision: a changed step; a batch item whose source
     changed since it was processed; an outside call of unknown outcome; an
     abandoned or pruned run; rerun of a succeeded run without --force; reset or
     rerun --from-step of steps whose effects applied or outside calls that were
     made, without --force; recover of a run that is not running; resolve of a
     step awaiting no decision, or resolve --replace of a resolution a later
     attempt used; abandon of
     an abandoned or succeeded run; outbox requeue of a message that is not dead;
     schedules pause of a paused schedule, schedules unpause of one not paused.

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
		reached  *checkpoint.LimitReachedError
		mismatch *checkpoint.ParamsMismatchError
		usage    usageError
	)
	switch {
	case errors.Is(err, ErrNeedsDecision): // the command's own refusal wins (abandon of a succeeded run)
		return ExitOperator
	case err == nil, errors.Is(err, checkpoint.ErrAlreadySucceeded):
		return ExitOK
	case runner.NeedsOperator(err), errors.Is(err, checkpoint.ErrAbandoned), errors.Is(err, checkpoint.ErrPruned):
		return ExitOperator
	case errors.As(err, &held), errors.As(err, &reached), errors.Is(err, checkpoint.ErrFenced), errors.Is(err, runner.ErrLeaseLost),
		errors.Is(err, checkpoint.ErrLocked):
		return ExitHeld
	case errors.Is(err, runner.ErrInterrupted):
		return ExitInterrupted
	case errors.As(err, &usage), errors.As(err, &mismatch), errors.Is(err, jobs.ErrBadParams),
		errors.Is(err, jobs.ErrUnknownJob), errors.Is(err, checkpoint.ErrNotFound),
		errors.Is(err, checkpoint.ErrNoDirectory), errors.Is(err, checkpoint.ErrNotDatabase),
		errors.Is(err, checkpoint.ErrReadOnly), errors.Is(err, checkpoint.ErrTooNew),
		errors.Is(err, checkpoint.ErrNoDatabase), errors.Is(err, ops.ErrBadText), errors.Is(err, checkpoint.ErrBadAudit):
		return ExitUsage
	}
	return ExitFailed
}

// waitFlag says whether the command that failed takes --wait, and whether
// it was given, so the hint for a locked database names what is true.
type waitFlag int

const (
	noWaitFlag waitFlag = iota // the command has no --wait
	waitNotGiven
	waitGiven
)

// hint is what the user can do about err, beyond what the error says:
// library errors carry data, the command line names its own flags.
func hint(err error, name string, wait waitFlag) string {
	var (
		held        *checkpoint.LeaseHeldError
		reached     *checkpoint.LimitReachedError
		unknownMsgs *checkpoint.UnknownMessagesError
	)
	switch {
	case errors.As(err, &reached):
		h := "run it again when one of those runs has ended"
		if wait == waitNotGiven {
			h = "add --wait to wait for room, or " + h
		}
		return h + ", or queue it for a worker (`" + name + " enqueue`), which starts it when there is room"
	case errors.Is(err, checkpoint.ErrAlreadySucceeded) && !errors.Is(err, ErrNeedsDecision):
		return "--force runs it again, still skipping completed steps"
	case errors.As(err, &unknownMsgs):
		return "`" + name + " outbox --status dead` lists the dead messages and their keys"
	case errors.Is(err, checkpoint.ErrNotFound):
		return "`" + name + " runs` lists the runs"
	case errors.Is(err, jobs.ErrUnknownJob):
		return "`" + name + " jobs` lists the jobs and their parameters"
	case errors.Is(err, checkpoint.ErrNotDatabase):
		return "check that --db (or $STEPWISE_DB) names a Stepwise database, or move the file away"
	case errors.Is(err, runner.ErrLeaseLost):
		return "check that the database is reachable from this host, then run or resume it again; " +
			"a longer --lease leaves renewals more time (a third of it)"
	case errors.Is(err, checkpoint.ErrLocked):
		h := "another process held the database's write lock longer than --busy-timeout: run again when it is done"
		if wait == waitNotGiven {
			h += ", add --wait to wait for it (at the start and mid-run)"
		}
		return h + ", or raise --busy-timeout"
	case errors.As(err, &held) && errors.Is(err, checkpoint.ErrNotStale):
		return "wait for its runner to finish, or use recover --force if that runner is surely gone"
	}
	return ""
}

// errorText is how the command prints err: its message, then what the
// operator can do about it where the library error carries only data. For
// an outside call of unknown outcome (*steps.OutcomeUnknownError) that is
// a rerun when the step reconciles by itself, else the resolve command.
// Go package prefixes ("steps: ") are left out.
func errorText(err error, name string) string {
	return ops.UserText(errorLines(err, name))
}

// errorLines is errorText with the package prefixes left in.
func errorLines(err error, name string) string {
	var unknown *steps.OutcomeUnknownError
	if !errors.As(err, &unknown) {
		return err.Error()
	}
	resolve := fmt.Sprintf("`%s resolve %s --step %s --as done|retry --reason \"...\"`", name, unknown.RunID, unknown.Step)
	if unknown.Reconcilable {
		return fmt.Sprintf("%v\nrerun it (`%s resume %s`) to reconcile it automatically; settle it by hand with %s "+
			"only after checking the outside system for key %s yourself", err, name, unknown.RunID, resolve, unknown.Key)
	}
	return fmt.Sprintf("%v\nonce checked, settle it with %s (done: it happened; retry: it did not, call again)", err, resolve)
}
