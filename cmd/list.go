package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mattn/go-isatty"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// JobsCmd lists registered jobs.
type JobsCmd struct {
	JSON bool `name:"json" help:"Print JSON (each job's name, help and parameters) instead of a table."`
}

// Run implements the jobs command.
func (c *JobsCmd) Run(env *Env) error {
	views := viewJobs(env.Registry)
	if c.JSON {
		return writeJSON(env.Stdout, views)
	}
	if len(views) == 0 {
		fmt.Fprintln(env.Stdout, "no jobs are registered in this program")
		return nil
	}
	// One tabwriter for every line: the descriptions of the jobs and of
	// their parameters all start in one column.
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	for _, j := range views {
		fmt.Fprintf(tw, "%s\t%s\n", j.Name, j.Help)
		for _, p := range j.Params {
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
			value := p.Type
			if p.Format != "" {
				value = p.Format
			}
			fmt.Fprintf(tw, "  -p %s=%s\t%s%s\n", p.Name, strings.ToUpper(value), p.Help, extra)
		}
	}
	return tw.Flush()
}

// RunsCmd lists runs.
type RunsCmd struct {
	Job    string `help:"Only runs of this job."`
	Status string `placeholder:"STATUS" help:"Only runs with this status: queued (waiting for a worker), running, stale (left running by a runner that is gone), succeeded, failed, interrupted or abandoned; every status if not given."`
	Limit  int    `default:"100" nonzero:"" help:"At most this many runs (at least 1)."`
	JSON   bool   `name:"json" help:"Print JSON instead of a table."`
}

// stale reports whether a run is left running by a runner that is gone.
func stale(r checkpoint.Run, now time.Time) bool { return ops.Stale(r, now) }

func optTime(t time.Time) *time.Time { return ops.OptTime(t) }

// statusText is a run's status for tables, with staleness spelled out.
func statusText(r checkpoint.Run, now time.Time) string {
	switch {
	case r.Stale(now):
		return fmt.Sprintf("stale (runner %s silent since %s)", checkpoint.OwnerName(r.LeaseOwner), ago(r.LeaseUntil, now))
	case stale(r, now):
		return fmt.Sprintf("stale (runner %s is gone: its process exited)", checkpoint.OwnerName(r.LeaseOwner))
	case r.Status == checkpoint.RunQueued:
		text := fmt.Sprintf("queued (%s, priority %d", r.Queue, r.Priority)
		if r.AvailableAt.After(now) {
			text += ", not before " + r.AvailableAt.Format(time.RFC3339)
		}
		return text + ")"
	case !ops.NextTry(r, now).IsZero():
		return fmt.Sprintf("%s (back in queue %s after a fault: next try at %s, %s)", r.Status, r.Queue,
			r.AvailableAt.UTC().Format(time.RFC3339), ago(r.AvailableAt, now))
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
	if err := ops.CheckRunStatus(c.Status); err != nil {
		return usageError{fmt.Errorf("--status: %w", err)}
	}
	st, err := env.ReadStore()
	if err != nil {
		return err
	}
	now := ops.Now(env.Ctx, st, env.now())
	runs, _, err := ops.ListRunRecords(env.Ctx, st, ops.RunsQuery{Job: c.Job, Status: c.Status, Limit: c.Limit}, now)
	if err != nil {
		return err
	}
	if err := c.checkJob(env, st, len(runs) > 0); err != nil {
		return err
	}
	if c.JSON {
		views := make([]ops.RunView, 0, len(runs))
		for _, r := range runs {
			views = append(views, ops.ViewRun(r, now))
		}
		return writeJSON(env.Stdout, views)
	}
	if len(runs) == 0 {
		fmt.Fprintln(env.Stdout, c.noneText(env))
		return nil
	}
	col := colours(env.Stdout)
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "RUN\t%s\tUPDATED\tERROR\n", col.header("STATUS"))
	for _, r := range runs {
		status := col.status(r, statusText(r, now), now)
		if r.Status == checkpoint.RunRunning {
			// A running run's partitioned step: how far its partitions got.
			if ps, err := ops.RunPartitions(env.Ctx, st, r.ID, now); err == nil && len(ps) > 0 {
				status += partitionsNote(ps)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.ID, status, ago(r.UpdatedAt, now), preview(r.Error, 60))
	}
	return tw.Flush()
}

// noneText is what runs prints when it lists none: "no runs yet" only
// when nothing filtered them out, else which runs there are none of.
func (c *RunsCmd) noneText(env *Env) string {
	if c.Job == "" && c.Status == "" {
		return fmt.Sprintf("no runs yet; start one with `%s run JOB -p NAME=VALUE`", env.Name)
	}
	what := "runs"
	if c.Status != "" {
		what = c.Status + " runs"
	}
	if c.Job != "" {
		what += " of job " + c.Job
	}
	return "no " + what + "; `" + env.Name + " runs` lists every run"
}

// checkJob refuses --job naming a job this program does not register and
// the database has no runs of (a typo, most likely). A job no longer
// registered whose runs are still recorded is listed, with a note.
func (c *RunsCmd) checkJob(env *Env, st checkpoint.Backend, found bool) error {
	if c.Job == "" {
		return nil
	}
	if _, err := env.Registry.Lookup(c.Job); !errors.Is(err, jobs.ErrUnknownJob) {
		return nil
	}
	if !found && c.Status != "" { // the filter may be what hid its runs
		some, err := st.Runs(env.Ctx, checkpoint.RunFilter{Job: c.Job, Limit: 1})
		if err != nil {
			return err
		}
		found = len(some) > 0
	}
	if found {
		fmt.Fprintf(env.Stderr, "note: job %q is not registered in %s; listing its recorded runs\n", c.Job, env.Name)
		return nil
	}
	var names []string
	for _, j := range env.Registry.Jobs() {
		names = append(names, j.Name())
	}
	registered := "none"
	if len(names) > 0 {
		registered = strings.Join(names, ", ")
	}
	return usageError{fmt.Errorf("--job %q: no such job: %s registers %s, and %s has no runs of it; `%s jobs` lists the jobs",
		c.Job, env.Name, registered, env.storeName(), env.Name)}
}

// preview is an error (or output) on one table line: without Go package
// prefixes, its spaces folded, at most n bytes.
func preview(s string, n int) string {
	s = strings.Join(strings.Fields(ops.UserText(s)), " ")
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

// palette colours statuses on a terminal (or wherever CLICOLOR_FORCE is
// set and not 0), unless NO_COLOR is set.
type palette struct{ on bool }

func colours(w io.Writer) palette {
	f, ok := w.(*os.File)
	tty := ok && isatty.IsTerminal(f.Fd())
	force := os.Getenv("CLICOLOR_FORCE")
	return palette{on: (tty || (force != "" && force != "0")) && os.Getenv("NO_COLOR") == ""}
}

// header is a column's header in a column whose cells are coloured: with
// a code pair of the cells' length around it, so tabwriter, which counts
// the codes' bytes, pads the header as it pads the cells.
func (p palette) header(text string) string {
	if !p.on {
		return text
	}
	return "\x1b[39m" + text + "\x1b[0m"
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

// partitionsNote sums up a running run's partitions for `runs`: how many
// are done, and their items done of the total, by owner.
func partitionsNote(ps []ops.PartitionView) string {
	var done, items, total int64
	owners := map[string]int{}
	for _, p := range ps {
		if p.State == checkpoint.PartitionDone {
			done++
		}
		if p.State == checkpoint.PartitionRunning {
			owner := p.Owner
			if p.Stale {
				owner += " (stale)"
			}
			owners[owner]++
		}
		items += p.Done
		total += p.Total
	}
	note := fmt.Sprintf(" (partitions %d/%d done, items %d/%d", done, len(ps), items, total)
	if len(owners) > 0 {
		names := make([]string, 0, len(owners))
		for o, n := range owners {
			names = append(names, fmt.Sprintf("%s×%d", o, n))
		}
		slices.Sort(names)
		note += ", running on " + strings.Join(names, " ")
	}
	return note + ")"
}
