package steps_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/steps"
)

const doRunID = "report/2026-11-28"

var doNow = time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)

// doAttempt is one claim of the test run and its steps.Run.
type doAttempt struct {
	st    checkpoint.Backend
	lease checkpoint.Lease
	run   *steps.Run
	now   time.Time
}

// firstAttempt claims the test run in a fresh store and begins its steps.
func firstAttempt(t *testing.T) *doAttempt {
	t.Helper()
	return beginAttempt(t, checkpointtest.Open(t), doNow)
}

func beginAttempt(t *testing.T, st checkpoint.Backend, now time.Time) *doAttempt {
	t.Helper()
	c, err := st.Claim(context.Background(), checkpoint.ClaimRequest{
		RunID: doRunID, Job: "report", RunKey: "2026-11-28", Params: []byte(`{}`), ParamsHash: "h",
		Owner: "test:1", Now: now, LeaseFor: time.Minute,
	})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	run, err := steps.Begin(context.Background(), steps.Config{
		Store: st, Lease: c.Lease, Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	return &doAttempt{st: st, lease: c.Lease, run: run, now: now}
}

// rerun ends this attempt as failed and starts the next one, as an
// operator's rerun would.
func (a *doAttempt) rerun(t *testing.T) *doAttempt {
	t.Helper()
	if err := a.st.Finish(context.Background(), a.lease, checkpoint.Ending{Status: checkpoint.RunFailed, At: a.now}); err != nil {
		t.Fatalf("finish attempt %d: %v", a.lease.Attempt, err)
	}
	return beginAttempt(t, a.st, a.now.Add(time.Hour))
}

func (a *doAttempt) steps(t *testing.T) map[string]checkpoint.Step {
	t.Helper()
	out := map[string]checkpoint.Step{}
	if err := a.st.Steps(context.Background(), doRunID, func(s checkpoint.Step) error {
		out[s.ID] = s
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// counted returns a step function that counts its calls and returns v.
func countedStep[T any](calls *int, v T, err error) func(context.Context) (T, error) {
	return func(context.Context) (T, error) {
		*calls++
		return v, err
	}
}

func TestDoRunsOnceAndRerunSkips(t *testing.T) {
	ctx := context.Background()
	a := firstAttempt(t)
	calls := 0
	got, err := steps.Do(ctx, a.run, steps.ID("load"), countedStep(&calls, []int{1, 2, 3}, nil))
	if err != nil || calls != 1 || len(got) != 3 || got[2] != 3 {
		t.Fatalf("first Do = %v, %v after %d calls; want [1 2 3] after 1 call", got, err, calls)
	}
	if s := a.run.Stats(); s != (steps.Stats{Executed: 1}) {
		t.Errorf("first attempt stats = %+v; want 1 executed", s)
	}
	cp := a.steps(t)["load"]
	if cp.Status != checkpoint.StepCompleted || string(cp.Output) != `[1,2,3]` || cp.Tries != 1 || cp.Attempt != 1 || !cp.StartedAt.Equal(doNow) {
		t.Errorf("checkpoint = %+v; want completed [1,2,3], tries 1, attempt 1, started %s", cp, doNow)
	}

	b := a.rerun(t)
	got, err = steps.Do(ctx, b.run, steps.ID("load"), countedStep(&calls, []int{9}, nil))
	if err != nil || calls != 1 {
		t.Fatalf("rerun Do: err %v, %d calls; want the function not called", err, calls)
	}
	if len(got) != 3 || got[0] != 1 || got[2] != 3 {
		t.Errorf("rerun Do = %v; want the recorded [1 2 3]", got)
	}
	if s := b.run.Stats(); s != (steps.Stats{Skipped: 1}) {
		t.Errorf("rerun stats = %+v; want 1 skipped", s)
	}
	if b.run.Attempt() != 2 || b.run.ID() != doRunID {
		t.Errorf("rerun run = %s attempt %d; want %s attempt 2", b.run.ID(), b.run.Attempt(), doRunID)
	}
}

type withHidden struct {
	Visible string
	hidden  string
	Nested  struct{ N int64 }
}

func TestDoReturnsDecodedOutputBothTimes(t *testing.T) {
	ctx := context.Background()
	a := firstAttempt(t)
	in := withHidden{Visible: "v", hidden: "h"}
	in.Nested.N = 1 << 60
	first, err := steps.Do(ctx, a.run, steps.ID("load"), func(context.Context) (withHidden, error) { return in, nil })
	if err != nil {
		t.Fatal(err)
	}
	want := withHidden{Visible: "v"}
	want.Nested.N = 1 << 60
	if first != want {
		t.Errorf("first attempt output = %+v; want %+v (decoded from JSON: unexported field dropped)", first, want)
	}
	b := a.rerun(t)
	second, err := steps.Do(ctx, b.run, steps.ID("load"), func(context.Context) (withHidden, error) {
		t.Error("step function called on rerun")
		return withHidden{}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if second != first {
		t.Errorf("rerun output = %+v; first attempt saw %+v", second, first)
	}

	// The pointer-shaped output decodes to a fresh value too.
	p, err := steps.Do(ctx, b.run, steps.ID("ptr"), func(context.Context) (*withHidden, error) { return &in, nil })
	if err != nil {
		t.Fatal(err)
	}
	if p == &in || p.hidden != "" || p.Visible != "v" {
		t.Errorf("pointer output = %p %+v; want a new value decoded from JSON", p, p)
	}
}

func inputHash(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func TestDoStepChanged(t *testing.T) {
	ctx := context.Background()
	a := firstAttempt(t)
	type in struct{ Date string }
	calls := 0
	if _, err := steps.Do(ctx, a.run, steps.ID("load"), countedStep(&calls, 1, nil), steps.Input(in{"2026-11-28"})); err != nil {
		t.Fatal(err)
	}
	if got := a.steps(t)["load"].InputHash; got != inputHash(t, in{"2026-11-28"}) {
		t.Errorf("recorded input hash = %s; want sha256 of the input's JSON", got)
	}

	b := a.rerun(t)
	// Same input: skipped.
	if _, err := steps.Do(ctx, b.run, steps.ID("load"), countedStep(&calls, 2, nil), steps.Input(in{"2026-11-28"})); err != nil || calls != 1 {
		t.Fatalf("rerun with the same input: err %v, calls %d; want skipped", err, calls)
	}

	c := b.rerun(t)
	_, err := steps.Do(ctx, c.run, steps.ID("load"), countedStep(&calls, 3, nil), steps.Input(in{"2026-11-29"}))
	var changed *steps.StepChangedError
	if !errors.As(err, &changed) {
		t.Fatalf("rerun with another input: err = %v; want *StepChangedError", err)
	}
	oldH, newH := inputHash(t, in{"2026-11-28"}), inputHash(t, in{"2026-11-29"})
	if changed.Step != "load" || changed.RunID != doRunID || changed.Old != oldH || changed.New != newH {
		t.Errorf("changed = %+v; want step load, old %s, new %s", changed, oldH, newH)
	}
	for _, want := range []string{"load", oldH[:12], newH[:12]} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if calls != 1 {
		t.Errorf("step function called %d times; want 1", calls)
	}

	// Dropping the input is a change too.
	d := c.rerun(t)
	if _, err := steps.Do(ctx, d.run, steps.ID("load"), countedStep(&calls, 4, nil)); !errors.As(err, &changed) || changed.New != "" {
		t.Errorf("rerun without input: err = %v; want *StepChangedError with an empty new hash", err)
	}
	if got := d.steps(t)["load"]; got.InputHash != oldH || string(got.Output) != "1" {
		t.Errorf("checkpoint after refused reruns = %+v; want it unchanged", got)
	}
}

func TestDoDuplicateStep(t *testing.T) {
	ctx := context.Background()
	a := firstAttempt(t)
	calls := 0
	if _, err := steps.Do(ctx, a.run, steps.ID("post", "T-1"), countedStep(&calls, 1, nil)); err != nil {
		t.Fatal(err)
	}
	_, err := steps.Do(ctx, a.run, steps.ID("post", "T-1"), countedStep(&calls, 2, nil))
	if !errors.Is(err, steps.ErrDuplicateStep) || !strings.Contains(err.Error(), "post/T-1") {
		t.Fatalf("second Do of post/T-1: err = %v; want ErrDuplicateStep naming it", err)
	}
	if calls != 1 {
		t.Errorf("step function called %d times; want 1", calls)
	}
	// Another key is another step.
	if _, err := steps.Do(ctx, a.run, steps.ID("post", "T-2"), countedStep(&calls, 3, nil)); err != nil {
		t.Errorf("Do of post/T-2: %v", err)
	}
	// A failed step counts as used too.
	if _, err := steps.Do(ctx, a.run, steps.ID("flaky"), countedStep(&calls, 0, errors.New("boom"))); err == nil {
		t.Fatal("want the failing step's error")
	}
	if _, err := steps.Do(ctx, a.run, steps.ID("flaky"), countedStep(&calls, 0, nil)); !errors.Is(err, steps.ErrDuplicateStep) {
		t.Errorf("retrying a failed step in the same attempt: err = %v; want ErrDuplicateStep", err)
	}
}

func TestDoInvalidID(t *testing.T) {
	ctx := context.Background()
	a := firstAttempt(t)
	for _, id := range []string{"", "has space", "post#1", "a//b", strings.Repeat("x", steps.MaxIDLength+1)} {
		calls := 0
		_, err := steps.Do(ctx, a.run, id, countedStep(&calls, 1, nil))
		if !errors.Is(err, steps.ErrInvalidID) {
			t.Errorf("Do(%.20q): err = %v; want ErrInvalidID", id, err)
		}
		if calls != 0 {
			t.Errorf("Do(%.20q) called the step function", id)
		}
	}
	if got := a.steps(t); len(got) != 0 {
		t.Errorf("invalid IDs recorded %v", got)
	}
}

func TestDoRejectIsPinned(t *testing.T) {
	ctx := context.Background()
	a := firstAttempt(t)
	errFunds := errors.New("insufficient funds on acct:42")
	calls := 0
	_, err := steps.Do(ctx, a.run, steps.ID("post", "T-7"), countedStep(&calls, 0, steps.Reject(errFunds)))
	var rej *steps.RejectedError
	if !errors.As(err, &rej) || rej.Step != "post/T-7" || rej.Reason != errFunds.Error() {
		t.Fatalf("rejecting step: err = %v; want *RejectedError for post/T-7 with the reason", err)
	}
	if !errors.Is(err, errFunds) {
		t.Errorf("first rejection does not unwrap to the job's error")
	}
	cp := a.steps(t)["post/T-7"]
	if cp.Status != checkpoint.StepRejected || cp.Error != errFunds.Error() {
		t.Errorf("checkpoint = %+v; want rejected with the reason", cp)
	}

	b := a.rerun(t)
	_, err = steps.Do(ctx, b.run, steps.ID("post", "T-7"), countedStep(&calls, 100, nil))
	if !errors.As(err, &rej) || rej.Reason != errFunds.Error() || rej.Step != "post/T-7" {
		t.Fatalf("rerun of a rejected step: err = %v; want the same *RejectedError", err)
	}
	if calls != 1 {
		t.Errorf("step function called %d times; want once (the rejection is pinned)", calls)
	}
	if errors.Unwrap(err) != nil {
		t.Errorf("a rejection read back from its checkpoint unwraps to %v; want nil", errors.Unwrap(err))
	}
	if s := b.run.Stats(); s.Skipped != 1 || s.Executed != 0 {
		t.Errorf("rerun stats = %+v; want 1 skipped", s)
	}
	if steps.Reject(nil) != nil {
		t.Errorf("Reject(nil) != nil")
	}
}

func TestDoFailureIsRetriedByRerun(t *testing.T) {
	ctx := context.Background()
	a := firstAttempt(t)
	boom := errors.New("connection reset")
	calls := 0
	_, err := steps.Do(ctx, a.run, steps.ID("load"), countedStep(&calls, 0, boom))
	var se *steps.StepError
	if !errors.As(err, &se) || se.Step != "load" || !errors.Is(err, boom) {
		t.Fatalf("failing step: err = %v; want *StepError for load wrapping the cause", err)
	}
	cp := a.steps(t)["load"]
	if cp.Status != checkpoint.StepFailed || cp.Tries != 1 || cp.Error != boom.Error() {
		t.Errorf("checkpoint = %+v; want failed, tries 1, the error", cp)
	}
	if s := a.run.Stats(); s != (steps.Stats{Failed: 1}) {
		t.Errorf("stats = %+v; want 1 failed", s)
	}

	b := a.rerun(t)
	got, err := steps.Do(ctx, b.run, steps.ID("load"), countedStep(&calls, 7, nil))
	if err != nil || got != 7 || calls != 2 {
		t.Fatalf("rerun: %v, %v after %d calls; want 7 after the function ran again", got, err, calls)
	}
	cp = b.steps(t)["load"]
	if cp.Status != checkpoint.StepCompleted || cp.Tries != 2 || cp.Error != "" || cp.Attempt != 2 {
		t.Errorf("checkpoint after rerun = %+v; want completed, tries 2, attempt 2", cp)
	}
}

func TestDoCancelledContextInterrupts(t *testing.T) {
	a := firstAttempt(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	if _, err := steps.Do(ctx, a.run, steps.ID("load"), func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	stop := errors.New("SIGTERM")
	cancel(stop)
	calls := 0
	_, err := steps.Do(ctx, a.run, steps.ID("post"), countedStep(&calls, 1, nil))
	if !errors.Is(err, steps.ErrInterrupted) || !errors.Is(err, stop) || !strings.Contains(err.Error(), "post") {
		t.Fatalf("Do after cancel: err = %v; want ErrInterrupted naming the step and the cause", err)
	}
	if calls != 0 {
		t.Errorf("step function called after cancel")
	}
	if _, ok := a.steps(t)["post"]; ok {
		t.Errorf("interrupted step was recorded")
	}
}

func TestDoKeepsResultOfStepFinishingDuringCancel(t *testing.T) {
	a := firstAttempt(t)
	ctx, cancel := context.WithCancel(context.Background())
	got, err := steps.Do(ctx, a.run, steps.ID("upload"), func(context.Context) (string, error) {
		cancel() // the signal arrives while the step finishes
		return "file-0042", nil
	})
	if err != nil || got != "file-0042" {
		t.Fatalf("step finishing during cancel = %q, %v; want its result", got, err)
	}
	_, err = steps.Do(ctx, a.run, steps.ID("post", "T-7"), func(context.Context) (int, error) {
		t.Error("step started after cancel")
		return 0, nil
	})
	if !errors.Is(err, steps.ErrInterrupted) {
		t.Errorf("next step: err = %v; want ErrInterrupted", err)
	}

	// A rejection decided while the run is cancelled is pinned all the same.
	ctx2, cancel2 := context.WithCancel(context.Background())
	_, err = steps.Do(ctx2, a.run, steps.ID("debit"), func(context.Context) (int, error) {
		cancel2()
		return 0, steps.Reject(errors.New("account closed"))
	})
	var rej *steps.RejectedError
	if !errors.As(err, &rej) {
		t.Errorf("rejection during cancel: err = %v; want *RejectedError", err)
	}

	cps := a.steps(t)
	if cp := cps["upload"]; cp.Status != checkpoint.StepCompleted || string(cp.Output) != `"file-0042"` {
		t.Errorf("upload checkpoint = %+v; want completed with its output", cp)
	}
	if cp := cps["debit"]; cp.Status != checkpoint.StepRejected || cp.Error != "account closed" {
		t.Errorf("debit checkpoint = %+v; want rejected", cp)
	}
	b := a.rerun(t)
	if got, err := steps.Do(context.Background(), b.run, steps.ID("upload"), func(context.Context) (string, error) {
		t.Error("upload ran again")
		return "", nil
	}); err != nil || got != "file-0042" {
		t.Errorf("rerun upload = %q, %v; want the recorded file-0042", got, err)
	}
}

func TestDoAfterTakeoverIsFenced(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.Open(t)
	a := beginAttempt(t, st, doNow)
	// Another runner takes the run over after a's lease expired.
	if _, err := st.Claim(ctx, checkpoint.ClaimRequest{
		RunID: doRunID, Job: "report", RunKey: "2026-11-28", Params: []byte(`{}`), ParamsHash: "h",
		Owner: "other:2", Now: doNow.Add(2 * time.Minute), LeaseFor: time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
	calls := 0
	_, err := steps.Do(ctx, a.run, steps.ID("load"), countedStep(&calls, 1, nil))
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("completed step after takeover: err = %v; want checkpoint.ErrFenced", err)
	}
	_, err = steps.Do(ctx, a.run, steps.ID("post"), countedStep(&calls, 0, errors.New("boom")))
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("failed step after takeover: err = %v; want checkpoint.ErrFenced", err)
	}
	_, err = steps.Do(ctx, a.run, steps.ID("reject"), countedStep(&calls, 0, steps.Reject(errors.New("no"))))
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("rejected step after takeover: err = %v; want checkpoint.ErrFenced", err)
	}
	if got := a.steps(t); len(got) != 0 {
		t.Errorf("fenced attempt recorded %v", got)
	}
}

func TestDoConcurrentSteps(t *testing.T) {
	ctx := context.Background()
	a := firstAttempt(t)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			id := steps.ID("item", string(rune('a'+i)))
			if _, err := steps.Do(ctx, a.run, id, func(context.Context) (int, error) { return i, nil }); err != nil {
				t.Errorf("Do %s: %v", id, err)
			}
		})
	}
	wg.Wait()
	if s := a.run.Stats(); s.Executed != 8 {
		t.Errorf("stats = %+v; want 8 executed", s)
	}
	if got := a.steps(t); len(got) != 8 {
		t.Errorf("recorded %d steps; want 8", len(got))
	}
}

func TestBeginValidatesConfig(t *testing.T) {
	st := checkpointtest.Open(t)
	if _, err := steps.Begin(context.Background(), steps.Config{Lease: checkpoint.Lease{RunID: doRunID}}); err == nil {
		t.Error("Begin without a store: want an error")
	}
	if _, err := steps.Begin(context.Background(), steps.Config{Store: st}); err == nil {
		t.Error("Begin without a lease: want an error")
	}
}
