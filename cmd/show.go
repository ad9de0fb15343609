package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/steps"
)

// ShowCmd shows one run.
type ShowCmd struct {
	RunID   string `arg:"" name:"run-id" help:"Run ID, e.g. settle/2026-11-28."`
	JSON    bool   `name:"json" help:"Print JSON instead of text."`
	Effects bool   `help:"Also list the recorded effect plans: each effect step's, and each chunk's of a batch step (its items; each key: before -> after, versions), and whether it applied. At most --limit chunk plans unless --all."`
	Items   string `enum:",rejected,skipped,completed,planned" default:"" placeholder:"STATUS" help:"Also list the batch items with this status (rejected or skipped, with their reasons; completed; planned), in step and key order: --limit at a time, the next page with --after, or --all."`
	Limit   int    `default:"50" help:"At most this many items (--items) and chunk plans (--effects)."`
	After   string `placeholder:"STEP/KEY" help:"With --items: list the items after this one (the last of the previous page, as printed)."`
	All     bool   `help:"List every item (--items) and chunk plan (--effects), not --limit of them."`
}

type attemptView struct {
	Number     int        `json:"number"`
	Fence      int64      `json:"fence"`
	Owner      string     `json:"owner"`
	Status     string     `json:"status"`
	Error      string     `json:"error,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

type stepView struct {
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
	Plan       *planView       `json:"plan,omitempty"`
}

// planView is a step's effect plan in `show --effects`.
type planView struct {
	steps.PlanRecord
	Applied bool `json:"applied"`
}

type showView struct {
	Run      runView            `json:"run"`
	Attempts []attemptView      `json:"attempts"`
	Steps    []stepView         `json:"steps"`
	Batches  []batchView        `json:"batches"`
	Audit    []checkpoint.Audit `json:"audit"`
	Outbox   []messageView      `json:"outbox"`
	// ChunkPlans (--effects) are the batch steps' chunk plans, at most
	// --limit of ChunkPlansTotal unless --all.
	ChunkPlans      []chunkPlanView `json:"chunk_plans,omitempty"`
	ChunkPlansTotal int64           `json:"chunk_plans_total,omitempty"`
	// Items (--items) is one page of the batch items of one status.
	Items *itemsPage `json:"items,omitempty"`
	// Partitions are the partitions of the run's partitioned batch steps.
	Partitions []partitionView `json:"partitions,omitempty"`
}

// partitionView is one partition of a batch step in `show` and `runs`.
type partitionView struct {
	Step  string `json:"step"`
	Index int    `json:"index"`
	Count int    `json:"count"`
	// Range is how items are assigned: "[from, to)" for key ranges,
	// "hash mod N = I" for PartitionBy.
	Range      string     `json:"range"`
	State      string     `json:"state"`
	Owner      string     `json:"owner,omitempty"`
	Fence      int64      `json:"fence"`
	LeaseUntil *time.Time `json:"lease_until,omitempty"`
	Done       int64      `json:"done"` // finished items: completed, rejected, skipped
	Rejected   int64      `json:"rejected"`
	Skipped    int64      `json:"skipped"`
	Total      int64      `json:"total"`
	HighWater  string     `json:"high_water,omitempty"`
	Error      string     `json:"error,omitempty"`
}

func viewPartition(p checkpoint.Partition) partitionView {
	rng := fmt.Sprintf("hash mod %d = %d", p.Count, p.Index)
	if p.Rule == checkpoint.PartitionRange {
		to := "∞"
		if p.To != "" {
			to = fmt.Sprintf("%q", p.To)
		}
		rng = fmt.Sprintf("[%q, %s)", p.From, to)
	}
	return partitionView{Step: p.Step, Index: p.Index, Count: p.Count, Range: rng, State: p.State, Owner: checkpoint.OwnerName(p.Owner),
		Fence: p.Fence, LeaseUntil: optTime(p.LeaseUntil), Done: p.Finished(), Rejected: p.Rejected, Skipped: p.Skipped,
		Total: p.Total, HighWater: p.HighWater, Error: p.Error}
}

// runPartitions reads the partitions of a run's batch steps.
func runPartitions(env *Env, st checkpoint.Backend, runID string) ([]partitionView, error) {
	ps, err := st.Partitions(env.Ctx, runID, "")
	if err != nil {
		return nil, err
	}
	var out []partitionView
	for _, p := range ps {
		out = append(out, viewPartition(p))
	}
	return out, nil
}

// messageView is an outbox message; its payload, JSON, is shown as JSON.
type messageView struct {
	Key       string          `json:"key"`
	Topic     string          `json:"topic"`
	Payload   json.RawMessage `json:"payload"`
	Status    string          `json:"status"`
	Tries     int             `json:"tries"`
	NextAt    time.Time       `json:"next_at"`
	LastError string          `json:"last_error,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	SentAt    *time.Time      `json:"sent_at,omitempty"`
}

func viewMessage(m checkpoint.Message) messageView {
	payload := json.RawMessage(m.Payload)
	if !json.Valid(m.Payload) { // not written by steps.Notify: shown as a string
		payload, _ = json.Marshal(string(m.Payload))
	}
	return messageView{Key: m.Key, Topic: m.Topic, Payload: payload, Status: m.Status, Tries: m.Tries, NextAt: m.NextAt,
		LastError: m.LastError, CreatedAt: m.CreatedAt, SentAt: optTime(m.SentAt)}
}

// batchView is a batch step's item counts and skipped items in `show`.
type batchView struct {
	Step         string     `json:"step"`
	Total        int64      `json:"total"` // -1 when the source did not say
	Completed    int64      `json:"completed"`
	Rejected     int64      `json:"rejected"`
	Skipped      int64      `json:"skipped"`
	Planned      int64      `json:"planned"`
	SkippedItems []itemView `json:"skipped_items,omitempty"`
	target       string
}

type itemView struct {
	Key   string `json:"key"`
	Error string `json:"error"`
}

// itemsPage is one page of `show --items STATUS`.
type itemsPage struct {
	Status string       `json:"status"`
	Total  int64        `json:"total"` // items of the run with this status
	Items  []listedItem `json:"items"`
	// Next, when more items follow, is the last item listed: pass it as
	// --after for the next page.
	Next string `json:"next,omitempty"`
}

// listedItem is one batch item in `show --items`.
type listedItem struct {
	ID     string          `json:"id"` // STEP/KEY
	Step   string          `json:"step"`
	Key    string          `json:"key"`
	Status string          `json:"status"`
	Reason string          `json:"reason,omitempty"` // why it was rejected or skipped
	Output json.RawMessage `json:"output,omitempty"`
}

// maxSkippedShown bounds the skipped items `show` lists per batch step
// without --items.
const maxSkippedShown = 50

// validate checks the flags that depend on each other.
func (c *ShowCmd) validate() (limit int, after [2]string, err error) {
	if c.Limit < 1 && !c.All {
		return 0, after, usageError{fmt.Errorf("--limit %d: give at least 1, or --all", c.Limit)}
	}
	if c.After != "" {
		if c.Items == "" {
			return 0, after, usageError{errors.New("--after pages through --items; add --items rejected|skipped|completed|planned")}
		}
		i := strings.LastIndexByte(c.After, '/')
		if i <= 0 || i == len(c.After)-1 {
			return 0, after, usageError{fmt.Errorf("--after %q: want an item as show lists it, STEP/KEY (e.g. post/T-1001)", c.After)}
		}
		after = [2]string{c.After[:i], c.After[i+1:]}
	}
	if !c.All {
		limit = c.Limit
	}
	return limit, after, nil
}

// Run implements the show command.
func (c *ShowCmd) Run(env *Env) error {
	limit, after, err := c.validate()
	if err != nil {
		return err
	}
	st, err := env.ExistingStore()
	if err != nil {
		return err
	}
	info, err := st.Run(env.Ctx, c.RunID)
	if err != nil {
		return err
	}
	now := env.now()
	v := showView{Run: viewRun(info.Run, now), Attempts: []attemptView{}, Steps: []stepView{}, Outbox: []messageView{}}
	for _, a := range info.Attempts {
		v.Attempts = append(v.Attempts, attemptView{Number: a.Number, Fence: a.Fence, Owner: a.Owner, Status: a.Status,
			Error: a.Error, StartedAt: a.StartedAt, FinishedAt: optTime(a.FinishedAt)})
	}
	var recorded []checkpoint.Step
	if err := st.Steps(env.Ctx, c.RunID, func(s checkpoint.Step) error { recorded = append(recorded, s); return nil }); err != nil {
		return err
	}
	if v.Batches, err = batches(env, st, c.RunID, recorded); err != nil {
		return err
	}
	for _, s := range recorded {
		v.Steps = append(v.Steps, c.viewStep(s, info, v.Batches, now))
	}
	if v.Audit, err = st.Audits(env.Ctx, c.RunID); err != nil {
		return err
	}
	if v.Audit == nil {
		v.Audit = []checkpoint.Audit{}
	}
	msgs, err := st.RunMessages(env.Ctx, c.RunID)
	if err != nil {
		return err
	}
	for _, m := range msgs {
		v.Outbox = append(v.Outbox, viewMessage(m))
	}
	if v.Partitions, err = runPartitions(env, st, c.RunID); err != nil {
		return err
	}
	if c.Effects {
		if err := c.chunkPlans(env, st, &v, limit); err != nil {
			return err
		}
	}
	if c.Items != "" {
		if v.Items, err = c.items(env, st, v.Batches, limit, after); err != nil {
			return err
		}
	}
	if c.JSON {
		return writeJSON(env.Stdout, v)
	}
	return c.print(env, info.Run, v, now)
}

// viewStep is a step as show reports it: a batch step left running by an
// attempt that ended (or a runner that is gone) gets that attempt's end as
// its status and its counts so far as its output.
func (c *ShowCmd) viewStep(s checkpoint.Step, info checkpoint.RunInfo, bs []batchView, now time.Time) stepView {
	sv := stepView{ID: s.ID, Status: s.Status, Tries: s.Tries, Attempt: s.Attempt, InputHash: s.InputHash,
		Error: s.Error, StartedAt: s.StartedAt, FinishedAt: optTime(s.FinishedAt)}
	if json.Valid(s.Output) {
		sv.Output = s.Output
	}
	if c.Effects && len(s.Plan) > 0 {
		var pv planView
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
	case latest && r.Status == checkpoint.RunRunning && !stale(r, now):
		return ""
	case last.Status == "" || last.Status == checkpoint.RunRunning:
		return "stale"
	}
	return last.Status
}

// chunkPlans reads up to limit chunk plans of the run (0: all) into v.
func (c *ShowCmd) chunkPlans(env *Env, st checkpoint.Backend, v *showView, limit int) error {
	counts, err := st.ChunkPlanCounts(env.Ctx, c.RunID)
	if err != nil {
		return err
	}
	for _, n := range counts {
		v.ChunkPlansTotal += n.Count
	}
	v.ChunkPlans = []chunkPlanView{}
	return st.RunChunkPlans(env.Ctx, c.RunID, checkpoint.Page{Limit: limit}, func(p checkpoint.ChunkPlan) error {
		pv, err := decodeChunkPlan(p)
		if err != nil {
			return err
		}
		v.ChunkPlans = append(v.ChunkPlans, pv)
		return nil
	})
}

// items reads one page of the run's items with status c.Items.
func (c *ShowCmd) items(env *Env, st checkpoint.Backend, bs []batchView, limit int, after [2]string) (*itemsPage, error) {
	page := &itemsPage{Status: c.Items, Items: []listedItem{}}
	for _, b := range bs { // counted once, for the batch table
		page.Total += map[string]int64{checkpoint.StepCompleted: b.Completed, checkpoint.StepRejected: b.Rejected,
			checkpoint.ItemSkipped: b.Skipped, checkpoint.StepPlanned: b.Planned}[c.Items]
	}
	read := limit
	if read > 0 {
		read++ // one more says whether a next page exists
	}
	err := st.RunItems(env.Ctx, c.RunID, c.Items, checkpoint.Page{AfterStep: after[0], AfterKey: after[1], Limit: read}, func(it checkpoint.Item) error {
		li := listedItem{ID: it.Step + "/" + it.Key, Step: it.Step, Key: it.Key, Status: it.Status, Reason: it.Error}
		if len(it.Output) > 0 && json.Valid(it.Output) {
			li.Output = it.Output
		}
		page.Items = append(page.Items, li)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if limit > 0 && len(page.Items) > limit {
		page.Items = page.Items[:limit]
		page.Next = page.Items[limit-1].ID
	}
	return page, nil
}

// took is a step's or attempt's duration, or "-" while it has no end.
func took(start time.Time, end *time.Time, round time.Duration) string {
	if end == nil || end.Before(start) {
		return "-"
	}
	return end.Sub(start).Round(round).String()
}

// print writes v as text.
func (c *ShowCmd) print(env *Env, r checkpoint.Run, v showView, now time.Time) error {
	fmt.Fprintf(env.Stdout, "run %s\n  job %s, key %s, params %s\n  status %s, fence %d, created %s, updated %s\n",
		r.ID, r.Job, r.RunKey, r.Params, statusText(r, now), r.Fence, r.CreatedAt.Format(time.RFC3339), ago(r.UpdatedAt, now))
	if r.Error != "" {
		first, _, _ := strings.Cut(r.Error, "\n") // the rest (a panic's stack) follows the attempts
		fmt.Fprintf(env.Stdout, "  error: %s\n", first)
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nATTEMPT\tOWNER\tSTATUS\tSTARTED\tTOOK\tERROR")
	for _, a := range v.Attempts {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", a.Number, checkpoint.OwnerName(a.Owner), a.Status, a.StartedAt.Format(time.RFC3339),
			took(a.StartedAt, a.FinishedAt, time.Millisecond), preview(strings.SplitN(a.Error, "\n", 2)[0], 60))
	}
	for _, a := range v.Attempts {
		if strings.Contains(a.Error, "\n") { // a panic's stack: in full
			tw.Flush()
			fmt.Fprintf(env.Stdout, "\nattempt %d error:\n%s\n", a.Number, a.Error)
		}
	}
	fmt.Fprintln(tw, "\nSTEP\tSTATUS\tATTEMPT\tTRIES\tTOOK\tOUTPUT / ERROR")
	for _, s := range v.Steps {
		out := string(s.Output)
		if s.Error != "" {
			out = s.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", s.ID, s.Status, s.Attempt, s.Tries,
			took(s.StartedAt, s.FinishedAt, time.Microsecond), preview(out, 60))
	}
	if len(v.Batches) > 0 {
		fmt.Fprintln(tw, "\nBATCH STEP\tDONE\tTOTAL\tCOMPLETED\tREJECTED\tSKIPPED\tPLANNED")
		for _, b := range v.Batches {
			total := "?"
			if b.Total >= 0 {
				total = fmt.Sprint(b.Total)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\n", b.Step, b.Completed+b.Rejected+b.Skipped, total,
				b.Completed, b.Rejected, b.Skipped, b.Planned)
		}
		if c.Items == "" {
			for _, b := range v.Batches {
				for _, it := range b.SkippedItems {
					fmt.Fprintf(tw, "skipped %s/%s\t%s\n", b.Step, it.Key, preview(it.Error, 80))
				}
			}
		}
	}
	if len(v.Partitions) > 0 {
		fmt.Fprintln(tw, "\nPARTITION\tSTATE\tOWNER\tASSIGNS\tDONE/TOTAL\tREJECTED\tSKIPPED\tERROR")
		for _, p := range v.Partitions {
			fmt.Fprintf(tw, "%s#%d\t%s\t%s\t%s\t%d/%d\t%d\t%d\t%s\n", p.Step, p.Index, p.State, p.Owner, p.Range,
				p.Done, p.Total, p.Rejected, p.Skipped, preview(p.Error, 60))
		}
	}
	if len(v.Outbox) > 0 {
		fmt.Fprintln(tw, "\nNOTIFICATION\tTOPIC\tSTATE\tTRIES\tLAST ERROR")
		for _, m := range v.Outbox {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", m.Key, m.Topic, m.Status, m.Tries, preview(m.LastError, 60))
		}
	}
	if len(v.Audit) > 0 {
		fmt.Fprintln(tw, "\nAUDIT\tOPERATOR\tCOMMAND\tREASON\tDETAILS")
		for _, a := range v.Audit {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", a.At.Format(time.RFC3339), a.Operator, a.Command, a.Reason, preview(a.Details, 60))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if v.Items != nil {
		if err := c.printItems(env, v.Items); err != nil {
			return err
		}
	}
	if c.Effects {
		c.printEffects(env, v)
	}
	return nil
}

// printItems writes a page of --items.
func (c *ShowCmd) printItems(env *Env, p *itemsPage) error {
	head := fmt.Sprintf("\n%s ITEMS: %d", strings.ToUpper(p.Status), p.Total)
	switch {
	case p.Total == 0:
		fmt.Fprintf(env.Stdout, "%s (no batch item of this run is %s)\n", head, p.Status)
		return nil
	case p.Next != "" || c.After != "":
		head += fmt.Sprintf(", %d listed", len(p.Items))
		if c.After != "" {
			head += " after " + c.After
		}
	}
	fmt.Fprintln(env.Stdout, head)
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ITEM\tREASON\tOUTPUT")
	for _, it := range p.Items {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", it.ID, preview(it.Reason, 80), preview(string(it.Output), 40))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if p.Next != "" {
		fmt.Fprintf(env.Stdout, "next page: %s show %s --items %s --limit %d --after %s (or --all)\n", env.Name, c.RunID, p.Status, c.Limit, p.Next)
	}
	return nil
}

// printEffects writes the EFFECTS section of --effects: each effect step's
// plan, then each chunk plan of the batch steps.
func (c *ShowCmd) printEffects(env *Env, v showView) {
	fmt.Fprintln(env.Stdout, "\nEFFECTS")
	n := 0
	for _, s := range v.Steps {
		if s.Plan == nil {
			continue
		}
		n++
		state := "applied"
		if !s.Plan.Applied {
			state = "planned, not known to be applied (a rerun finishes it)"
		}
		id := s.Plan.EffectID
		if id == "" {
			id = "same-store transaction"
		}
		fmt.Fprintf(env.Stdout, "%s  on %s  [%s]  %s\n", s.ID, s.Plan.Target, id, state)
		printWrites(env, s.Plan.Writes)
	}
	for _, p := range v.ChunkPlans {
		n++
		state := p.Status
		switch p.Status {
		case checkpoint.StepPlanned:
			state = "planned, not known to be applied (a rerun finishes it)"
		case checkpoint.ChunkSuperseded:
			state = "superseded: lost a race to another writer, nothing of it applied"
		}
		items := ""
		if len(p.Items) > 0 {
			items = fmt.Sprintf("  %s: %s", plural(len(p.Items), "item"), p.Items[0].Key)
			if len(p.Items) > 1 {
				items += " .. " + p.Items[len(p.Items)-1].Key
			}
		}
		fmt.Fprintf(env.Stdout, "%s chunk  on %s  [%s]  %s%s\n", p.Step, p.Target, p.EffectID, state, items)
		printWrites(env, p.Writes)
	}
	if rest := v.ChunkPlansTotal - int64(len(v.ChunkPlans)); rest > 0 {
		fmt.Fprintf(env.Stdout, "... and %s not listed (--limit %d): --all lists every one\n",
			plural(int(rest), "more chunk plan"), c.Limit)
	}
	for _, b := range v.Batches {
		if b.target != "" && b.Completed > 0 && !hasChunkPlans(v, b.Step) && v.ChunkPlansTotal == int64(len(v.ChunkPlans)) {
			fmt.Fprintf(env.Stdout, "%s: %d items applied their effects to %s; their chunk plans were not recorded "+
				"(a same-store run by a Stepwise older than chunk plans)\n", b.Step, b.Completed, b.target)
			n++
		}
	}
	if n == 0 {
		fmt.Fprintln(env.Stdout, "no step of this run has effects")
	}
}

func hasChunkPlans(v showView, step string) bool {
	for _, p := range v.ChunkPlans {
		if p.Step == step {
			return true
		}
	}
	return false
}

func printWrites(env *Env, ws []checkpoint.Write) {
	for _, w := range ws {
		fmt.Fprintf(env.Stdout, "    %s: %d -> %d  (%+d, version %d -> %d)\n", w.Key, w.OldValue, w.NewValue,
			w.NewValue-w.OldValue, w.OldVersion, w.OldVersion+1)
	}
}

// batches counts each batch step's items by status and lists its skipped
// items (retried with --retry-skipped).
func batches(env *Env, st checkpoint.Backend, runID string, recorded []checkpoint.Step) ([]batchView, error) {
	counts, err := st.ItemCounts(env.Ctx, runID)
	if err != nil {
		return nil, err
	}
	var out []batchView
	for _, c := range counts {
		if len(out) == 0 || out[len(out)-1].Step != c.Step {
			b := batchView{Step: c.Step, Total: -1}
			for _, s := range recorded {
				var sum steps.BatchSummary
				if s.ID == c.Step && json.Unmarshal(s.Output, &sum) == nil {
					b.Total, b.target = sum.Total, sum.Target
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
		if out[i].Skipped == 0 {
			continue
		}
		q := checkpoint.ItemQuery{RunID: runID, Step: out[i].Step, Status: checkpoint.ItemSkipped, Limit: maxSkippedShown}
		err := st.Items(env.Ctx, q, func(it checkpoint.Item) error {
			out[i].SkippedItems = append(out[i].SkippedItems, itemView{Key: it.Key, Error: it.Error})
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
