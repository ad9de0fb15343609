package runner

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// PanicError is returned when job code panicked: the job function, a
// step's function or a batch item's function. The runner recovers the panic
// in the goroutine that runs the job, so other runs in the process go on,
// and records the attempt as failed with the panic value and the stack
// (Record); a rerun resumes from the checkpoints as after any failure.
// Panics in goroutines the job starts itself cannot be recovered here: they
// end the process, as in any Go program.
type PanicError struct {
	// RunID is the run whose job panicked.
	RunID string
	// Value is what was passed to panic.
	Value any
	// Stack is the panicking goroutine's stack, from the panicking
	// function down (the recovery's own frames removed).
	Stack []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("panic in job code: %v", e.Value)
}

// Record is the text recorded as the attempt's error: Error's line, a blank
// line, then the stack.
func (e *PanicError) Record() string {
	return e.Error() + "\n\n" + strings.TrimRight(string(e.Stack), "\n")
}

// callJob calls the job function, turning a panic into a *PanicError.
func callJob(ctx context.Context, job jobs.Job, run *steps.Run, params []byte) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{RunID: run.ID(), Value: v, Stack: panicStack(debug.Stack())}
		}
	}()
	return job.Execute(ctx, run, params)
}

// panicStack drops the frames above the panic from a stack taken in a
// deferred recover (debug.Stack, the deferred function, runtime's panic),
// so the stack starts at the function that panicked. A stack of another
// shape is returned as it is.
func panicStack(stack []byte) []byte {
	lines := strings.Split(string(stack), "\n")
	for i := 1; i+1 < len(lines); i++ {
		if strings.HasPrefix(lines[i], "panic(") && strings.HasPrefix(lines[i+1], "\t") {
			return []byte(lines[0] + "\n" + strings.Join(lines[i+2:], "\n"))
		}
	}
	return stack
}
