package crashtest_test

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stepwise-run/stepwise/steps"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// roleEnv selects what TestRole does in a child: "crash" and "pause" pass
// through steps.Crash at rolePoint, "exit" exits with the code in its
// first argument, "echo" prints its arguments, argv[0] and the variable
// leakEnv, "session" the variable PGAPPNAME.
const (
	roleEnv   = "STEPWISE_CRASHTEST_ROLE"
	leakEnv   = "STEPWISE_CRASHTEST_LEAK"
	rolePoint = "crashtest:point"
)

func TestRole(t *testing.T) {
	role := os.Getenv(roleEnv)
	if role == "" {
		t.Skip("helper process for the crashtest tests")
	}
	args := crashtest.ChildArgs()
	switch role {
	case "crash", "pause":
		steps.Crash(rolePoint)
		fmt.Println("went on past", rolePoint)
	case "exit":
		code, err := strconv.Atoi(args[0])
		if err != nil {
			t.Fatal(err)
		}
		os.Exit(code)
	case "echo":
		fmt.Printf("args=%s argv0=%s leak=%q\n", strings.Join(args, ","), os.Args[0], os.Getenv(leakEnv))
	case "session":
		fmt.Printf("PGAPPNAME=%q\n", os.Getenv("PGAPPNAME"))
	default:
		t.Fatalf("unknown role %q", role)
	}
}

func role(name string, env ...string) crashtest.Spec {
	return crashtest.Spec{Test: "TestRole", Env: append([]string{roleEnv + "=" + name}, env...)}
}

func TestCrashPointKillsTheChild(t *testing.T) {
	t.Parallel()
	c := crashtest.Start(t, role("crash", crashtest.CrashAt(rolePoint)))
	c.WantKilled()
	if strings.Contains(c.Stdout(), "went on") {
		t.Errorf("the child went on past its crash point:\n%s", c.Output())
	}
}

func TestChildWithoutItsCrashPointExitsCleanly(t *testing.T) {
	t.Parallel()
	c := crashtest.Start(t, role("crash", crashtest.CrashAt("crashtest:elsewhere")))
	c.WantCode(0)
	if !strings.Contains(c.Stdout(), "went on past "+rolePoint) {
		t.Errorf("stdout = %q, want the child to go on past %s", c.Stdout(), rolePoint)
	}
}

func TestExitCodeAndArgs(t *testing.T) {
	t.Parallel()
	s := role("exit")
	s.Args = []string{"7"}
	c, got := crashtest.Run(t, s)
	if got != crashtest.Code(7) {
		t.Fatalf("got %s, want exit code 7\n%s", got, c.Output())
	}
	if got.String() != "exit code 7" || crashtest.Killed.String() != "killed by signal 9 (killed)" {
		t.Errorf("Exit strings: %q, %q", got, crashtest.Killed)
	}
}

// The test's own STEPWISE_ variables (a crash point set for the whole
// test run, say) must not reach a child; Spec.Env does.
func TestChildEnvironment(t *testing.T) {
	t.Setenv(leakEnv, "from the test")
	s := role("echo")
	s.Args = []string{"a", "--b"}
	s.Argv0 = "/opt/bin/mytool"
	c, got := crashtest.Run(t, s)
	c.WantExit(got, crashtest.Code(0))
	if want := `args=a,--b argv0=/opt/bin/mytool leak=""`; !strings.Contains(c.Stdout(), want) {
		t.Errorf("stdout = %q, want it to contain %q", c.Stdout(), want)
	}
	s.Env = append(s.Env, leakEnv+"=given")
	c, got = crashtest.Run(t, s)
	c.WantExit(got, crashtest.Code(0))
	if want := `leak="given"`; !strings.Contains(c.Stdout(), want) {
		t.Errorf("stdout = %q, want it to contain %q", c.Stdout(), want)
	}
}

// Each child's PostgreSQL sessions get a name no other child has, even
// when the test's own environment sets PGAPPNAME; Spec.Env may choose it.
func TestChildSessionName(t *testing.T) {
	t.Setenv("PGAPPNAME", "the-test")
	seen := map[string]bool{}
	for range 2 {
		c, got := crashtest.Run(t, role("session"))
		c.WantExit(got, crashtest.Code(0))
		name := c.SessionName()
		if want := fmt.Sprintf("PGAPPNAME=%q\n", name); !strings.HasPrefix(c.Stdout(), want) {
			t.Errorf("child's stdout = %q, want it to start with %q", c.Stdout(), want)
		}
		if !strings.HasPrefix(name, "crashtest-") || seen[name] {
			t.Errorf("session name %q: want crashtest-..., one per child (had %v)", name, seen)
		}
		seen[name] = true
	}
	c, got := crashtest.Run(t, role("session", "PGAPPNAME=chosen"))
	c.WantExit(got, crashtest.Code(0))
	if c.SessionName() != "chosen" || !strings.HasPrefix(c.Stdout(), "PGAPPNAME=\"chosen\"\n") {
		t.Errorf("with Spec.Env's PGAPPNAME=chosen: SessionName %q, child's stdout %q", c.SessionName(), c.Stdout())
	}
}

func TestPausePointStopsTheChildUntilSIGCONT(t *testing.T) {
	t.Parallel()
	c := crashtest.Start(t, role("pause", crashtest.PauseAt(rolePoint)))
	c.WaitStopped()
	if c.Exited() || strings.Contains(c.Stdout(), "went on") {
		t.Fatalf("the child did not stop at its pause point:\n%s", c.Output())
	}
	if err := c.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	c.WantCode(0)
	if !strings.Contains(c.Stdout(), "went on past "+rolePoint) {
		t.Errorf("stdout = %q, want the child to go on after SIGCONT", c.Stdout())
	}
}

func TestKillByTheTest(t *testing.T) {
	t.Parallel()
	c := crashtest.Start(t, role("pause", crashtest.PauseAt(rolePoint)))
	c.WaitStopped()
	if err := c.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	c.WantKilled()
}

// fatalT records a Fatalf and ends the goroutine, as testing.T does.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// failure runs check against a child started with s and returns the
// failure it reported, "" if none.
func failure(t *testing.T, s crashtest.Spec, check func(*crashtest.Child)) string {
	f := &fatalT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check(crashtest.Start(f, s))
	}()
	<-done
	return f.msg
}

// A crash test whose child never reaches its crash point, or fails on its
// own, must fail; so must a clean-exit check on a killed child.
func TestWantsFailOnTheWrongEnd(t *testing.T) {
	t.Parallel()
	exit3 := role("exit")
	exit3.Args = []string{"3"}
	for _, tc := range []struct {
		name  string
		spec  crashtest.Spec
		check func(*crashtest.Child)
		want  string
	}{
		{"killed, but the point is never reached", role("crash", crashtest.CrashAt("crashtest:elsewhere")),
			(*crashtest.Child).WantKilled, "ran to success: its crash point is never reached"},
		{"killed, but it failed", exit3, (*crashtest.Child).WantKilled, "got exit code 3, want killed by signal 9"},
		{"clean, but it crashed", role("crash", crashtest.CrashAt(rolePoint)),
			func(c *crashtest.Child) { c.WantCode(0) }, "got killed by signal 9 (killed), want exit code 0"},
		{"clean, but it exited 3", exit3, func(c *crashtest.Child) { c.WantCode(0) }, "got exit code 3, want exit code 0"},
	} {
		if got := failure(t, tc.spec, tc.check); !strings.Contains(got, tc.want) {
			t.Errorf("%s: failure %q, want it to say %q", tc.name, got, tc.want)
		}
	}
}
