package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/steps"
)

// ChunkPlanView is one recorded chunk plan of a batch step. Its target,
// items and writes are the stored plan's JSON (written by steps.ForEach).
type ChunkPlanView struct {
	Step     string `json:"step"`
	EffectID string `json:"effect_id"`
	// Status is applied, planned (separate store: recorded, not yet known
	// to be applied; the next run finishes it once) or superseded (lost a
	// race to another writer: nothing of it applied, a newer plan replaced
	// it).
	Status string             `json:"status"`
	Target string             `json:"target"`
	Items  []ChunkItemView    `json:"items"`
	Writes []checkpoint.Write `json:"writes"`
}

// ChunkItemView is one item of a chunk plan with the operations that went
// into the plan's writes.
type ChunkItemView struct {
	Key string     `json:"key"`
	Ops []steps.Op `json:"ops,omitempty"`
}

// DecodeChunkPlan decodes a stored chunk plan.
func DecodeChunkPlan(p checkpoint.ChunkPlan) (ChunkPlanView, error) {
	// The stored plan repeats the effect ID; the row's is authoritative.
	v := ChunkPlanView{Step: p.Step, EffectID: p.EffectID, Status: p.Status}
	r, err := checkpoint.DecodeChunkPlan(p.Plan)
	if err != nil {
		return v, fmt.Errorf("chunk plan %s of step %s: %w", p.EffectID, p.Step, err)
	}
	v.Target, v.Writes = r.Target, r.Writes
	v.Items = make([]ChunkItemView, len(r.Items))
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

// StepChunkPlans calls fn for each chunk plan of one batch step, in effect
// ID order, one at a time (a big run's plans are never all in memory).
func StepChunkPlans(ctx context.Context, st checkpoint.Backend, runID, step string, fn func(ChunkPlanView) error) error {
	err := st.RunChunkPlans(ctx, runID, checkpoint.Page{AfterStep: step}, func(p checkpoint.ChunkPlan) error {
		if p.Step != step {
			return errStopPlans
		}
		v, err := DecodeChunkPlan(p)
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

// NetEffects sums what a batch step's chunk plans did to each key.
type NetEffects struct {
	Writes int              // writes that applied (or, planned, may have)
	Delta  map[string]int64 // net change per key
	Plans  int
}

// BatchNetEffects sums the writes of a batch step's applied and planned
// chunk plans (superseded ones applied nothing).
func BatchNetEffects(ctx context.Context, st checkpoint.Backend, runID, step string) (NetEffects, error) {
	n := NetEffects{Delta: map[string]int64{}}
	err := StepChunkPlans(ctx, st, runID, step, func(p ChunkPlanView) error {
		if p.Status == checkpoint.ChunkSuperseded {
			return nil
		}
		n.Plans++
		for _, w := range p.Writes {
			n.Writes++
			n.Delta[w.Key] += w.NewValue - w.OldValue
		}
		return nil
	})
	return n, err
}

// maxKeysListed bounds the keys a refusal lists per step.
const maxKeysListed = 10

// String lists the net change per key, in key order, bounded.
func (n NetEffects) String() string {
	keys := make([]string, 0, len(n.Delta))
	for k := range n.Delta {
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
		fmt.Fprintf(&b, "%s %+d", k, n.Delta[k])
	}
	return b.String()
}

// KeptEffects are the effects of some steps that applied (or may have):
// clearing the steps does not undo them, and rerunning the steps applies
// them again.
type KeptEffects struct {
	Lines      []string // one per write of a step, one per batch step
	Writes     int      // writes of steps (key changes) that applied or may have
	Items      int64    // items done of batch steps
	ItemWrites int      // the writes of those items' recorded chunk plans
}

// Count says how many effects apply again, e.g. "1 effect and the effects
// of 92 items (45 writes)".
func (k KeptEffects) Count() string {
	var parts []string
	if k.Writes > 0 {
		parts = append(parts, Plural(k.Writes, "effect"))
	}
	if k.Items > 0 {
		p := "the effects of " + Plural(int(k.Items), "item")
		if k.ItemWrites > 0 {
			p += " (" + Plural(k.ItemWrites, "write") + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " and ")
}

// Plural is "1 effect", "2 effects".
func Plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// Any reports whether any effect was kept.
func (k KeptEffects) Any() bool { return len(k.Lines) > 0 }

// AppliedEffects describes the effects of the given steps that applied,
// or may have: a step's writes (key, before -> after, the amount); a
// separate-store plan recorded but not known to be applied; the completed
// items of a batch step with a target, finished or not, with the net
// amount per key of their chunk plans.
func AppliedEffects(ctx context.Context, st checkpoint.Backend, runID string, ss []checkpoint.Step) (KeptEffects, error) {
	var out KeptEffects
	var counts []checkpoint.ItemCount
	for _, s := range ss {
		if len(s.Plan) > 0 && (s.Status == checkpoint.StepCompleted || s.Status == checkpoint.StepPlanned) {
			var pr steps.PlanRecord
			if json.Unmarshal(s.Plan, &pr) == nil {
				state := ""
				if s.Status == checkpoint.StepPlanned {
					state = " (planned as " + pr.EffectID + "; may have applied: resume finishes it once)"
				}
				for _, w := range pr.Writes {
					out.Writes++
					out.Lines = append(out.Lines, fmt.Sprintf("%s: %s %s %d -> %d (%+d)%s",
						s.ID, pr.Target, w.Key, w.OldValue, w.NewValue, w.NewValue-w.OldValue, state))
				}
			}
			continue
		}
		var sum steps.BatchSummary
		if len(s.Call) > 0 || json.Unmarshal(s.Output, &sum) != nil || sum.Target == "" {
			continue
		}
		done := sum.Completed
		if s.Status != checkpoint.StepCompleted {
			if counts == nil {
				var err error
				if counts, err = st.ItemCounts(ctx, runID); err != nil {
					return out, err
				}
			}
			done = 0
			for _, c := range counts {
				if c.Step == s.ID && (c.Status == checkpoint.StepCompleted || c.Status == checkpoint.StepPlanned) {
					done += c.Count
				}
			}
		}
		if done == 0 {
			continue
		}
		net, err := BatchNetEffects(ctx, st, runID, s.ID)
		if err != nil {
			return out, err
		}
		verb := "applied their effects"
		if done == 1 {
			verb = "applied its effects"
		}
		line := fmt.Sprintf("%s: %s %s to %s", s.ID, Plural(int(done), "item"), verb, sum.Target)
		out.Items += done
		if net.Plans > 0 {
			out.ItemWrites += net.Writes
			line += fmt.Sprintf(": %s in %s, net %s", Plural(int(net.Writes), "write"), Plural(int(net.Plans), "chunk"), net)
		}
		out.Lines = append(out.Lines, line)
	}
	return out, nil
}
