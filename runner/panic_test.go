package runner_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// The panicking functions are named, so the test can look for them in the
// recorded stack.

func panicInStep(context.Context) (int, error) { panic("price feed returned nothing") }

func panicInItem(_ context.Context, item int, _ *steps.Effects) (int, error) {
	if item == 3 {
		var prices []int
		return prices[item], nil // a runtime error: index out of range
	}
	return item, nil
}

func panicInJob(n int) error {
	if n > 0 {
		panic(errors.New("job code bug"))
	}
	return nil
}

// A panic in job code, wherever it happens, fails the attempt with the
// panic value and the stack of the panicking function, and leaves the run
// resumable: the steps before it stay checkpointed.
func TestPanicFailsTheAttemptWithItsStack(t *testing.T) {
	for _, tc := range []struct {
		name      string
		body      func(ctx context.Context, run *steps.Run) error
		wantValue string // in the error and the recorded attempt error
		wantFunc  string // in the stack
		completed []string
	}{
		{"in a step", func(ctx context.Context, run *steps.Run) error {
			_, err := steps.Do(ctx, run, "price", panicInStep)
			return err
		}, "price feed returned nothing", "runner_test.panicInStep", []string{"load"}},
		{"in a batch item", func(ctx context.Context, run *steps.Run) error {
			_, err := steps.ForEach(ctx, run, "post", steps.Slice([]int{1, 2, 3, 4}, strconv.Itoa), panicInItem, steps.ChunkSize(2))
			return err
		}, "runtime error: index out of range [3] with length 0", "runner_test.panicInItem", []string{"load"}},
		{"outside any step", func(ctx context.Context, run *steps.Run) error {
			return panicInJob(1)
		}, "job code bug", "runner_test.panicInJob", []string{"load"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
				if err := h.step(ctx, run, "load"); err != nil {
					return err
				}
				return tc.body(ctx, run)
			}
			r := h.runner(nil)
			res, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
			var pe *runner.PanicError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v (%T); want a *runner.PanicError", err, err)
			}
			if pe.RunID != testRunID || !strings.Contains(err.Error(), tc.wantValue) {
				t.Errorf("panic error %q for run %q; want run %s and the value %q", err, pe.RunID, testRunID, tc.wantValue)
			}
			if !strings.Contains(string(pe.Stack), tc.wantFunc) {
				t.Errorf("stack does not name %s:\n%s", tc.wantFunc, pe.Stack)
			}
			if strings.Contains(string(pe.Stack), "runtime/debug.Stack") {
				t.Errorf("stack starts in the recovery, not at the panic:\n%s", pe.Stack)
			}
			if res.Status != checkpoint.RunFailed || res.Attempt != 1 {
				t.Errorf("result = %+v; want failed, attempt 1", res)
			}
			info := h.info()
			a := info.Attempts[0]
			if info.Run.Status != checkpoint.RunFailed || a.Status != checkpoint.RunFailed || info.Run.LeaseOwner != "" {
				t.Errorf("stored run %+v, attempt %+v; want both failed and the lease released", info.Run, a)
			}
			for _, want := range []string{"panic in job code: " + tc.wantValue, "goroutine ", tc.wantFunc} {
				if !strings.Contains(a.Error, want) {
					t.Errorf("attempt error lacks %q:\n%s", want, a.Error)
				}
			}
			var done []string
			for _, id := range []string{"load", "price", "post"} {
				if s, ok := h.steps()[id]; ok && s.Status == checkpoint.StepCompleted {
					done = append(done, id)
				}
			}
			if strings.Join(done, ",") != strings.Join(tc.completed, ",") {
				t.Errorf("completed steps %v; want %v", done, tc.completed)
			}

			// Fixed, the rerun resumes: load is skipped.
			h.body = func(ctx context.Context, run *steps.Run, p jobParams) error { return h.step(ctx, run, "load") }
			res, err = r.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
			if err != nil || res.Status != checkpoint.RunSucceeded || res.Attempt != 2 || res.Stats.Skipped != 1 {
				t.Errorf("rerun = %+v, %v; want succeeded in attempt 2 with load skipped", res, err)
			}
			if h.called("load") != 1 {
				t.Errorf("load ran %d times; want once", h.called("load"))
			}
		})
	}
}

// Two runs in one process (as under serve): one panics, the other goes on
// and succeeds.
func TestPanicLeavesOtherRunsRunning(t *testing.T) {
	h := newHarness(t)
	inside, release := make(chan struct{}), make(chan struct{})
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error {
		if p.Date == "2026-11-27" {
			return panicInJob(1)
		}
		_, err := steps.Do(ctx, run, "slow", func(context.Context) (string, error) {
			close(inside)
			<-release
			return "done", nil
		})
		return err
	}
	r := h.runner(nil)
	type outcome struct {
		res runner.Result
		err error
	}
	other := make(chan outcome, 1)
	go func() {
		res, err := r.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
		other <- outcome{res, err}
	}()
	<-inside
	_, err := r.Run(context.Background(), runner.Request{Job: "job", Values: map[string]string{"date": "2026-11-27"}})
	var pe *runner.PanicError
	if !errors.As(err, &pe) {
		t.Fatalf("panicking run: err = %v; want a *runner.PanicError", err)
	}
	close(release)
	o := <-other
	if o.err != nil || o.res.Status != checkpoint.RunSucceeded {
		t.Fatalf("the other run = %+v, %v; want succeeded", o.res, o.err)
	}
}

// A dry run recovers a panic too.
func TestPanicInDryRun(t *testing.T) {
	h := newHarness(t)
	h.body = func(ctx context.Context, run *steps.Run, p jobParams) error { return panicInJob(1) }
	_, err := h.runner(nil).Run(context.Background(), runner.Request{Job: "job", Values: testValues, DryRun: true})
	var pe *runner.PanicError
	if !errors.As(err, &pe) || !strings.Contains(string(pe.Stack), "runner_test.panicInJob") {
		t.Fatalf("dry run: err = %v; want a *runner.PanicError naming panicInJob", err)
	}
}

func (h *harness) steps() map[string]checkpoint.Step {
	h.t.Helper()
	out := map[string]checkpoint.Step{}
	err := h.st.Steps(context.Background(), testRunID, func(s checkpoint.Step) error {
		out[s.ID] = s
		return nil
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}
