package steps

import (
	"errors"
	"fmt"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// Sentinel errors of package steps. Match them with errors.Is.
var (
	// ErrInvalidID is returned when a step ID is empty, too long or holds a
	// character outside the allowed set.
	ErrInvalidID = errors.New("steps: invalid step ID")
	// ErrDuplicateStep is returned when one attempt uses a step ID twice: a
	// bug in the job, since the second use would silently get the first's
	// output on a rerun.
	ErrDuplicateStep = errors.New("steps: duplicate step ID in one attempt")
	// ErrInterrupted is returned by Do when the run's context is cancelled
	// (a signal, a deadline) before the step starts.
	ErrInterrupted = errors.New("steps: run interrupted")
	// ErrNoOperator is returned by Begin when Config.AcceptChanged names
	// no operator or no reason: an acceptance is audited under both.
	ErrNoOperator = errors.New("steps: an acceptance of changed items names no operator or reason")
	// ErrLeaseExpired is returned by Call, without Config.LeaseFor, when
	// the attempt's lease has ended (or ends within the call margin): the
	// call is not made, since a runner taking the run over may make or
	// reconcile it at the same time.
	ErrLeaseExpired = errors.New("steps: lease expired")
)

// StepChangedError is returned when a completed step is called with an input
// whose hash differs from the one recorded: the job or its data changed since
// the step ran, so replaying its recorded output could be wrong.
type StepChangedError struct {
	RunID string
	Step  string
	Old   string // recorded input hash
	New   string // this call's input hash
}

func (e *StepChangedError) Error() string {
	return fmt.Sprintf("step %s of run %s changed since it ran (input hash %s, now %s); "+
		"if the new input is right, reset that step so it runs again, otherwise restore the old input",
		e.Step, e.RunID, short(e.Old), short(e.New))
}

func short(h string) string {
	if h == "" {
		return "none"
	}
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// RejectedError is a pinned business outcome: the step decided "no"
// (insufficient funds, account closed). It is recorded like an output, so a
// rerun returns the same rejection instead of trying again.
type RejectedError struct {
	Step   string
	Reason string
	err    error // the original error; nil when read back from a checkpoint
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("step %s rejected: %s", e.Step, e.Reason)
}

// Unwrap returns the job's original error on the attempt that produced the
// rejection, and nil when the rejection was read back from a checkpoint.
func (e *RejectedError) Unwrap() error { return e.err }

type rejection struct{ err error }

func (r *rejection) Error() string { return r.err.Error() }
func (r *rejection) Unwrap() error { return r.err }

// Reject marks err as a business rejection to pin: the step is recorded as
// rejected with err's message, and every rerun returns a *RejectedError with
// that message without calling the step's function again.
func Reject(err error) error {
	if err == nil {
		return nil
	}
	return &rejection{err: err}
}

// StepError wraps the error of a step's function with the step's ID.
type StepError struct {
	RunID string
	Step  string
	Err   error
}

func (e *StepError) Error() string { return fmt.Sprintf("step %s: %v", e.Step, e.Err) }

// Unwrap returns the step function's error.
func (e *StepError) Unwrap() error { return e.Err }

// ContendedError is returned when a partition's chunk on a separate-store
// target ran out of re-plans (MaxReplans, over PartitionReplanTime at
// least) because other writers kept moving its keys. Nothing of the chunk
// applied. It matches checkpoint.ErrTransient: trying again later may
// cure it, so the partition is handed back rather than failed, and
// claimed again after a pause under the job's store retry policy, as
// after a store fault; Err is the last conflict.
type ContendedError struct {
	// Step is the batch step, Chunk the chunk ("chunk 3 of post").
	Step, Chunk string
	// Replans is how often the chunk was planned again, over For.
	Replans int
	For     time.Duration
	Err     *checkpoint.VersionConflictError
}

func (e *ContendedError) Error() string {
	return fmt.Sprintf("%s re-planned %d times over %s while other writers kept moving its keys (%v); "+
		"its partition was handed back to be tried again later", e.Chunk, e.Replans, e.For.Round(time.Millisecond), e.Err)
}

// Is matches checkpoint.ErrTransient.
func (e *ContendedError) Is(target error) bool { return target == checkpoint.ErrTransient }

// Unwrap returns the last conflict.
func (e *ContendedError) Unwrap() error { return e.Err }
