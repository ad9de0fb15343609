package checkpoint

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors of the checkpoint store. Match them with errors.Is.
var (
	// ErrNotFound is returned when a run asked for by ID does not exist.
	ErrNotFound = errors.New("checkpoint: not found")
	// ErrFenced is returned when a write carries a fence older than the
	// run's: another runner claimed the run since, so this one must stop.
	ErrFenced = errors.New("checkpoint: lease lost to another runner (fenced)")
	// ErrNoDirectory is returned by Open when the database's directory does
	// not exist.
	ErrNoDirectory = errors.New("checkpoint: directory does not exist")
	// ErrNotDatabase is returned by Open when the file is not a SQLite
	// database.
	ErrNotDatabase = errors.New("checkpoint: file is not a SQLite database")
	// ErrReadOnly is returned when the database file cannot be written.
	ErrReadOnly = errors.New("checkpoint: database is read-only")
	// ErrLocked is returned when another process held the database longer
	// than the busy timeout.
	ErrLocked = errors.New("checkpoint: database is locked")
	// ErrTooNew is returned by Open when the database was written by a newer
	// Stepwise whose schema this binary does not know.
	ErrTooNew = errors.New("checkpoint: database schema is newer than this binary")
	// ErrNeedsMigration is returned by Open with NoMigrate (a command that
	// only reads) when the database's schema is older than this binary's:
	// it is not migrated by a read.
	ErrNeedsMigration = errors.New("checkpoint: database schema is older than this binary's, and a read does not migrate it")
	// ErrAlreadySucceeded is returned by Claim for a succeeded run unless
	// the claim is forced.
	ErrAlreadySucceeded = errors.New("checkpoint: run already succeeded")
	// ErrItemFinished is returned by Tx.PutItems when an item is already
	// recorded as completed or rejected: processing it again would apply
	// its effects twice, so the whole chunk transaction is refused.
	ErrItemFinished = errors.New("checkpoint: batch item already finished")
	// ErrPruned is returned by Claim for a run whose checkpoints were
	// pruned: its tombstone refuses it, forced or not.
	ErrPruned = errors.New("checkpoint: run was pruned")
	// ErrNotUnknown is returned by ResolveStep for a step that is not an
	// outside call of unknown outcome.
	ErrNotUnknown = errors.New("checkpoint: step is not awaiting a decision")
	// ErrNotResolved is returned by ResolveStep with WithReplace for a
	// step whose state is not an operator's resolution.
	ErrNotResolved = errors.New("checkpoint: step was not resolved by an operator")
	// ErrRunChanged is returned by ResetSteps with WithFence when the run
	// changed after its caller judged what the reset clears.
	ErrRunChanged = errors.New("checkpoint: the run changed since the operation was judged")
	// ErrResolutionUsed is returned by ResolveStep with WithReplace when
	// a checkpoint recorded after the resolution may have read it.
	ErrResolutionUsed = errors.New("checkpoint: the resolution was used")
	// ErrNotStale is returned by Recover for a run whose runner still holds
	// a live lease.
	ErrNotStale = errors.New("checkpoint: run is not stale")
	// ErrAbandoned is returned by Claim for an abandoned run unless the
	// claim is forced.
	ErrAbandoned = errors.New("checkpoint: run was abandoned")
	// ErrTransient is matched (errors.Is) by a store error that trying
	// again may cure: the connection was lost or closed by the server,
	// the server was shutting down or starting up, or the transaction was
	// aborted by a serialization failure or a deadlock. Nothing of the
	// failed write was kept, except that a lost commit may have
	// committed; the checkpoints tell which when the step or chunk is
	// tried again. The backend decides what is transient; callers only
	// ask errors.Is(err, ErrTransient).
	ErrTransient = errors.New("checkpoint: transient store fault")
)

// LeaseHeldError is returned by Claim, and by the manual operations, when
// a live runner holds the run.
type LeaseHeldError struct {
	RunID string
	Owner string // the full owner string; the message shows OwnerName(Owner)
	Until time.Time
}

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("run %s is held by %s until %s", e.RunID, OwnerName(e.Owner), e.Until.UTC().Format(time.RFC3339))
}

// ErrRunExists is wrapped by *RunExistsError: a create-only claim found
// the run already recorded.
var ErrRunExists = errors.New("checkpoint: run already exists")

// RunExistsError is returned by a create-only Claim (ClaimRequest.CreateOnly)
// of a run that is already recorded with the same parameters; Run is the
// run as it stands.
type RunExistsError struct {
	Run Run
}

func (e *RunExistsError) Error() string {
	return fmt.Sprintf("run %s already exists (%s)", e.Run.ID, e.Run.Status)
}

// Unwrap makes errors.Is(err, ErrRunExists) hold.
func (e *RunExistsError) Unwrap() error { return ErrRunExists }

// ParamsMismatchError is returned by Claim when a run key is started again
// with parameters different from those it was first started with.
type ParamsMismatchError struct {
	RunID  string
	Stored string
	Given  string
}

func (e *ParamsMismatchError) Error() string {
	return fmt.Sprintf("run %s was started with parameters %s; this start gives %s; "+
		"a run key always means the same parameters: use the stored ones (resume %s) or a different key",
		e.RunID, e.Stored, e.Given, e.RunID)
}

// StepConflictError is returned by Tx.PutStep when the step is already
// recorded as finished with different content.
type StepConflictError struct {
	RunID  string
	StepID string
	Status string
}

func (e *StepConflictError) Error() string {
	return fmt.Sprintf("step %s of run %s is already recorded as %s with a different result", e.StepID, e.RunID, e.Status)
}

// ErrNoDatabase is returned when a database that must exist does not: a
// SQLite file opened with Config.MustExist (or as an effect target), a
// PostgreSQL database the server does not have, or one without Stepwise's
// tables opened by a command that only reads. The message names it (a
// file's absolute path, a server and database; never a password); nothing
// was created.
var ErrNoDatabase = errors.New("checkpoint: database does not exist")
