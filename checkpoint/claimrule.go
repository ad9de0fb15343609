package checkpoint

import (
	"fmt"
	"time"
)

// Takeover is what a claim of an existing run takes over: the owner whose
// unfinished attempt it replaces and when that owner's lease would have
// ended (both empty when the run was not running).
type Takeover struct {
	From       string
	LeaseUntil time.Time
}

// MayClaim applies the claim rules every store shares to an existing run,
// as read (and locked) inside the claim's transaction: a pruned run is
// refused for good (ErrPruned), other parameters are a
// *ParamsMismatchError, a succeeded or abandoned run needs req.Force
// (ErrAlreadySucceeded, ErrAbandoned), and a run whose lease is live at
// now is a *LeaseHeldError unless req.OwnerGone says its owner is gone.
// now is the time leases are judged by: the request's, or the database's
// clock for a store that keeps leases on it.
//
// A create-only claim (req.CreateOnly) of an existing run is refused with
// a *RunExistsError after the parameter check, whatever the run's state:
// it never takes a run over.
func MayClaim(run Run, req ClaimRequest, now time.Time) (Takeover, error) {
	if req.CreateOnly {
		if run.ParamsHash != req.ParamsHash {
			return Takeover{}, &ParamsMismatchError{RunID: run.ID, Stored: string(run.Params), Given: string(req.Params)}
		}
		return Takeover{}, &RunExistsError{Run: run}
	}
	if !run.PrunedAt.IsZero() {
		return Takeover{}, fmt.Errorf("%w: %s was pruned at %s; its checkpoints are gone, so running it again "+
			"would redo its effects; pick another run key", ErrPruned, run.ID, run.PrunedAt.Format(time.RFC3339))
	}
	if run.ParamsHash != req.ParamsHash {
		return Takeover{}, &ParamsMismatchError{RunID: run.ID, Stored: string(run.Params), Given: string(req.Params)}
	}
	switch run.Status {
	case RunSucceeded:
		if !req.Force {
			return Takeover{}, fmt.Errorf("%w: %s finished at %s; nothing to do (a forced claim runs it again, still skipping completed steps)",
				ErrAlreadySucceeded, run.ID, run.FinishedAt.Format(time.RFC3339))
		}
	case RunAbandoned:
		if !req.Force {
			return Takeover{}, fmt.Errorf("%w: %s (%s); it is not resumed unless forced", ErrAbandoned, run.ID, run.Error)
		}
	case RunRunning:
		live := now.Before(run.LeaseUntil)
		if live && (req.OwnerGone == nil || !req.OwnerGone(run.LeaseOwner)) {
			return Takeover{}, &LeaseHeldError{RunID: run.ID, Owner: run.LeaseOwner, Until: run.LeaseUntil}
		}
		return Takeover{From: run.LeaseOwner, LeaseUntil: run.LeaseUntil}, nil
	}
	return Takeover{}, nil
}
