package cmd

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// ShowCmd shows one run.
type ShowCmd struct {
	RunID   string `arg:"" name:"run-id" help:"Run ID, e.g. settle/2026-11-28."`
	JSON    bool   `name:"json" help:"Print JSON instead of text."`
	Effects bool   `help:"Also list the recorded effect plans: each effect step's, and each chunk's of a batch step (its items; each key: before -> after, versions), and whether it applied. At most --limit chunk plans, and --limit keys of each plan, unless --all."`
	Items   string `placeholder:"STATUS" help:"Also list the batch items with this status (rejected or skipped, with their reasons; completed; planned), in step and key order: --limit at a time, the next page with --after, or --all."`
	Limit   int    `default:"50" help:"At most this many items (--items) and chunk plans (--effects)."`
	After   string `placeholder:"STEP/KEY" help:"With --items: list the items after this one (the last of the previous page, as printed)."`
	All     bool   `help:"List every item (--items) and chunk plan (--effects), not --limit of them."`
}

// itemStatuses are the item statuses show --items lists.
var itemStatuses = []string{"rejected", "skipped", "completed", "planned"}

// oneOf returns a usage error naming flag and the values it takes unless
// value is one of them or empty (not given): kong's enum would list the
// empty default as a value to give.
func oneOf(flag, value string, values []string) error {
	if value == "" || slices.Contains(values, value) {
		return nil
	}
	return usageError{fmt.Errorf("%s %q: use one of %s", flag, value, strings.Join(values, ", "))}
}

// validate checks the flags that depend on each other.
func (c *ShowCmd) validate() (limit int, after [2]string, err error) {
	if err := oneOf("--items", c.Items, itemStatuses); err != nil {
		return 0, after, err
	}
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
	st, err := env.ReadStore()
	if err != nil {
		return err
	}
	now := ops.Now(env.Ctx, st, env.now())
	v, err := ops.Show(env.Ctx, st, c.RunID, ops.ShowOptions{Effects: c.Effects, ChunkPlans: limit}, now)
	if err != nil {
		return err
	}
	if c.Items != "" {
		q := ops.ItemsQuery{RunID: c.RunID, Status: c.Items, AfterStep: after[0], AfterKey: after[1], Limit: limit}
		if v.Items, err = ops.Items(env.Ctx, st, q, v.Batches); err != nil {
			return err
		}
	}
	if c.JSON {
		return writeJSON(env.Stdout, v)
	}
	info, err := st.Run(env.Ctx, c.RunID)
	if err != nil {
		return err
	}
	return c.print(env, info.Run, v, now)
}

// took is a step's or attempt's duration, or "-" while it has no end.
func took(start time.Time, end *time.Time, round time.Duration) string {
	if end == nil || end.Before(start) {
		return "-"
	}
	return end.Sub(start).Round(round).String()
}

// print writes v as text.
func (c *ShowCmd) print(env *Env, r checkpoint.Run, v ops.ShowView, now time.Time) error {
	fmt.Fprintf(env.Stdout, "run %s\n  job %s, key %s, params %s\n  status %s, fence %d, created %s, updated %s\n",
		r.ID, r.Job, r.RunKey, r.Params, statusText(r, now), r.Fence, r.CreatedAt.Format(time.RFC3339), ago(r.UpdatedAt, now))
	if r.Error != "" {
		first, _, _ := strings.Cut(r.Error, "\n") // the rest (a panic's stack) follows the attempts
		fmt.Fprintf(env.Stdout, "  error: %s\n", ops.UserText(first))
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
			state := p.State
			if p.Stale {
				state = "stale"
			}
			fmt.Fprintf(tw, "%s#%d\t%s\t%s\t%s\t%d/%d\t%d\t%d\t%s\n", p.Step, p.Index, state, p.Owner, p.Range,
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
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", a.At.Format(time.RFC3339), a.Operator, a.Command, reasonLine(a.Reason), preview(a.Details, 60))
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
func (c *ShowCmd) printItems(env *Env, p *ops.ItemsPage) error {
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
func (c *ShowCmd) printEffects(env *Env, v ops.ShowView) {
	fmt.Fprintln(env.Stdout, "\nEFFECTS")
	keys := c.Limit // keys listed a plan
	if c.All {
		keys = 0
	}
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
		printWrites(env, s.Plan.Writes, keys)
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
		printWrites(env, p.Writes, keys)
	}
	if rest := v.ChunkPlansTotal - int64(len(v.ChunkPlans)); rest > 0 {
		fmt.Fprintf(env.Stdout, "... and %s not listed (--limit %d): --all lists every one\n",
			plural(int(rest), "more chunk plan"), c.Limit)
	}
	for _, b := range v.Batches {
		if b.Target != "" && b.Completed > 0 && !hasChunkPlans(v, b.Step) && v.ChunkPlansTotal == int64(len(v.ChunkPlans)) {
			fmt.Fprintf(env.Stdout, "%s: %s applied effects to %s; their chunk plans were not recorded "+
				"(a same-store run by a Stepwise older than chunk plans)\n", b.Step, plural(int(b.Completed), "item"), b.Target)
			n++
		}
	}
	if n == 0 {
		fmt.Fprintln(env.Stdout, "no step of this run has effects")
	}
}

func hasChunkPlans(v ops.ShowView, step string) bool {
	for _, p := range v.ChunkPlans {
		if p.Step == step {
			return true
		}
	}
	return false
}

// printWrites writes a plan's writes, at most limit of them (0: all) and
// then how many more there are.
func printWrites(env *Env, ws []checkpoint.Write, limit int) {
	if limit > 0 && len(ws) > limit {
		defer fmt.Fprintf(env.Stdout, "    ... and %s (--limit %d): --all lists every one\n", plural(len(ws)-limit, "more key"), limit)
		ws = ws[:limit]
	}
	for _, w := range ws {
		fmt.Fprintf(env.Stdout, "    %s: %d -> %d  (%+d, version %d -> %d)\n", w.Key, w.OldValue, w.NewValue,
			w.NewValue-w.OldValue, w.OldVersion, w.OldVersion+1)
	}
}

// reasonLine is a reason, which may span lines, on one line of a table: its
// line breaks shown as " / " (--json has it as recorded).
func reasonLine(s string) string {
	return strings.NewReplacer("\r\n", " / ", "\n", " / ", "\r", " / ", "\t", " ").Replace(s)
}
