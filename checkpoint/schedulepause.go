package checkpoint

import (
	"errors"
	"fmt"
	"time"
)

// Errors of pausing a schedule. Match them with errors.Is.
var (
	// ErrSchedulePaused is returned by PauseSchedule for a schedule that
	// is paused already (the error names by whom, when and why).
	ErrSchedulePaused = errors.New("checkpoint: schedule is paused already")
	// ErrScheduleNotPaused is returned by UnpauseSchedule for a schedule
	// that is not paused.
	ErrScheduleNotPaused = errors.New("checkpoint: schedule is not paused")
)

// SchedulePause says who paused a schedule, when and why. The zero value
// is a schedule that is not paused.
type SchedulePause struct {
	At     time.Time `json:"at"`
	By     string    `json:"by"`
	Reason string    `json:"reason"`
}

// Paused reports whether p is a pause in force.
func (p SchedulePause) Paused() bool { return !p.At.IsZero() }

// PauseSkip is the fires a pause ended without catch-up leaves out: a
// scheduler settles every fire after From up to Until as skipped for the
// pause, never running it. The zero value skips nothing.
type PauseSkip struct {
	From  time.Time `json:"from"`
	Until time.Time `json:"until"`
}

// Skips reports whether the fire at t is one the window leaves out.
func (w PauseSkip) Skips(t time.Time) bool {
	return !w.Until.IsZero() && t.After(w.From) && !t.After(w.Until)
}

// ScheduleAuditID is the audit trail's key (Audit.RunID) of schedule
// name's pauses and unpauses: "#schedule/" and the name. No run ID starts
// with "#" (a job name never holds one), so Audits(ctx,
// ScheduleAuditID(name)) lists the schedule's operations and nothing else.
func ScheduleAuditID(name string) string { return "#schedule/" + name }

// CheckScheduleAudit returns an error unless a is an audit record of
// schedule name (its RunID is ScheduleAuditID(name)) that a store can
// keep (Audit.Check).
func CheckScheduleAudit(name string, a Audit) error {
	if name == "" || a.RunID != ScheduleAuditID(name) || a.At.IsZero() {
		return fmt.Errorf("checkpoint: the audit record of a pause of schedule %q needs RunID %q and a time (got %q at %v)",
			name, ScheduleAuditID(name), a.RunID, a.At)
	}
	if err := a.Check(); err != nil {
		return fmt.Errorf("%s of schedule %s: %w", a.Command, name, err)
	}
	return nil
}

// PausedError is the ErrSchedulePaused of a pause refused because one is
// in force: it names it.
func PausedError(name string, p SchedulePause) error {
	return fmt.Errorf("%w: %s was paused by %s at %s (%s)", ErrSchedulePaused, name, p.By, p.At.UTC().Format(time.RFC3339), p.Reason)
}

// NextPauseSkip is the skip window an unpause without catch-up at now
// records for pause p of a schedule settled up to lastFire, whose window
// was old: the fires after the pause began up to now. A window an earlier
// unpause recorded that no scheduler has passed yet (its Until after
// lastFire) is kept inside the new one, so its fires stay skipped.
func NextPauseSkip(old PauseSkip, p SchedulePause, lastFire, now time.Time) PauseSkip {
	from := p.At
	if old.Until.After(lastFire) && old.From.Before(from) {
		from = old.From
	}
	return PauseSkip{From: from, Until: now}
}
