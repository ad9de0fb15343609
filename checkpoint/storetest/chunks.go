package storetest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// chunk writes a chunk plan of step "post" with status and its planned
// items.
func chunk(tx checkpoint.Tx, effectID, status, supersedes string, keys ...string) error {
	p := checkpoint.ChunkPlan{Step: "post", EffectID: effectID, Status: status, Plan: []byte(`{"chunk":"` + effectID + `"}`), Supersedes: supersedes}
	if err := tx.PutChunkPlan(p); err != nil {
		return err
	}
	var items []checkpoint.Item
	for _, k := range keys {
		items = append(items, checkpoint.Item{Step: "post", Key: k, Status: checkpoint.StepPlanned, Chunk: effectID})
	}
	if len(items) == 0 {
		return nil
	}
	return tx.PutItems(items)
}

// plannedIDs lists the effect IDs of a step's plans still planned.
func (e *env) plannedIDs(st checkpoint.Store, runID string) []string {
	e.t.Helper()
	plans, err := st.ChunkPlans(e.ctx, runID, "post")
	if err != nil {
		e.t.Fatalf("ChunkPlans: %v", err)
	}
	var out []string
	for _, p := range plans {
		if p.Step != "post" || p.Status != checkpoint.StepPlanned || string(p.Plan) != `{"chunk":"`+p.EffectID+`"}` {
			e.t.Errorf("planned chunk = %+v; want step post, status planned, its plan", p)
		}
		out = append(out, p.EffectID)
	}
	return out
}

// itemStates lists "key:status:chunk" of step "post".
func (e *env) itemStates(st checkpoint.Store, runID string) string {
	e.t.Helper()
	var out []string
	for _, it := range e.items(st, checkpoint.ItemQuery{RunID: runID, Step: "post"}) {
		out = append(out, it.Key+":"+it.Status+":"+it.Chunk)
	}
	return strings.Join(out, " ")
}

func testChunkPlans(t *testing.T, h Harness) {
	t.Run("PlannedThenFinished", func(t *testing.T) { chunkPlansPlannedThenFinished(t, h) })
	t.Run("StatusIsChecked", func(t *testing.T) { chunkPlansStatusIsChecked(t, h) })
	callerClock(t, h, "Supersede", chunkPlansSupersede)
	t.Run("Listings", func(t *testing.T) { chunkPlansListings(t, h) })
}

// chunkPlansPlannedThenFinished is the ChunkPlans test PlannedThenFinished.
func chunkPlansPlannedThenFinished(t *testing.T, h Harness) {
	e := newEnv(t, h)
	a, b := e.open(), e.open()
	c := e.claim(a, "chunks/1", ownerA, t0)
	e.inTx(a, c.Lease, func(tx checkpoint.Tx) error {
		if err := chunk(tx, "post@1.c2", "", "", "c", "d"); err != nil {
			return err
		}
		if err := chunk(tx, "post@1.c1", checkpoint.StepPlanned, "", "a", "b"); err != nil {
			return err
		}
		return chunk(tx, "post@1.c0", checkpoint.ChunkApplied, "") // a same-store chunk, applied as recorded
	})
	if got := e.plannedIDs(b, "chunks/1"); !slices.Equal(got, []string{"post@1.c1", "post@1.c2"}) {
		t.Errorf("planned chunks = %v; want c1, c2 (an empty status records planned; applied plans are not listed)", got)
	}
	e.inTx(a, c.Lease, func(tx checkpoint.Tx) error { return tx.FinishChunk("post", "post@1.c1") })
	if got := e.plannedIDs(b, "chunks/1"); !slices.Equal(got, []string{"post@1.c2"}) {
		t.Errorf("planned chunks after finishing c1 = %v; want c2", got)
	}
	want := "a:completed:post@1.c1 b:completed:post@1.c1 c:planned:post@1.c2 d:planned:post@1.c2"
	if got := e.itemStates(b, "chunks/1"); got != want {
		t.Errorf("items after finishing c1 = %s; want %s", got, want)
	}
}

// chunkPlansStatusIsChecked is the ChunkPlans test StatusIsChecked.
func chunkPlansStatusIsChecked(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "chunks/2", ownerA, t0)
	for _, status := range []string{checkpoint.ChunkSuperseded, "done"} {
		if err := st.InTx(e.ctx, c.Lease, func(tx checkpoint.Tx) error { return chunk(tx, "post@1.c1", status, "") }); err == nil {
			t.Errorf("a chunk plan recorded %q was accepted; want an error (record planned or applied)", status)
		}
	}
	if got := e.plannedIDs(st, "chunks/2"); len(got) != 0 {
		t.Errorf("planned chunks = %v; want none", got)
	}
}

// chunkPlansSupersede is the ChunkPlans test Supersede.
func chunkPlansSupersede(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	c := e.claim(st, "chunks/3", ownerA, t0)
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
		if err := chunk(tx, "post@1.c1", "", "", "a", "b"); err != nil {
			return err
		}
		// An item of the chunk that was rejected by a guard: it has no
		// effects and stays as it is.
		return tx.PutItems([]checkpoint.Item{{Step: "post", Key: "r", Status: checkpoint.StepRejected, Chunk: "post@1.c1"}})
	})
	c2 := e.claim(st, "chunks/3", ownerB, t0.Add(lease))
	e.inTx(st, c2.Lease, func(tx checkpoint.Tx) error { return chunk(tx, "post@2.c1", "", "post@1.c1") })
	if got := e.plannedIDs(st, "chunks/3"); !slices.Equal(got, []string{"post@2.c1"}) {
		t.Errorf("planned chunks after superseding = %v; want only the new plan", got)
	}
	want := "a:planned:post@2.c1 b:planned:post@2.c1 r:rejected:post@1.c1"
	if got := e.itemStates(st, "chunks/3"); got != want {
		t.Errorf("items after superseding = %s; want %s (planned items move to the new plan)", got, want)
	}
	e.inTx(st, c2.Lease, func(tx checkpoint.Tx) error { return tx.FinishChunk("post", "post@2.c1") })
	want = "a:completed:post@2.c1 b:completed:post@2.c1 r:rejected:post@1.c1"
	if got := e.itemStates(st, "chunks/3"); got != want {
		t.Errorf("items after finishing the new plan = %s; want %s", got, want)
	}
	if ls, ok := st.(listings); ok {
		var got []string
		if err := ls.RunChunkPlans(e.ctx, "chunks/3", checkpoint.Page{}, func(p checkpoint.ChunkPlan) error {
			got = append(got, p.EffectID+":"+p.Status)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if want := []string{"post@1.c1:superseded", "post@2.c1:applied"}; !slices.Equal(got, want) {
			t.Errorf("all chunk plans = %v; want %v", got, want)
		}
	}
}

// chunkPlansListings is the ChunkPlans test Listings.
func chunkPlansListings(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	ls := capability[listings](t, st, "run item and chunk plan listings")
	c := e.claim(st, "chunks/4", ownerA, t0)
	e.inTx(st, c.Lease, func(tx checkpoint.Tx) error {
		for _, n := range []int{10, 2, 1} {
			if err := chunk(tx, fmt.Sprintf("post@1.c%d", n), "", "", fmt.Sprintf("k%02d", n)); err != nil {
				return err
			}
		}
		if err := tx.FinishChunk("post", "post@1.c2"); err != nil {
			return err
		}
		return tx.PutItems([]checkpoint.Item{
			{Step: "load", Key: "x", Status: checkpoint.ItemSkipped, Error: "bad x"},
			{Step: "post", Key: "y", Status: checkpoint.ItemSkipped, Error: "bad y"},
			{Step: "post", Key: "z", Status: checkpoint.ItemSkipped, Error: "bad z"},
		})
	})
	plans := func(p checkpoint.Page) []string {
		var out []string
		if err := ls.RunChunkPlans(e.ctx, "chunks/4", p, func(cp checkpoint.ChunkPlan) error {
			out = append(out, strings.TrimPrefix(cp.EffectID, "post@1.")+":"+cp.Status)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got, want := plans(checkpoint.Page{}), []string{"c1:planned", "c2:applied", "c10:planned"}; !slices.Equal(got, want) {
		t.Errorf("chunk plans = %v; want %v (in the order they were made)", got, want)
	}
	if got, want := plans(checkpoint.Page{AfterStep: "post", AfterKey: "post@1.c1", Limit: 1}), []string{"c2:applied"}; !slices.Equal(got, want) {
		t.Errorf("second page of chunk plans = %v; want %v", got, want)
	}
	counts, err := ls.ChunkPlanCounts(e.ctx, "chunks/4")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(counts) != "[{post applied 1} {post planned 2}]" {
		t.Errorf("chunk plan counts = %v; want post applied 1, planned 2", counts)
	}
	items := func(p checkpoint.Page) []string {
		var out []string
		if err := ls.RunItems(e.ctx, "chunks/4", checkpoint.ItemSkipped, p, func(it checkpoint.Item) error {
			out = append(out, it.Step+"/"+it.Key+":"+it.Error)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got, want := items(checkpoint.Page{}), []string{"load/x:bad x", "post/y:bad y", "post/z:bad z"}; !slices.Equal(got, want) {
		t.Errorf("skipped items = %v; want %v", got, want)
	}
	if got, want := items(checkpoint.Page{AfterStep: "load", AfterKey: "x", Limit: 1}), []string{"post/y:bad y"}; !slices.Equal(got, want) {
		t.Errorf("second page of skipped items = %v; want %v", got, want)
	}
}
