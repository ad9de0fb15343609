package cmd

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mattn/go-isatty"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// JobsCmd lists registered jobs.
type JobsCmd struct{}

// Run implements the jobs command.
func (c *JobsCmd) Run(env *Env) error {
	for _, j := range env.Registry.Jobs() {
		fmt.Fprintf(env.Stdout, "%s\t%s\n", j.Name(), j.Help())
		for _, p := range j.Params() {
			var tags []string
			if p.Key {
				tags = append(tags, "identifies the run")
			} else if p.Required {
				tags = append(tags, "required")
			}
			if p.Default != "" {
				tags = append(tags, "default "+p.Default)
			}
			extra := ""
			if len(tags) > 0 {
				extra = " (" + strings.Join(tags, ", ") + ")"
			}
			fmt.Fprintf(env.Stdout, "  -p %s=%s\t%s%s\n", p.Name, strings.ToUpper(p.Type), p.Help, extra)
		}
	}
	return nil
}

// RunsCmd lists runs.
type RunsCmd struct {
	Job    string `help:"Only runs of this job."`
	Status string `enum:",running,succeeded,failed,interrupted,abandoned" default:"" help:"Only runs with this status (running, succeeded, failed, interrupted, abandoned)."`
	Limit  int    `default:"100" help:"At most this many runs."`
	JSON   bool   `name:"json" help:"Print JSON instead of a table."`
}

// runView is the JSON shape of a run in `runs --json` and `show --json`.
type runView struct {
	ID         string          `json:"id"`
	Job        string          `json:"job"`
	RunKey     string          `json:"run_key"`
	Status     string          `json:"status"`
	Stale      bool            `json:"stale"`
	Params     json.RawMessage `json:"params"`
	Fence      int64           `json:"fence"`
	LeaseOwner string          `json:"lease_owner,omitempty"`
	LeaseUntil *time.Time      `json:"lease_until,omitempty"`
	Error      string          `json:"error,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	UpdatedAt  time.Time       `json:"updated_at"`
	FinishedAt *time.Time      `json:"finished_at,omitempty"`
}

func viewRun(r checkpoint.Run, now time.Time) runView {
	return runView{
		ID: r.ID, Job: r.Job, RunKey: r.RunKey, Status: r.Status, Stale: stale(r, now), Params: r.Params,
		Fence: r.Fence, LeaseOwner: r.LeaseOwner, LeaseUntil: optTime(r.LeaseUntil), Error: r.Error,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, FinishedAt: optTime(r.FinishedAt),
	}
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// stale reports whether a run is left running by a runner that is gone:
// its lease expired, or its owner's process surely exited (then run and
// resume take it over at once).
func stale(r checkpoint.Run, now time.Time) bool {
	return r.Stale(now) || (r.Status == checkpoint.RunRunning && runner.OwnerGone(r.LeaseOwner))
}

// statusText is a run's status for tables, with staleness spelled out.
func statusText(r checkpoint.Run, now time.Time) string {
	switch {
	case r.Stale(now):
		return fmt.Sprintf("stale (runner %s silent since %s)", checkpoint.OwnerName(r.LeaseOwner), ago(r.LeaseUntil, now))
	case stale(r, now):
		return fmt.Sprintf("stale (runner %s is gone: its process exited)", checkpoint.OwnerName(r.LeaseOwner))
	}
	return r.Status
}

func ago(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t).Round(time.Second)
	if d < 0 {
		return "in " + (-d).String()
	}
	return d.String() + " ago"
}

// Run implements the runs command.
func (c *RunsCmd) Run(env *Env) error {
	st, err := env.Store()
	if err != nil {
		return err
	}
	runs, err := st.Runs(env.Ctx, checkpoint.RunFilter{Job: c.Job, Status: c.Status, Limit: c.Limit})
	if err != nil {
		return err
	}
	now := env.now()
	if c.JSON {
		views := make([]runView, 0, len(runs))
		for _, r := range runs {
			views = append(views, viewRun(r, now))
		}
		return writeJSON(env.Stdout, views)
	}
	if len(runs) == 0 {
		fmt.Fprintln(env.Stdout, "no runs yet; start one with `stepwise run JOB -p NAME=VALUE`")
		return nil
	}
	col := colours(env.Stdout)
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSTATUS\tUPDATED\tERROR")
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.ID, col.status(r, statusText(r, now), now), ago(r.UpdatedAt, now), preview(r.Error, 60))
	}
	return tw.Flush()
}

// ShowCmd shows one run.
type ShowCmd struct {
	RunID   string `arg:"" name:"run-id" help:"Run ID, e.g. report/2026-11-28."`
	JSON    bool   `name:"json" help:"Print JSON instead of text."`
	Effects bool   `help:"Also list each step's recorded effect plan (key: old -> new, versions) and whether it applied."`
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
	ID         string          `json:"id"`
	Status     string          `json:"status"`
	Tries      int             `json:"tries"`
	Attempt    int             `json:"attempt"`
	Output     json.RawMessage `json:"output,omitempty"`
	InputHash  string          `json:"input_hash,omitempty"`
	Error      string          `json:"error,omitempty"`
	StartedAt  time.Time       `json:"started_at"`
	FinishedAt time.Time       `json:"finished_at"`
	Plan       *planView       `json:"plan,omitempty"`
}

// planView is a step's effect plan in `show --effects`.
type planView struct {
	steps.PlanRecord
	Applied bool `json:"applied"`
}

type showView struct {
	Run      runView              `json:"run"`
	Attempts []attemptView        `json:"attempts"`
	Steps    []stepView           `json:"steps"`
	Batches  []batchView          `json:"batches"`
	Audit    []checkpoint.Audit   `json:"audit"`
	Outbox   []checkpoint.Message `json:"outbox"`
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
}

type itemView struct {
	Key   string `json:"key"`
	Error string `json:"error"`
}

// maxSkippedShown bounds the skipped items `show` lists per batch step.
const maxSkippedShown = 50

// Run implements the show command.
func (c *ShowCmd) Run(env *Env) error {
	st, err := env.Store()
	if err != nil {
		return err
	}
	info, err := st.Run(env.Ctx, c.RunID)
	if err != nil {
		return err
	}
	now := env.now()
	v := showView{Run: viewRun(info.Run, now), Attempts: []attemptView{}, Steps: []stepView{}}
	for _, a := range info.Attempts {
		v.Attempts = append(v.Attempts, attemptView{Number: a.Number, Fence: a.Fence, Owner: a.Owner, Status: a.Status,
			Error: a.Error, StartedAt: a.StartedAt, FinishedAt: optTime(a.FinishedAt)})
	}
	err = st.Steps(env.Ctx, c.RunID, func(s checkpoint.Step) error {
		sv := stepView{ID: s.ID, Status: s.Status, Tries: s.Tries, Attempt: s.Attempt, InputHash: s.InputHash,
			Error: s.Error, StartedAt: s.StartedAt, FinishedAt: s.FinishedAt}
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
		v.Steps = append(v.Steps, sv)
		return nil
	})
	if err != nil {
		return err
	}
	if v.Batches, err = batches(env, st, c.RunID, v.Steps); err != nil {
		return err
	}
	if v.Audit, err = st.Audits(env.Ctx, c.RunID); err != nil {
		return err
	}
	if v.Audit == nil {
		v.Audit = []checkpoint.Audit{}
	}
	if v.Outbox, err = st.RunMessages(env.Ctx, c.RunID); err != nil {
		return err
	}
	if v.Outbox == nil {
		v.Outbox = []checkpoint.Message{}
	}
	if c.JSON {
		return writeJSON(env.Stdout, v)
	}
	r := info.Run
	fmt.Fprintf(env.Stdout, "run %s\n  job %s, key %s, params %s\n  status %s, fence %d, created %s, updated %s\n",
		r.ID, r.Job, r.RunKey, r.Params, statusText(r, now), r.Fence, r.CreatedAt.Format(time.RFC3339), ago(r.UpdatedAt, now))
	if r.Error != "" {
		fmt.Fprintf(env.Stdout, "  error: %s\n", r.Error)
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nATTEMPT\tOWNER\tSTATUS\tSTARTED\tTOOK\tERROR")
	for _, a := range v.Attempts {
		took := "-"
		if a.FinishedAt != nil {
			took = a.FinishedAt.Sub(a.StartedAt).Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", a.Number, checkpoint.OwnerName(a.Owner), a.Status, a.StartedAt.Format(time.RFC3339), took, preview(a.Error, 60))
	}
	fmt.Fprintln(tw, "\nSTEP\tSTATUS\tATTEMPT\tTRIES\tTOOK\tOUTPUT / ERROR")
	for _, s := range v.Steps {
		out := string(s.Output)
		if s.Error != "" {
			out = s.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", s.ID, s.Status, s.Attempt, s.Tries,
			s.FinishedAt.Sub(s.StartedAt).Round(time.Microsecond), preview(out, 60))
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
		for _, b := range v.Batches {
			for _, it := range b.SkippedItems {
				fmt.Fprintf(tw, "skipped %s/%s\t%s\n", b.Step, it.Key, preview(it.Error, 80))
			}
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
	if err := tw.Flush(); err != nil || !c.Effects {
		return err
	}
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
		for _, w := range s.Plan.Writes {
			fmt.Fprintf(env.Stdout, "    %s: %d -> %d  (version %d -> %d)\n", w.Key, w.OldValue, w.NewValue, w.OldVersion, w.OldVersion+1)
		}
	}
	if n == 0 {
		fmt.Fprintln(env.Stdout, "no step of this run has effects")
	}
	return nil
}

func preview(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// batches counts each batch step's items by status and lists its skipped
// items (retried with --retry-skipped).
func batches(env *Env, st *checkpoint.SQLite, runID string, stepViews []stepView) ([]batchView, error) {
	counts, err := st.ItemCounts(env.Ctx, runID)
	if err != nil {
		return nil, err
	}
	var out []batchView
	for _, c := range counts {
		if len(out) == 0 || out[len(out)-1].Step != c.Step {
			b := batchView{Step: c.Step, Total: -1}
			for _, s := range stepViews {
				var sum steps.BatchSummary
				if s.ID == c.Step && json.Unmarshal(s.Output, &sum) == nil {
					b.Total = sum.Total
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
		err := st.Items(env.Ctx, checkpoint.ItemQuery{RunID: runID, Step: out[i].Step, Status: checkpoint.ItemSkipped}, func(it checkpoint.Item) error {
			if len(out[i].SkippedItems) < maxSkippedShown {
				out[i].SkippedItems = append(out[i].SkippedItems, itemView{Key: it.Key, Error: it.Error})
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// palette colours statuses on a terminal, unless NO_COLOR is set.
type palette struct{ on bool }

func colours(w io.Writer) palette {
	f, ok := w.(*os.File)
	return palette{on: ok && isatty.IsTerminal(f.Fd()) && os.Getenv("NO_COLOR") == ""}
}

// status colours a run's status text: green succeeded, red failed, yellow
// stale or interrupted, grey abandoned. The codes have no width in the
// terminal but tabwriter counts them, so each code pair is the same length.
func (p palette) status(r checkpoint.Run, text string, now time.Time) string {
	if !p.on {
		return text
	}
	code := ""
	switch {
	case stale(r, now), r.Status == checkpoint.RunInterrupted:
		code = "33"
	case r.Status == checkpoint.RunSucceeded:
		code = "32"
	case r.Status == checkpoint.RunFailed:
		code = "31"
	case r.Status == checkpoint.RunAbandoned:
		code = "90"
	default:
		return "\x1b[39m" + text + "\x1b[0m"
	}
	return "\x1b[" + code + "m" + text + "\x1b[0m"
}
