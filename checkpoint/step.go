package checkpoint

import "bytes"

// RefusedPut applies the rule every store shares when a step checkpoint
// was not written because the step is already recorded finished: the
// identical content is our own earlier commit whose acknowledgement was
// lost, so it counts as success (nil); different content is a
// *StepConflictError.
func RefusedPut(runID string, recorded, given Step) error {
	if recorded.Status == given.Status && recorded.InputHash == given.InputHash && recorded.Error == given.Error &&
		bytes.Equal(recorded.Output, given.Output) {
		return nil
	}
	return &StepConflictError{RunID: runID, StepID: given.ID, Status: recorded.Status}
}
