package steps

import (
	"os"
	"syscall"
)

// CrashEnv names the environment variable that selects a crash point. When
// it equals a point passed to Crash, the process kills itself with SIGKILL at
// that point: crash tests use it to stop a real runner exactly at a
// boundary. Points:
//
//	step:ID:before-checkpoint, step:ID:after-checkpoint   Do (after-checkpoint also Notify)
//	step:ID:after-intent, step:ID:before-result           Call (around the outside call)
//	step:ID:before-commit, step:ID:after-commit           Apply, same store (inside and after the transaction)
//	step:ID:after-plan, step:ID:after-apply               Apply, separate store
//	step:NAME#N:before-commit, step:NAME#N:after-commit   ForEach chunk N (0-based within the attempt)
//	step:NAME#N:after-plan, step:NAME:after-apply         ForEach, separate store
//	run:before-finish                                     after the last step, before the run is marked
//
// Unset, it costs one string comparison.
const CrashEnv = "STEPWISE_CRASH_AT"

// PauseEnv names the environment variable that selects a pause point: at
// the point it names (one of CrashEnv's), the process stops itself with
// SIGSTOP, and goes on where it stopped when sent SIGCONT. Tests use it to
// freeze a runner past its lease (a long GC pause, a suspended VM) and
// check what it does when it wakes.
const PauseEnv = "STEPWISE_PAUSE_AT"

var (
	crashAt = os.Getenv(CrashEnv)
	pauseAt = os.Getenv(PauseEnv)
)

// Crash kills the process with SIGKILL if point is the selected crash
// point, or stops it with SIGSTOP if point is the selected pause point.
func Crash(point string) {
	if pauseAt != "" && pauseAt == point {
		pause()
	}
	if crashAt == "" || crashAt != point {
		return
	}
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is not deliverable late; never return
}

// crashStep is Crash for a step boundary, building the point's name only
// when a crash or pause point is set.
func crashStep(id, where string) {
	if crashAt != "" || pauseAt != "" {
		Crash("step:" + id + ":" + where)
	}
}
