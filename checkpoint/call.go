package checkpoint

import (
	"encoding/json"
	"fmt"
	"time"
)

// CallRecord is what an outside call step (steps.Call) records with its
// checkpoint, from its intent on (Step.Call holds it as JSON): which
// idempotency key it sends, the shape of the JSON its Go output type
// decodes, and, once an operator settled it, how. Operations read it to
// tell an outside call from other steps (clearing one makes the call
// again) and to check an operator's output before recording it.
type CallRecord struct {
	// Key is the call's idempotency key (RUN_ID/STEP_ID).
	Key string `json:"key"`
	// OutputShape describes the JSON the step's output type decodes
	// (steps.Shape, as JSON); empty when unknown.
	OutputShape json.RawMessage `json:"output_shape,omitempty"`
	// Resolved is set by ResolveStep: the step's state is an operator's
	// decision, not the call's result.
	Resolved *CallResolution `json:"resolved,omitempty"`
}

// CallResolution is an operator's decision about an outside call, as
// ResolveStep records it.
type CallResolution struct {
	// As is "done" (the call happened; Output is its result) or "retry".
	As       string    `json:"as"`
	Operator string    `json:"operator"`
	At       time.Time `json:"at"`
	// AfterAttempt is the run's latest attempt number when it was
	// resolved. The resolution is used once a checkpoint of any step or
	// batch item is recorded by a higher attempt: from then on a later
	// step may have read the output, and it can no longer be replaced.
	AfterAttempt int `json:"after_attempt"`
}

// DecodeCallRecord decodes a Step.Call; nil for a step that is not an
// outside call (or was recorded before calls kept a record).
func DecodeCallRecord(b []byte) (*CallRecord, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var r CallRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("checkpoint: decode the outside call record: %w", err)
	}
	return &r, nil
}

// Encode is the record as Step.Call holds it.
func (r CallRecord) Encode() []byte {
	b, err := json.Marshal(r)
	if err != nil {
		// Strings, a time and raw JSON that was decoded: cannot fail.
		panic(fmt.Sprintf("checkpoint: encode a call record: %v", err))
	}
	return b
}

// ResolveState is what ResolveStep found in its transaction, for the
// Resolution rule.
type ResolveState struct {
	Run    Run
	StepID string
	// Status is the step's recorded status; Call its record (Step.Call).
	Status string
	Call   []byte
	// LastAttempt is the run's highest attempt number.
	LastAttempt int
	// UsedBy names a step (or STEP/ITEM) recorded by an attempt after the
	// step's last resolution; the store fills it when replacing.
	UsedBy string
}

// ResolveStepAfter is the attempt after which a replace looks for
// checkpoints that used the resolution of the step whose record is call
// (see CallResolution.AfterAttempt), and false when the step's state is
// not an operator's resolution.
func ResolveStepAfter(call []byte) (int, bool) {
	rec, err := DecodeCallRecord(call)
	if err != nil || rec == nil || rec.Resolved == nil {
		return 0, false
	}
	return rec.Resolved.AfterAttempt, true
}

// Resolution applies the resolve rule every store shares. Without
// replace, only an outside call of unknown outcome can be resolved
// (ErrNotUnknown otherwise). With replace (WithReplace), only a step
// whose state is an earlier resolution (ErrNotResolved otherwise) that no
// later checkpoint used (ErrResolutionUsed, naming it). Done records it
// completed; otherwise it is failed, with who resolved it and why, so the
// next run calls again. call is the step's new record, the decision in it.
func Resolution(st ResolveState, a Audit, done, replace bool) (newStatus, errText string, call []byte, err error) {
	rec, err := DecodeCallRecord(st.Call)
	if err != nil {
		return "", "", nil, err
	}
	resolved := rec != nil && rec.Resolved != nil
	switch {
	case replace && !resolved:
		return "", "", nil, fmt.Errorf("%w: step %s of %s is %s and was not resolved by an operator; there is no resolution to replace",
			ErrNotResolved, st.StepID, st.Run.ID, st.Status)
	case replace && st.UsedBy != "":
		return "", "", nil, fmt.Errorf("%w: the resolution of step %s of %s (as %s by %s at %s) was used: %s was recorded by a later attempt "+
			"and may have read its output, so it is no longer replaced",
			ErrResolutionUsed, st.StepID, st.Run.ID, rec.Resolved.As, rec.Resolved.Operator, rec.Resolved.At.UTC().Format(time.RFC3339), st.UsedBy)
	case !replace && st.Status != StepCalling:
		hint := ""
		if resolved {
			hint = fmt.Sprintf(" (it was resolved as %s by %s at %s; to correct that, resolve it again with replace, "+
				"which works while no later attempt has recorded a step)",
				rec.Resolved.As, rec.Resolved.Operator, rec.Resolved.At.UTC().Format(time.RFC3339))
		}
		return "", "", nil, fmt.Errorf("%w: step %s of %s is %s, not an outside call of unknown outcome; nothing to resolve%s",
			ErrNotUnknown, st.StepID, st.Run.ID, st.Status, hint)
	}
	if rec == nil {
		rec = &CallRecord{}
	}
	as := "retry"
	newStatus, errText = StepFailed, "resolved by "+a.Operator+" as not done: "+a.Reason
	if done {
		as, newStatus, errText = "done", StepCompleted, ""
	}
	rec.Resolved = &CallResolution{As: as, Operator: a.Operator, At: a.At, AfterAttempt: st.LastAttempt}
	return newStatus, errText, rec.Encode(), nil
}
