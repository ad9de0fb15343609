package steps

import (
	"os"
	"syscall"
)

// CrashEnv names the environment variable that selects a crash point. When
// it equals a point passed to Crash, the process kills itself with SIGKILL at
// that point: crash tests use it to stop a real runner exactly at a
// boundary. Points are "step:ID:before-checkpoint", "step:ID:after-checkpoint"
// and "run:before-finish". Unset, it costs one string comparison.
const CrashEnv = "STEPWISE_CRASH_AT"

var crashAt = os.Getenv(CrashEnv)

// Crash kills the process with SIGKILL if point is the selected crash point.
func Crash(point string) {
	if crashAt == "" || crashAt != point {
		return
	}
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is not deliverable late; never return
}

// crashStep is Crash for a step boundary, building the point's name only
// when a crash point is set.
func crashStep(id, where string) {
	if crashAt != "" {
		Crash("step:" + id + ":" + where)
	}
}
