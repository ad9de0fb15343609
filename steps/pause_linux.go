package steps

import (
	"runtime"
	"syscall"
)

// pause stops the process with SIGSTOP before it runs another instruction
// of the caller. The signal is sent to the calling thread (tgkill), which
// then stops the whole process on its way out of the system call; sent to
// the process (kill), another thread would take it and the caller could
// run on for milliseconds (a commit, an outside call) before it stopped.
func pause() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	syscall.Tgkill(syscall.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}
