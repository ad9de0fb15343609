// Package crashtest runs a role of the current test binary in a real child
// process, so crash tests can kill it (SIGKILL at a named crash point,
// SIGSTOP at a pause point, or a signal of the test's choosing) and check
// what it left behind.
//
// It imports only steps (for the crash and pause point variables), so any
// test outside package steps' own internal tests can use it: steps_test,
// examples, cmd.
//
// A child role is either a test function that skips unless its variable
// is set (Spec.Test names it), or a TestMain (or init) that checks its
// variable before the tests run and reads its arguments with ChildArgs:
//
//	func TestMain(m *testing.M) {
//		if os.Getenv("STEPWISE_MY_CHILD") == "1" {
//			os.Exit(cmd.Execute(ctx, reg, crashtest.ChildArgs(), os.Stdout, os.Stderr))
//		}
//		os.Exit(m.Run())
//	}
//
//	c := crashtest.Start(t, crashtest.Spec{
//		Env:  []string{"STEPWISE_MY_CHILD=1", crashtest.CrashAt("step:post:after-plan")},
//		Args: []string{"run", "settle"},
//	})
//	c.WantKilled()
//
// The child's environment is the test's own without any STEPWISE_ variable
// (so a crash point set for the test does not leak into every child), plus
// Spec.Env, plus GORACE=atexit_sleep_ms=0 so a race-enabled child does not
// sleep a second before each exit, and PGAPPNAME set to a name of its own
// (Child.SessionName) so a test can find the child's PostgreSQL sessions.
package crashtest
