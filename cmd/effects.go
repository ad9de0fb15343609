package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/steps"
)

// chunkPlanView is one recorded chunk plan of a batch step, as `show
// --effects` prints it and `show --json` lists it. Its target, items and
// writes are the stored plan's (written by steps.ForEach, decoded with
// checkpoint.DecodeChunkPlan: the binary encoding, or the JSON of plans
// recorded by an earlier Stepwise).
type chunkPlanView struct {
	Step     string `json:"step"`
	EffectID string `json:"effect_id"`
	// Status is applied, planned (separate store: recorded, not yet known
	// to be applied; the next run finishes it once) or superseded (lost a
	// race to another writer: nothing of it applied, a newer plan replaced
	// it).
	Status string             `json:"status"`
	Target string             `json:"target"`
	Items  []chunkItemView    `json:"items"`
	Writes []checkpoint.Write `json:"writes"`
}

// chunkItemView is one item of a chunk plan with the operations that went
// into the plan's writes.
type chunkItemView struct {
	Key string     `json:"key"`
	Ops []steps.Op `json:"ops,omitempty"`
}

// decodeChunkPlan decodes a stored chunk plan.
func decodeChunkPlan(p checkpoint.ChunkPlan) (chunkPlanView, error) {
	// The stored plan repeats the effect ID; the row's is authoritative.
	v := chunkPlanView{Step: p.Step, EffectID: p.EffectID, Status: p.Status}
	r, err := checkpoint.DecodeChunkPlan(p.Plan)
	if err != nil {
		return v, fmt.Errorf("chunk plan %s of step %s: %w", p.EffectID, p.Step, err)
	}
	v.Target, v.Writes = r.Target, r.Writes
	v.Items = make([]chunkItemView, len(r.Items))
	for i, it := range r.Items {
		v.Items[i].Key = it.Key
		if len(it.Ops) > 0 {
			if err := json.Unmarshal(it.Ops, &v.Items[i].Ops); err != nil {
				return v, fmt.Errorf("chunk plan %s of step %s: the operations of item %s: %w", p.EffectID, p.Step, it.Key, err)
			}
		}
	}
	if v.Writes == nil {
		v.Writes = []checkpoint.Write{}
	}
	return v, nil
}

// errStopPlans ends a chunk plan scan early.
var errStopPlans = errors.New("stop reading chunk plans")

// stepChunkPlans calls fn for each chunk plan of one batch step, in effect
// ID order, one at a time (a big run's plans are never all in memory).
func stepChunkPlans(env *Env, st checkpoint.Backend, runID, step string, fn func(chunkPlanView) error) error {
	err := st.RunChunkPlans(env.Ctx, runID, checkpoint.Page{AfterStep: step}, func(p checkpoint.ChunkPlan) error {
		if p.Step != step {
			return errStopPlans
		}
		v, err := decodeChunkPlan(p)
		if err != nil {
			return err
		}
		return fn(v)
	})
	if errors.Is(err, errStopPlans) {
		return nil
	}
	return err
}

// netEffects sums what a batch step's chunk plans did to each key.
type netEffects struct {
	writes int              // writes that applied (or, planned, may have)
	delta  map[string]int64 // net change per key
	plans  int
}

// batchNetEffects sums the writes of a batch step's applied and planned
// chunk plans (superseded ones applied nothing).
func batchNetEffects(env *Env, st checkpoint.Backend, runID, step string) (netEffects, error) {
	n := netEffects{delta: map[string]int64{}}
	err := stepChunkPlans(env, st, runID, step, func(p chunkPlanView) error {
		if p.Status == checkpoint.ChunkSuperseded {
			return nil
		}
		n.plans++
		for _, w := range p.Writes {
			n.writes++
			n.delta[w.Key] += w.NewValue - w.OldValue
		}
		return nil
	})
	return n, err
}

// maxKeysListed bounds the keys a refusal lists per step.
const maxKeysListed = 10

// String lists the net change per key, in key order, bounded.
func (n netEffects) String() string {
	keys := make([]string, 0, len(n.delta))
	for k := range n.delta {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i == maxKeysListed {
			fmt.Fprintf(&b, ", and %d more keys", len(keys)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %+d", k, n.delta[k])
	}
	return b.String()
}
