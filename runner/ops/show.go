package ops

import (
	"context"
	"encoding/json"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/steps"
)

// AttemptView is one attempt of a run.
type AttemptView struct {
	Number     int        `json:"number"`
	Fence      int64      `json:"fence"`
	Owner      string     `json:"owner"`
	Status     string     `json:"status"`
	Error      string     `json:"error,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// StepView is one step checkpoint of a run.
type StepView struct {
	ID string `json:"id"`
	// Status is the step's real state. A batch step's checkpoint says
	// running from its start to its end; when the attempt that ran it
	// ended without finishing it, Status is that attempt's end (failed,
	// interrupted, lost) or stale, and RecordedStatus keeps "running".
	Status         string `json:"status"`
	RecordedStatus string `json:"recorded_status,omitempty"`
	Tries          int    `json:"tries"`
	Attempt        int    `json:"attempt"`
	// Output is the recorded output; for an unfinished batch step, its
	// counts so far (a steps.BatchSummary).
	Output     json.RawMessage `json:"output,omitempty"`
	InputHash  string          `json:"input_hash,omitempty"`
	Error      string          `json:"error,omitempty"`
	StartedAt  time.Time       `json:"started_at"`
	FinishedAt *time.Time      `json:"finished_at,omitempty"` // absent while unfinished
	Plan       *PlanView       `json:"plan,omitempty"`
	// Call is an outside call's record: its idempotency key, the shape
	// of output resolve accepts for it, and an operator's resolution.
	Call *CallView `json:"call,omitempty"`
}

// CallView is an outside call step's record (checkpoint.CallRecord) as
// operators see it.
type CallView struct {
	Key string `json:"key"`
	// OutputShape is the step's output type's shape, rendered (see
	// steps.Shape): what resolve --as done --output must fit.
	OutputShape string                     `json:"output_shape,omitempty"`
	Resolved    *checkpoint.CallResolution `json:"resolved,omitempty"`
}

// PlanView is a step's effect plan: each key's before -> after.
type PlanView struct {
	steps.PlanRecord
	Applied bool `json:"applied"`
}

// ShowView is one run with everything recorded of it.
type ShowView struct {
	Run      RunView            `json:"run"`
	Attempts []AttemptView      `json:"attempts"`
	Steps    []StepView         `json:"steps"`
	Batches  []BatchView        `json:"batches"`
	Audit    []checkpoint.Audit `json:"audit"`
	Outbox   []MessageView      `json:"outbox"`
	// ChunkPlans (with ShowOptions.Effects) are the batch steps' chunk
	// plans, at most ShowOptions.ChunkPlans of ChunkPlansTotal.
	ChunkPlans      []ChunkPlanView `json:"chunk_plans,omitempty"`
	ChunkPlansTotal int64           `json:"chunk_plans_total,omitempty"`
	// Items is one page of the batch items of one status (see Items).
	Items *ItemsPage `json:"items,omitempty"`
	// Partitions are the partitions of the run's partitioned batch steps.
	Partitions []PartitionView `json:"partitions,omitempty"`
}

// BatchView is a batch step's progress: its item counts, its rate and
// its skipped items.
type BatchView struct {
	Step      string `json:"step"`
	Total     int64  `json:"total"` // -1 when the source did not say
	Done      int64  `json:"done"`  // completed, rejected and skipped
	Completed int64  `json:"completed"`
	Rejected  int64  `json:"rejected"`
	Skipped   int64  `json:"skipped"`
	Planned   int64  `json:"planned"`
	// RatePerSecond is Done over the time from the step's start to its
	// end (or to now while it runs); 0 when not known.
	RatePerSecond float64    `json:"rate_per_second,omitempty"`
	SkippedItems  []ItemView `json:"skipped_items,omitempty"`
	// Target is the effect target the step's items apply to ("" if none).
	Target string `json:"-"`
}

// ItemView is a skipped item with its error.
type ItemView struct {
	Key   string `json:"key"`
	Error string `json:"error"`
}

// ItemsPage is one page of a run's batch items of one status.
type ItemsPage struct {
	Status string       `json:"status"`
	Total  int64        `json:"total"` // items with this status (of the step asked for, or of the run)
	Items  []ListedItem `json:"items"`
	// Next, when more items follow, is the last item listed (STEP/KEY):
	// the position the next page starts after.
	Next string `json:"next,omitempty"`
}

// ListedItem is one batch item, with why it was rejected or skipped.
type ListedItem struct {
	ID     string          `json:"id"` // STEP/KEY
	Step   string          `json:"step"`
	Key    string          `json:"key"`
	Status string          `json:"status"`
	Reason string          `json:"reason,omitempty"` // why it was rejected or skipped
	Output json.RawMessage `json:"output,omitempty"`
}

// MaxSkippedShown bounds the skipped items Show lists per batch step.
const MaxSkippedShown = 50

// ShowOptions says what Show reads besides the run, its attempts, steps,
// batches, outbox and audit trail.
type ShowOptions struct {
	// Effects adds each effect step's plan and the batch steps' chunk
	// plans.
	Effects bool
	// ChunkPlans is how many chunk plans Effects lists; 0 lists all.
	ChunkPlans int
}

// Show reads one run with everything recorded of it, as operators see it
// at now; checkpoint.ErrNotFound if there is no such run.
func Show(ctx context.Context, st checkpoint.Backend, runID string, opt ShowOptions, now time.Time) (ShowView, error) {
	info, err := st.Run(ctx, runID)
	if err != nil {
		return ShowView{}, err
	}
	v := ShowView{Run: ViewRun(info.Run, now), Attempts: []AttemptView{}, Steps: []StepView{}, Outbox: []MessageView{}}
	for _, a := range info.Attempts {
		v.Attempts = append(v.Attempts, AttemptView{Number: a.Number, Fence: a.Fence, Owner: a.Owner, Status: a.Status,
			Error: a.Error, StartedAt: a.StartedAt, FinishedAt: OptTime(a.FinishedAt)})
	}
	var recorded []checkpoint.Step
	if err := st.Steps(ctx, runID, func(s checkpoint.Step) error { recorded = append(recorded, s); return nil }); err != nil {
		return v, err
	}
	if v.Batches, err = Batches(ctx, st, runID, recorded, now); err != nil {
		return v, err
	}
	for _, s := range recorded {
		v.Steps = append(v.Steps, viewStep(s, info, v.Batches, opt.Effects, now))
	}
	if v.Audit, err = st.Audits(ctx, runID); err != nil {
		return v, err
	}
	if v.Audit == nil {
		v.Audit = []checkpoint.Audit{}
	}
	msgs, err := st.RunMessages(ctx, runID)
	if err != nil {
		return v, err
	}
	for _, m := range msgs {
		v.Outbox = append(v.Outbox, ViewMessage(m))
	}
	if v.Partitions, err = RunPartitions(ctx, st, runID, now); err != nil {
		return v, err
	}
	if opt.Effects {
		if err := chunkPlans(ctx, st, runID, &v, opt.ChunkPlans); err != nil {
			return v, err
		}
	}
	return v, nil
}

// viewStep is a step as operators see it: a batch step left running by an
// attempt that ended (or a runner that is gone) gets that attempt's end as
// its status and its counts so far as its output.
func viewStep(s checkpoint.Step, info checkpoint.RunInfo, bs []BatchView, effects bool, now time.Time) StepView {
	sv := StepView{ID: s.ID, Status: s.Status, Tries: s.Tries, Attempt: s.Attempt, InputHash: s.InputHash,
		Error: s.Error, StartedAt: s.StartedAt, FinishedAt: OptTime(s.FinishedAt)}
	if json.Valid(s.Output) {
		sv.Output = s.Output
	}
	if rec, err := checkpoint.DecodeCallRecord(s.Call); err == nil && rec != nil {
		sv.Call = &CallView{Key: rec.Key, Resolved: rec.Resolved}
		var shape steps.Shape
		if json.Unmarshal(rec.OutputShape, &shape) == nil {
			sv.Call.OutputShape = shape.String()
		}
	}
	if effects && len(s.Plan) > 0 {
		var pv PlanView
		if err := json.Unmarshal(s.Plan, &pv.PlanRecord); err == nil {
			pv.Applied = s.Status == checkpoint.StepCompleted
			sv.Plan = &pv
		}
	}
	if s.Status != checkpoint.StepRunning {
		return sv
	}
	sv.FinishedAt = nil // the head's time is when the step started, not an end
	var sum steps.BatchSummary
	_ = json.Unmarshal(s.Output, &sum)
	for _, b := range bs {
		if b.Step == s.ID {
			sum = steps.BatchSummary{Total: sum.Total, Completed: b.Completed, Rejected: b.Rejected, Skipped: b.Skipped, Target: sum.Target}
		}
	}
	if out, err := json.Marshal(sum); err == nil {
		sv.Output = out
	}
	if state := stoppedAs(s, info, now); state != "" {
		sv.Status, sv.RecordedStatus = state, s.Status
	}
	return sv
}

// stoppedAs says how a batch step recorded as running stopped: the end of
// the attempt that last ran it, stale if that attempt's runner is gone
// without a word, or "" if it is running now.
func stoppedAs(s checkpoint.Step, info checkpoint.RunInfo, now time.Time) string {
	r := info.Run
	var last checkpoint.Attempt
	for _, a := range info.Attempts {
		if a.Number == s.Attempt {
			last = a
		}
	}
	latest := len(info.Attempts) > 0 && info.Attempts[len(info.Attempts)-1].Number == s.Attempt
	switch {
	case latest && r.Status == checkpoint.RunRunning && !Stale(r, now):
		return ""
	case last.Status == "" || last.Status == checkpoint.RunRunning:
		return "stale"
	}
	return last.Status
}

// chunkPlans reads up to limit chunk plans of the run (0: all) into v.
func chunkPlans(ctx context.Context, st checkpoint.Backend, runID string, v *ShowView, limit int) error {
	counts, err := st.ChunkPlanCounts(ctx, runID)
	if err != nil {
		return err
	}
	for _, n := range counts {
		v.ChunkPlansTotal += n.Count
	}
	v.ChunkPlans = []ChunkPlanView{}
	return st.RunChunkPlans(ctx, runID, checkpoint.Page{Limit: limit}, func(p checkpoint.ChunkPlan) error {
		pv, err := DecodeChunkPlan(p)
		if err != nil {
			return err
		}
		v.ChunkPlans = append(v.ChunkPlans, pv)
		return nil
	})
}

// ItemsQuery selects one page of a run's batch items of one status: of
// one step (Step) or of all (""), after the previous page's Next (After,
// STEP/KEY split in two), at most Limit (0: all).
type ItemsQuery struct {
	RunID, Step, Status string
	AfterStep, AfterKey string
	Limit               int
}

// Items reads one page of a run's batch items; bs are the run's batches
// (from Show or Batches), which count them.
func Items(ctx context.Context, st checkpoint.Backend, q ItemsQuery, bs []BatchView) (*ItemsPage, error) {
	page := &ItemsPage{Status: q.Status, Items: []ListedItem{}}
	for _, b := range bs { // counted once, for the batch table
		if q.Step != "" && b.Step != q.Step {
			continue
		}
		page.Total += map[string]int64{checkpoint.StepCompleted: b.Completed, checkpoint.StepRejected: b.Rejected,
			checkpoint.ItemSkipped: b.Skipped, checkpoint.StepPlanned: b.Planned}[q.Status]
	}
	read := q.Limit
	if read > 0 {
		read++ // one more says whether a next page exists
	}
	add := func(it checkpoint.Item) error {
		li := ListedItem{ID: it.Step + "/" + it.Key, Step: it.Step, Key: it.Key, Status: it.Status, Reason: it.Error}
		if len(it.Output) > 0 && json.Valid(it.Output) {
			li.Output = it.Output
		}
		page.Items = append(page.Items, li)
		return nil
	}
	var err error
	if q.Step == "" {
		err = st.RunItems(ctx, q.RunID, q.Status, checkpoint.Page{AfterStep: q.AfterStep, AfterKey: q.AfterKey, Limit: read}, add)
	} else {
		err = st.Items(ctx, checkpoint.ItemQuery{RunID: q.RunID, Step: q.Step, Status: q.Status, After: q.AfterKey, Limit: read},
			func(it checkpoint.Item) error {
				it.Step = q.Step
				return add(it)
			})
	}
	if err != nil {
		return nil, err
	}
	if q.Limit > 0 && len(page.Items) > q.Limit {
		page.Items = page.Items[:q.Limit]
		page.Next = page.Items[q.Limit-1].ID
	}
	return page, nil
}

// Batches counts each batch step's items by status, with its rate at now,
// and lists its first skipped items (retried with RetrySkipped).
func Batches(ctx context.Context, st checkpoint.Backend, runID string, recorded []checkpoint.Step, now time.Time) ([]BatchView, error) {
	counts, err := st.ItemCounts(ctx, runID)
	if err != nil {
		return nil, err
	}
	var out []BatchView
	for _, c := range counts {
		if len(out) == 0 || out[len(out)-1].Step != c.Step {
			b := BatchView{Step: c.Step, Total: -1}
			for _, s := range recorded {
				var sum steps.BatchSummary
				if s.ID == c.Step && json.Unmarshal(s.Output, &sum) == nil {
					b.Total, b.Target = sum.Total, sum.Target
				}
			}
			out = append(out, b)
		}
		b := &out[len(out)-1]
		switch c.Status {
		case checkpoint.StepCompleted:
			b.Completed = c.Count
		case checkpoint.StepRejected:
			b.Rejected = c.Count
		case checkpoint.ItemSkipped:
			b.Skipped = c.Count
		case checkpoint.StepPlanned:
			b.Planned = c.Count
		}
	}
	for i := range out {
		b := &out[i]
		b.Done = b.Completed + b.Rejected + b.Skipped
		for _, s := range recorded {
			if s.ID != b.Step || s.StartedAt.IsZero() {
				continue
			}
			end := now
			if s.Status != checkpoint.StepRunning && !s.FinishedAt.IsZero() {
				end = s.FinishedAt
			}
			if d := end.Sub(s.StartedAt).Seconds(); d > 0 && b.Done > 0 {
				b.RatePerSecond = float64(b.Done) / d
			}
		}
		if b.Skipped == 0 {
			continue
		}
		q := checkpoint.ItemQuery{RunID: runID, Step: b.Step, Status: checkpoint.ItemSkipped, Limit: MaxSkippedShown}
		err := st.Items(ctx, q, func(it checkpoint.Item) error {
			b.SkippedItems = append(b.SkippedItems, ItemView{Key: it.Key, Error: it.Error})
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
