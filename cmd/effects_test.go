package cmd

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner/ops"
	"github.com/stepwise-run/stepwise/steps"
)

// TestChunkPlansWrittenAsJSONStillShow: a database from a Stepwise that
// recorded chunk plans as JSON (before checkpoint.EncodeChunkPlan) still
// shows them, and the operator commands still count their writes as kept
// effects.
func TestChunkPlansWrittenAsJSONStillShow(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	lease := c.claimJob(opsBatchJob, map[string]string{"key": "old", "side": c.side}, time.Now().Add(-time.Hour), time.Minute)
	runID := lease.RunID
	sum, _ := json.Marshal(steps.BatchSummary{Total: 2, Completed: 2, Executed: 2, Target: "stepwise_state"})
	now := time.Now()
	// As the earlier ForEach wrote a same-store chunk of items 1 and 2.
	legacy := `{"target":"stepwise_state","effect_id":"` + runID + `/pay@1.s0","items":[{"key":"1"},{"key":"2"}],` +
		`"writes":[{"key":"acct:old","old_version":0,"old_value":0,"new_value":2,"insert":true}]}`
	err := c.store().InTx(context.Background(), lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(checkpoint.Step{ID: "pay", Status: checkpoint.StepCompleted, Output: sum, Tries: 1, StartedAt: now, FinishedAt: now}); err != nil {
			return err
		}
		if err := tx.PutItems([]checkpoint.Item{
			{Step: "pay", Key: "1", Status: checkpoint.StepCompleted, Output: []byte(`"1"`)},
			{Step: "pay", Key: "2", Status: checkpoint.StepCompleted, Output: []byte(`"2"`)},
		}); err != nil {
			return err
		}
		return tx.PutChunkPlan(checkpoint.ChunkPlan{Step: "pay", EffectID: runID + "/pay@1.s0", Status: checkpoint.ChunkApplied, Plan: []byte(legacy)})
	})
	if err != nil {
		t.Fatal(err)
	}

	out := c.want(ExitOK, nil, "show", runID, "--effects")
	for _, want := range []string{"pay chunk  on stepwise_state  [" + runID + "/pay@1.s0]  applied  2 items: 1 .. 2", "acct:old: 0 -> 2  (+2, version 0 -> 1)"} {
		if lineWith(out.stdout, want) == "" {
			t.Errorf("show --effects lacks %q\n%s", want, out)
		}
	}
	var v struct {
		ChunkPlans []ops.ChunkPlanView `json:"chunk_plans"`
	}
	js := c.want(ExitOK, nil, "show", runID, "--effects", "--json")
	if err := json.Unmarshal([]byte(js.stdout), &v); err != nil {
		t.Fatalf("show --json: %v\n%s", err, js)
	}
	if len(v.ChunkPlans) != 1 || len(v.ChunkPlans[0].Items) != 2 || len(v.ChunkPlans[0].Writes) != 1 ||
		v.ChunkPlans[0].Writes[0] != (checkpoint.Write{Key: "acct:old", NewValue: 2, Insert: true}) {
		t.Errorf("show --json chunk plans = %+v; want the JSON plan's 2 items and its write", v.ChunkPlans)
	}
	c.want(ExitOperator, []string{"pay: 2 items applied their effects to stepwise_state: 1 write in 1 chunk, net acct:old +2"},
		"reset", runID, "--step", "pay", "--reason", "test")
}
