package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
)

// ErrUnknownSchedule is returned when an operation names a schedule the
// program does not define; the error lists those it does.
var ErrUnknownSchedule = errors.New("no such schedule")

// PauseView is who paused a schedule, when and why.
type PauseView struct {
	By     string    `json:"by"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
}

// PauseSkipView is the fires the last unpause without catch-up skipped:
// those after From up to Until, never run.
type PauseSkipView struct {
	From  time.Time   `json:"from"`
	Until time.Time   `json:"until"`
	Fires []time.Time `json:"fires"` // oldest first, at most MaxMissedListed
	More  bool        `json:"more,omitempty"`
}

// PauseSchedule pauses schedule name (one of scheds): no scheduler
// sharing the store fires it until it is unpaused. The pause and its
// audit record (who, when, why) commit together; a record that cannot be
// written pauses nothing. A reason is required (ErrNeedsReason); a
// schedule paused already is refused with ErrNeedsDecision wrapping
// checkpoint.ErrSchedulePaused.
func PauseSchedule(ctx context.Context, st checkpoint.ScheduleStore, who Who, scheds []runner.Schedule, name string, now time.Time) (checkpoint.Audit, error) {
	a := who.Audit(checkpoint.ScheduleAuditID(name), "schedules pause", "", now)
	if err := checkPauseOp(who, scheds, name); err != nil {
		return a, err
	}
	return a, decision(st.PauseSchedule(ctx, name, a))
}

// UnpauseSchedule ends schedule name's pause. Without catchUp the fires
// the pause held (those since it began) are skipped, never run; with
// catchUp they are missed fires for the schedule's misfire policy (and
// starting deadline) to run or skip. The unpause and its audit record
// commit together. A schedule not paused is refused with
// ErrNeedsDecision wrapping checkpoint.ErrScheduleNotPaused.
func UnpauseSchedule(ctx context.Context, st checkpoint.ScheduleStore, who Who, scheds []runner.Schedule, name string, catchUp bool, now time.Time) (checkpoint.Audit, error) {
	cmd, details := "schedules unpause", "the fires since the pause are skipped"
	if catchUp {
		cmd = "schedules unpause --catch-up"
		if s, ok := findSchedule(scheds, name); ok {
			details = "the fires since the pause catch up: " + MisfireNote(string(orDefault(s.Misfire, runner.MisfireRunOnce)))
		}
	}
	a := who.Audit(checkpoint.ScheduleAuditID(name), cmd, details, now)
	if err := checkPauseOp(who, scheds, name); err != nil {
		return a, err
	}
	return a, decision(st.UnpauseSchedule(ctx, name, a, catchUp))
}

func checkPauseOp(who Who, scheds []runner.Schedule, name string) error {
	if err := who.Check(); err != nil {
		return err
	}
	if err := CheckText("name", name); err != nil {
		return err
	}
	if strings.TrimSpace(who.Reason) == "" {
		return fmt.Errorf("%w: say why the schedule is paused or unpaused, for the audit trail", ErrNeedsReason)
	}
	if _, ok := findSchedule(scheds, name); !ok {
		var names []string
		for _, s := range scheds {
			names = append(names, s.Name)
		}
		known := "it defines none"
		if len(names) > 0 {
			known = "its schedules are " + strings.Join(names, ", ")
		}
		return fmt.Errorf("%w: %q is not a schedule of this program; %s", ErrUnknownSchedule, name, known)
	}
	return nil
}

// decision wraps the refusals of a pause or unpause that does not apply
// to the schedule as it stands in ErrNeedsDecision.
func decision(err error) error {
	if errors.Is(err, checkpoint.ErrSchedulePaused) || errors.Is(err, checkpoint.ErrScheduleNotPaused) {
		return fmt.Errorf("%w: %w", ErrNeedsDecision, err)
	}
	return err
}

func findSchedule(scheds []runner.Schedule, name string) (runner.Schedule, bool) {
	for _, s := range scheds {
		if s.Name == name {
			return s, true
		}
	}
	return runner.Schedule{}, false
}

// viewPause fills in v's pause and the fires its last unpause skipped.
func viewPause(v *ScheduleView, s runner.Schedule, st checkpoint.ScheduleState) error {
	if st.Pause.Paused() {
		v.Paused = &PauseView{By: st.Pause.By, At: st.Pause.At, Reason: st.Pause.Reason}
	}
	if st.Skip.Until.IsZero() {
		return nil
	}
	fires, err := s.Fires(st.Skip.From, MaxMissedListed+1)
	if err != nil {
		return err
	}
	w := &PauseSkipView{From: st.Skip.From, Until: st.Skip.Until, Fires: []time.Time{}}
	for _, f := range fires {
		if f.At.After(st.Skip.Until) {
			break
		}
		if len(w.Fires) == MaxMissedListed {
			w.More = true
			break
		}
		w.Fires = append(w.Fires, f.At)
	}
	v.SkippedForPause = w
	return nil
}
