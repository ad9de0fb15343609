package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

func testSteps(t *testing.T, h Harness) {
	t.Run("RecordedAsGiven", func(t *testing.T) { stepsRecordedAsGiven(t, h) })
	callerClock(t, h, "IdenticalContentAccepted", stepsIdenticalContentAccepted)
	t.Run("DifferentContentConflicts", func(t *testing.T) { stepsDifferentContentConflicts(t, h) })
	callerClock(t, h, "UnfinishedIsReplaced", stepsUnfinishedIsReplaced)
	t.Run("OrderOfStarting", func(t *testing.T) { stepsOrderOfStarting(t, h) })
	t.Run("TransactionIsAllOrNothing", func(t *testing.T) { stepsTransactionIsAllOrNothing(t, h) })
	t.Run("ResetStepKeepsItems", func(t *testing.T) { stepsResetStepKeepsItems(t, h) })
}

// stepsRecordedAsGiven is the Steps test RecordedAsGiven.
func stepsRecordedAsGiven(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	c := e.claim(a, "steps/1", ownerA, t0)
	want := checkpoint.Step{
		RunID: "steps/1", ID: "post/T-1001", Status: checkpoint.StepCompleted,
		Output: []byte(`{"posted":true}`), InputHash: "in-1", Error: "", Tries: 3, Attempt: c.Lease.Attempt,
		StartedAt: t0, FinishedAt: t0.Add(1500 * time.Millisecond), Plan: []byte(`{"writes":[]}`),
		Call: []byte(`{"key":"steps/1/post/T-1001"}`),
	}
	e.inTx(a, c.Lease, func(tx checkpoint.Tx) error { return tx.PutStep(want) })
	got := e.steps(b, "steps/1")["post/T-1001"]
	if !sameStep(got, want) {
		t.Errorf("recorded step = %+v; want %+v", got, want)
	}
}

// stepsIdenticalContentAccepted is the Steps test IdenticalContentAccepted.
func stepsIdenticalContentAccepted(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "steps/2", ownerA, t0)
	first := completed("load", `{"n":1}`)
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error { return tx.PutStep(first) })
	c2 := e.claim(st, "steps/2", ownerB, t0.Add(lease))
	// The same content from a later attempt (a commit whose
	// acknowledgement was lost, replayed): accepted, and the first
	// record stands.
	again := first
	again.Tries, again.StartedAt, again.FinishedAt = 9, t0.Add(time.Hour), t0.Add(2*time.Hour)
	e.inTx(st, c2.Lease, func(tx checkpoint.Tx) error { return tx.PutStep(again) })
	got := e.steps(st, "steps/2")["load"]
	first.RunID, first.Attempt = "steps/2", c.Lease.Attempt
	if !sameStep(got, first) {
		t.Errorf("step after the identical re-put = %+v; want the first record %+v unchanged", got, first)
	}
}

// stepsDifferentContentConflicts is the Steps test DifferentContentConflicts.
func stepsDifferentContentConflicts(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "steps/3", ownerA, t0)
	done := completed("load", `{"n":1}`)
	rejected := checkpoint.Step{ID: "check", Status: checkpoint.StepRejected, Error: "insufficient funds", InputHash: "in", StartedAt: t0, FinishedAt: t0}
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(done); err != nil {
			return err
		}
		return tx.PutStep(rejected)
	})
	for name, s := range map[string]checkpoint.Step{
		"other output":         func() checkpoint.Step { s := done; s.Output = []byte(`{"n":2}`); return s }(),
		"other input":          func() checkpoint.Step { s := done; s.InputHash = "changed"; return s }(),
		"failed over complete": func() checkpoint.Step { s := done; s.Status, s.Error = checkpoint.StepFailed, "boom"; return s }(),
		"other rejection":      func() checkpoint.Step { s := rejected; s.Error = "account closed"; return s }(),
		"success over reject":  func() checkpoint.Step { s := rejected; s.Status, s.Error = checkpoint.StepCompleted, ""; return s }(),
	} {
		err := st.InTx(e.ctx, c.Lease, func(tx checkpoint.Tx) error {
			if err := tx.PutStep(completed("side", `1`)); err != nil {
				return err
			}
			return tx.PutStep(s)
		})
		var sc *checkpoint.StepConflictError
		if !errors.As(err, &sc) {
			t.Errorf("%s: %v; want *StepConflictError", name, err)
			continue
		}
		if sc.RunID != "steps/3" || sc.StepID != s.ID {
			t.Errorf("%s: StepConflictError = %+v; want run steps/3, step %s", name, sc, s.ID)
		}
	}
	got := e.steps(st, "steps/3")
	if _, ok := got["side"]; ok {
		t.Errorf("a step written in a transaction that failed with a conflict is visible")
	}
	if string(got["load"].Output) != `{"n":1}` || got["check"].Error != "insufficient funds" || got["check"].Status != checkpoint.StepRejected {
		t.Errorf("finished steps after the conflicts = %+v; want them as first recorded", got)
	}
}

// stepsUnfinishedIsReplaced is the Steps test UnfinishedIsReplaced.
func stepsUnfinishedIsReplaced(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "steps/4", ownerA, t0)
	for _, status := range []string{checkpoint.StepFailed, checkpoint.StepPlanned, checkpoint.StepCalling, checkpoint.StepRunning} {
		id := "s-" + status
		e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
			return tx.PutStep(checkpoint.Step{ID: id, Status: status, Output: []byte(`0`), Error: "e", Tries: 1, StartedAt: t0, FinishedAt: t0})
		})
	}
	c2 := e.claim(st, "steps/4", ownerB, t0.Add(lease))
	for _, status := range []string{checkpoint.StepFailed, checkpoint.StepPlanned, checkpoint.StepCalling, checkpoint.StepRunning} {
		id := "s-" + status
		next := completed(id, `{"done":true}`)
		next.Tries = 2
		e.inTx(st, c2.Lease, func(tx checkpoint.Tx) error { return tx.PutStep(next) })
		got := e.steps(st, "steps/4")[id]
		if got.Status != checkpoint.StepCompleted || string(got.Output) != `{"done":true}` || got.Error != "" || got.Tries != 2 || got.Attempt != c2.Lease.Attempt {
			t.Errorf("a %s step recorded again = %+v; want it replaced by the completed record of attempt %d", status, got, c2.Lease.Attempt)
		}
	}
}

// stepsOrderOfStarting is the Steps test OrderOfStarting.
func stepsOrderOfStarting(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "steps/5", ownerA, t0)
	put := []struct {
		id string
		at time.Duration
	}{{"zeta", 0}, {"alpha", 2 * time.Second}, {"mid", time.Second}, {"beta", 2 * time.Second}}
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
		for _, p := range put {
			s := completed(p.id, `1`)
			s.StartedAt, s.FinishedAt = t0.Add(p.at), t0.Add(p.at)
			if err := tx.PutStep(s); err != nil {
				return err
			}
		}
		return nil
	})
	var order []string
	if err := st.Steps(e.ctx, "steps/5", func(s checkpoint.Step) error { order = append(order, s.ID); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := []string{"zeta", "mid", "alpha", "beta"}; !slices.Equal(order, want) {
		t.Errorf("Steps order = %v; want %v (by start time, then ID)", order, want)
	}
}

// stepsTransactionIsAllOrNothing is the Steps test TransactionIsAllOrNothing.
func stepsTransactionIsAllOrNothing(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "steps/6", ownerA, t0)
	boom := errors.New("the job failed mid-transaction")
	err := st.InTx(e.ctx, c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(completed("a", `1`)); err != nil {
			return err
		}
		if err := tx.PutItems([]checkpoint.Item{{Step: "b", Key: "k", Status: checkpoint.StepCompleted}}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx returned %v; want the function's own error", err)
	}
	if got := e.steps(st, "steps/6"); len(got) != 0 {
		t.Errorf("steps after a failed transaction = %+v; want none", got)
	}
	if got := e.items(st, checkpoint.ItemQuery{RunID: "steps/6", Step: "b"}); len(got) != 0 {
		t.Errorf("items after a failed transaction = %+v; want none", got)
	}
}

// stepsResetStepKeepsItems is the Steps test ResetStepKeepsItems.
func stepsResetStepKeepsItems(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "steps/7", ownerA, t0)
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(completed("batch", `{"total":1}`)); err != nil {
			return err
		}
		return tx.PutItems([]checkpoint.Item{{Step: "batch", Key: "k", Status: checkpoint.ItemSkipped, Error: "bad"}})
	})
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error { return tx.ResetStep("batch") })
	if got := e.steps(st, "steps/7"); len(got) != 0 {
		t.Errorf("steps after ResetStep = %+v; want none", got)
	}
	if got := e.items(st, checkpoint.ItemQuery{RunID: "steps/7", Step: "batch"}); len(got) != 1 || got[0].Status != checkpoint.ItemSkipped {
		t.Errorf("items after ResetStep = %+v; want the skipped item kept", got)
	}
}

// sameStep compares step checkpoints, times to the microsecond.
func sameStep(a, b checkpoint.Step) bool {
	return a.RunID == b.RunID && a.ID == b.ID && a.Status == b.Status && string(a.Output) == string(b.Output) &&
		a.InputHash == b.InputHash && a.Error == b.Error && a.Tries == b.Tries && a.Attempt == b.Attempt &&
		sameTime(a.StartedAt, b.StartedAt) && sameTime(a.FinishedAt, b.FinishedAt) && string(a.Plan) == string(b.Plan) &&
		string(a.Call) == string(b.Call)
}
