package steps_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/steps"
)

func TestCallOutcomeUnknown(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	sent := map[string]int{} // the outside system, by idempotency key

	run := beginEffects(t, st, "pay/2026-11-28")
	_, err := steps.Call(ctx, run, "pay/T-1", func(ctx context.Context, key string) (string, error) {
		if key != steps.IdempotencyKey(ctx) || key != "pay/2026-11-28/pay/T-1" {
			t.Errorf("key %q, context key %q", key, steps.IdempotencyKey(ctx))
		}
		sent[key]++
		return "", steps.OutcomeUnknown(errors.New("connection dropped after sending"))
	})
	var unk *steps.OutcomeUnknownError
	if !errors.As(err, &unk) || unk.RunID != "pay/2026-11-28" || unk.Step != "pay/T-1" || unk.Key != "pay/2026-11-28/pay/T-1" ||
		unk.Reconcilable || !strings.Contains(unk.Cause, "connection dropped after sending") {
		t.Fatalf("err = %#v, want an OutcomeUnknownError with the run, step, key and cause, not reconcilable", err)
	}
	// A library error says what is true and names no command.
	if msg := err.Error(); !strings.Contains(msg, "has no reconcile function") || !strings.Contains(msg, "pay/2026-11-28/pay/T-1") ||
		strings.Contains(msg, "stepwise") {
		t.Errorf("message %q: want it to say there is no reconcile function, name the key, and name no command", msg)
	}
	// A rerun without a reconcile function stops again without calling.
	run2 := beginEffects(t, st, "pay/2026-11-28")
	_, err = steps.Call(ctx, run2, "pay/T-1", func(ctx context.Context, key string) (string, error) {
		sent[key]++
		return "again", nil
	})
	if !errors.As(err, &unk) || sent["pay/2026-11-28/pay/T-1"] != 1 {
		t.Fatalf("rerun without reconcile: err %v, calls %d; want a stop and no second call", err, sent["pay/2026-11-28/pay/T-1"])
	}
	// With a reconcile function that finds it, the step completes without calling.
	run3 := beginEffects(t, st, "pay/2026-11-28")
	out, err := steps.Call(ctx, run3, "pay/T-1", func(ctx context.Context, key string) (string, error) {
		sent[key]++
		return "again", nil
	}, steps.Reconcile(func(ctx context.Context, key string) (any, bool, error) {
		return "receipt-" + key, sent[key] > 0, nil
	}))
	if err != nil || out != "receipt-pay/2026-11-28/pay/T-1" || sent["pay/2026-11-28/pay/T-1"] != 1 {
		t.Fatalf("reconciled: %q, %v, calls %d", out, err, sent["pay/2026-11-28/pay/T-1"])
	}
}

func TestCallReconcileNotFoundCallsAgainAndResolve(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	run := beginEffects(t, st, "pay/d")
	_, err := steps.Call(ctx, run, "a", func(ctx context.Context, key string) (int, error) {
		<-ctx.Done() // the provider hangs: a timeout leaves the outcome unknown
		return 0, ctx.Err()
	}, steps.Timeout(time.Millisecond))
	var unk *steps.OutcomeUnknownError
	if !errors.As(err, &unk) {
		t.Fatalf("timeout: %v, want outcome unknown", err)
	}
	run2 := beginEffects(t, st, "pay/d")
	calls := 0
	out, err := steps.Call(ctx, run2, "a", func(ctx context.Context, key string) (int, error) {
		calls++
		return 42, nil
	}, steps.Reconcile(func(ctx context.Context, key string) (any, bool, error) { return nil, false, nil }))
	if err != nil || out != 42 || calls != 1 {
		t.Fatalf("not found then called: %d, %v, calls %d", out, err, calls)
	}

	// resolve --as done settles an unknown outcome with an operator's output.
	_, err = steps.Call(ctx, run2, "b", func(ctx context.Context, key string) (int, error) {
		return 0, steps.OutcomeUnknown(errors.New("lost"))
	})
	if !errors.As(err, &unk) {
		t.Fatal(err)
	}
	a := checkpoint.Audit{RunID: "pay/d", At: time.Now(), Operator: "ops", Command: "resolve", Reason: "seen in provider"}
	if err := st.ResolveStep(ctx, a, time.Now().Add(2*time.Minute), "b", true, []byte("7")); err != nil {
		t.Fatal(err)
	}
	if err := st.ResolveStep(ctx, a, time.Now().Add(2*time.Minute), "b", true, []byte("7")); !errors.Is(err, checkpoint.ErrNotUnknown) {
		t.Fatalf("resolving twice: %v, want ErrNotUnknown", err)
	}
	run3 := beginEffects(t, st, "pay/d")
	out, err = steps.Call(ctx, run3, "b", func(ctx context.Context, key string) (int, error) {
		t.Error("resolved step called again")
		return 0, nil
	})
	if err != nil || out != 7 {
		t.Fatalf("after resolve done: %d, %v", out, err)
	}
}
