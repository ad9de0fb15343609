package steps_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/steps"
)

// errSelfFenced stands for the cause a runner cancels an attempt's context
// with when it could not renew its lease in time.
var errSelfFenced = errors.New("test: lease could not be renewed")

// Once the attempt's context is cancelled (a runner fencing itself, say),
// an outside call in flight sees it, with its cause, and is left outcome
// unknown; no further outside call starts, and nothing is called.
func TestCallStopsOnCancelledContext(t *testing.T) {
	st := checkpointtest.Open(t)
	run := beginEffects(t, st, "pay/d")
	ctx, cancel := context.WithCancelCause(context.Background())

	calls := map[string]int{}
	var seen error
	_, err := steps.Call(ctx, run, "in-flight", func(ctx context.Context, key string) (int, error) {
		calls[key]++
		cancel(errSelfFenced) // the runner fences itself while the provider works
		<-ctx.Done()
		seen = context.Cause(ctx)
		return 0, ctx.Err()
	})
	var unk *steps.OutcomeUnknownError
	if !errors.Is(seen, errSelfFenced) {
		t.Errorf("the call's context ended with %v; want the attempt's cause", seen)
	}
	if !errors.As(err, &unk) {
		t.Errorf("a call cut off by the cancellation: %v; want *steps.OutcomeUnknownError (it may have happened)", err)
	}

	_, err = steps.Call(ctx, run, "next", func(ctx context.Context, key string) (int, error) {
		calls[key]++
		return 1, nil
	})
	if !errors.Is(err, steps.ErrInterrupted) || !errors.Is(err, errSelfFenced) {
		t.Errorf("a call after the cancellation: %v; want steps.ErrInterrupted with the cause", err)
	}
	if calls["pay/d/in-flight"] != 1 || calls["pay/d/next"] != 0 {
		t.Errorf("outside calls = %v; want in-flight once, next never", calls)
	}
	var recorded []string
	if err := st.Steps(context.Background(), "pay/d", func(s checkpoint.Step) error {
		recorded = append(recorded, s.ID+":"+s.Status)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(recorded) != 1 || recorded[0] != "in-flight:"+checkpoint.StepCalling {
		t.Errorf("recorded steps = %v; want only in-flight, its outcome unknown (calling)", recorded)
	}
}
