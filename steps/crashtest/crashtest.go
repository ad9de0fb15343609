package crashtest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/steps"
)

// DefaultTimeout is how long Wait and WaitFor wait for a child when
// Spec.Timeout is zero.
const DefaultTimeout = time.Minute

// argsMarker separates the test binary's own flags from the role's
// arguments; ChildArgs returns what follows it.
const argsMarker = "--"

// Spec says which role of the test binary a child runs and how.
type Spec struct {
	// Test names a test function the child runs alone
	// (-test.run=^Test$); that function is the role, and skips unless its
	// variable in Env is set. Empty: the binary's TestMain or an init
	// takes the role from Env before any test runs.
	Test string
	// Args are the role's arguments, passed after a "--" marker; the
	// child reads them with ChildArgs.
	Args []string
	// Env is added to the child's environment, after the test's own
	// without its STEPWISE_ variables.
	Env []string
	// Wrap is a command line the test binary runs under (e.g. unshare
	// ...): the binary and its arguments follow it.
	Wrap []string
	// Files become the child's file descriptors 3, 4, ...
	Files []*os.File
	// Argv0 is what the child sees as os.Args[0]. Defaults to the test
	// binary's path. It cannot be set with Wrap.
	Argv0 string
	// Timeout bounds Wait and WaitFor: past it the child is killed and
	// the test fails. It is also the child's -test.timeout when Test is
	// set. Defaults to DefaultTimeout.
	Timeout time.Duration
}

// CrashAt is the environment entry that makes a child kill itself with
// SIGKILL at point (see steps.CrashEnv for the points).
func CrashAt(point string) string { return steps.CrashEnv + "=" + point }

// PauseAt is the environment entry that makes a child stop itself with
// SIGSTOP at point (see steps.PauseEnv); Child.WaitStopped waits for it
// and Child.Signal(syscall.SIGCONT) lets it go on.
func PauseAt(point string) string { return steps.PauseEnv + "=" + point }

// ChildArgs returns, in a child, the role's arguments: those after the
// "--" marker Start puts before Spec.Args, or all of os.Args[1:] if there
// is none.
func ChildArgs() []string {
	args := os.Args[1:]
	if i := slices.Index(args, argsMarker); i >= 0 {
		return args[i+1:]
	}
	return args
}

// Exit is how a child ended: an exit code, or the signal that killed it.
type Exit struct {
	Code   int // -1 when a signal killed it
	Signal syscall.Signal
}

// Killed is the end of a child killed with SIGKILL, at a crash point or by
// the test.
var Killed = Exit{Code: -1, Signal: syscall.SIGKILL}

// Code is the end of a child that exited on its own with code.
func Code(code int) Exit { return Exit{Code: code} }

// String says how the child ended, for test failures.
func (e Exit) String() string {
	if e.Code < 0 {
		return fmt.Sprintf("killed by signal %d (%v)", int(e.Signal), e.Signal)
	}
	return fmt.Sprintf("exit code %d", e.Code)
}

// Child is a running (or ended) copy of the test binary started by Start.
// A child still running when its test ends is killed and reaped.
type Child struct {
	t       testing.TB
	cmd     *exec.Cmd
	args    []string // Spec.Args, for failure messages
	timeout time.Duration
	stdout  buffer
	stderr  buffer
	done    chan struct{}
	session string // PGAPPNAME in the child's environment
}

// sessionEnv is the variable libpq and pgx take a PostgreSQL session's
// application_name from when the connection string names none.
const sessionEnv = "PGAPPNAME"

// children numbers the children of this test binary, for session names.
var children atomic.Int64

// Start starts a child of the current test binary as s says, and fails the
// test if it cannot.
func Start(t testing.TB, s Spec) *Child {
	t.Helper()
	if s.Argv0 != "" && len(s.Wrap) > 0 {
		t.Fatalf("crashtest.Spec: Argv0 %q with Wrap %q: a wrapper sets its own command's argv[0]", s.Argv0, s.Wrap)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("find the test binary: %v", err)
	}
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	argv := append(slices.Clone(s.Wrap), exe)
	if s.Test != "" {
		argv = append(argv, "-test.run=^"+s.Test+"$", "-test.count=1", "-test.timeout="+timeout.String())
	}
	if len(s.Args) > 0 || s.Test == "" {
		argv = append(append(argv, argsMarker), s.Args...)
	}
	c := &Child{t: t, args: s.Args, timeout: timeout, done: make(chan struct{})}
	c.cmd = exec.Command(argv[0], argv[1:]...)
	if s.Argv0 != "" {
		c.cmd.Args[0] = s.Argv0
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "STEPWISE_") {
			c.cmd.Env = append(c.cmd.Env, kv)
		}
	}
	// The race detector sleeps a second before a process exits (to catch
	// late reports); children report races as they happen, and still exit 66.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	c.cmd.Env = append(c.cmd.Env, "GORACE="+gorace)
	// Every child's PostgreSQL sessions carry a name of their own, so a
	// test can tell when the server has ended those of a killed child.
	c.session = fmt.Sprintf("crashtest-%d-%d", os.Getpid(), children.Add(1))
	c.cmd.Env = append(append(c.cmd.Env, sessionEnv+"="+c.session), s.Env...)
	for _, kv := range s.Env {
		if v, ok := strings.CutPrefix(kv, sessionEnv+"="); ok {
			c.session = v
		}
	}
	c.cmd.Stdout, c.cmd.Stderr = &c.stdout, &c.stderr
	c.cmd.ExtraFiles = s.Files
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start child %q: %v", c.args, err)
	}
	go func() {
		c.cmd.Wait() // the exit status is read from ProcessState
		close(c.done)
	}()
	t.Cleanup(func() {
		if !c.Exited() {
			c.cmd.Process.Kill()
			<-c.done
		}
	})
	return c
}

// Run starts a child as s says and waits for its end.
func Run(t testing.TB, s Spec) (*Child, Exit) {
	t.Helper()
	c := Start(t, s)
	return c, c.Wait()
}

// Wait waits for the child to end and returns how it ended. The child is
// reaped, so its PID is free. A child that does not end within the
// timeout is killed and fails the test.
func (c *Child) Wait() Exit {
	c.t.Helper()
	select {
	case <-c.done:
	case <-time.After(c.timeout):
		c.cmd.Process.Kill()
		<-c.done
		c.t.Fatalf("child %q did not end within %s\n%s", c.args, c.timeout, c.Output())
	}
	ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok {
		c.t.Fatalf("child %q: no wait status (%T)", c.args, c.cmd.ProcessState.Sys())
	}
	if ws.Signaled() {
		return Exit{Code: -1, Signal: ws.Signal()}
	}
	return Exit{Code: ws.ExitStatus()}
}

// WaitWithin waits up to d for the child to end and returns how it ended;
// ok is false if it is still running.
func (c *Child) WaitWithin(d time.Duration) (e Exit, ok bool) {
	c.t.Helper()
	select {
	case <-c.done:
		return c.Wait(), true
	case <-time.After(d):
		return Exit{}, false
	}
}

// WantExit fails the test unless got, the child's end, is want, showing
// the child's output.
func (c *Child) WantExit(got, want Exit) {
	c.t.Helper()
	if got != want {
		c.t.Fatalf("child %q: got %s, want %s\n%s", c.args, got, want, c.Output())
	}
}

// WantKilled waits for the child and fails the test unless it died of
// SIGKILL, as a child does at its crash point: a clean exit means the
// point was never reached on the child's path.
func (c *Child) WantKilled() {
	c.t.Helper()
	got := c.Wait()
	if got == Code(0) {
		c.t.Fatalf("child %q ran to success: its crash point is never reached on this path (misnamed, or steps.Crash is not called with it)\n%s",
			c.args, c.Output())
	}
	c.WantExit(got, Killed)
}

// WantCode waits for the child and fails the test unless it exited with
// code.
func (c *Child) WantCode(code int) {
	c.t.Helper()
	c.WantExit(c.Wait(), Code(code))
}

// Done is closed when the child has ended.
func (c *Child) Done() <-chan struct{} { return c.done }

// Exited reports whether the child has ended.
func (c *Child) Exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Until polls cond every millisecond until it holds or the child ends,
// and reports whether it held. It fails the test if neither happens within
// the timeout.
func (c *Child) Until(cond func() bool) bool {
	c.t.Helper()
	return c.until("the condition", cond)
}

// WaitFor polls cond until it holds; it fails the test, naming what, if
// the child ends first or it takes longer than the timeout.
func (c *Child) WaitFor(what string, cond func() bool) {
	c.t.Helper()
	if !c.until(what, cond) {
		c.t.Fatalf("child %q ended (%s) before %s\n%s", c.args, c.Wait(), what, c.Output())
	}
}

func (c *Child) until(what string, cond func() bool) bool {
	c.t.Helper()
	deadline := time.Now().Add(c.timeout)
	for !cond() {
		if c.Exited() {
			return cond()
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("child %q did not reach %s within %s\n%s", c.args, what, c.timeout, c.Output())
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// Stopped reports whether the child is stopped (SIGSTOP, as at a pause
// point). It reads /proc, so it is always false where there is none.
func (c *Child) Stopped() bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(c.Pid()) + "/stat")
	if err != nil {
		return false
	}
	// "pid (comm) S ...": the state follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't')
}

// WaitStopped waits until the child is stopped at its pause point; it
// fails the test if the child ends first or takes too long.
func (c *Child) WaitStopped() {
	c.t.Helper()
	c.WaitFor("it stopped at its pause point", c.Stopped)
}

// Signal sends sig to the child.
func (c *Child) Signal(sig os.Signal) error { return c.cmd.Process.Signal(sig) }

// Kill kills the child with SIGKILL, as a crash or kill -9 would.
func (c *Child) Kill() error { return c.cmd.Process.Kill() }

// SessionName is the application_name of the child's PostgreSQL sessions:
// Start sets PGAPPNAME in the child's environment to a name no other
// child of this test binary has (Spec.Env may set its own), and the
// sessions take it unless the connection URL names another. After a
// SIGKILL the server may still be running what the child sent before it
// died, a COMMIT included; pgtest.WaitSessionsGone waits until the
// sessions with this name have ended, so that what the test reads next is
// all the child will ever have written.
func (c *Child) SessionName() string { return c.session }

// Pid is the child's process ID (of the wrapper, with Spec.Wrap).
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Stdout is what the child has written to its standard output so far.
func (c *Child) Stdout() string { return c.stdout.String() }

// Stderr is what the child has written to its standard error so far.
func (c *Child) Stderr() string { return c.stderr.String() }

// Output is the child's standard output and error so far, labelled, for
// test failures.
func (c *Child) Output() string {
	return "stdout:\n" + c.Stdout() + "\nstderr:\n" + c.Stderr()
}

// buffer is a bytes.Buffer the child's output goroutine writes while the
// test reads it.
type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
