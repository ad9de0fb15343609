package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
	"github.com/stepwise-run/stepwise/steps"
)

// The JSON shapes of the results commands print with --json, one document
// on stdout per command (dispatch --every: one line per pass). Field names
// are snake_case and stable: scripts read them. Errors still go to stderr
// and the exit code is the command's usual one.

// jobView is a registered job in `jobs --json`.
type jobView struct {
	Name   string      `json:"name"`
	Help   string      `json:"help"`
	Params []paramView `json:"params"`
}

// paramView is one of a job's parameters in `jobs --json`.
type paramView struct {
	Name     string `json:"name"`
	Type     string `json:"type"`             // string, int, bool, duration, ...
	Format   string `json:"format,omitempty"` // e.g. date
	Key      bool   `json:"key"`              // identifies the run
	Required bool   `json:"required"`
	Default  string `json:"default,omitempty"`
	Help     string `json:"help"`
}

func viewJobs(reg *jobs.Registry) []jobView {
	out := []jobView{}
	for _, j := range reg.Jobs() {
		v := jobView{Name: j.Name(), Help: j.Help(), Params: []paramView{}}
		for _, p := range j.Params() {
			v.Params = append(v.Params, paramView{Name: p.Name, Type: p.Type, Format: p.Format, Key: p.Key,
				Required: p.Required, Default: p.Default, Help: p.Help})
		}
		out = append(out, v)
	}
	return out
}

// runResultView is a run's outcome in `run --json`, `resume --json` and
// each date of `backfill --json`.
type runResultView struct {
	RunID   string `json:"run_id"`
	Status  string `json:"status"` // succeeded, failed, interrupted, ...
	Attempt int    `json:"attempt"`
	// Executed, Skipped and Failed count this attempt's steps: run and
	// completed, returned from their checkpoints, and failed.
	Executed int `json:"executed"`
	Skipped  int `json:"skipped"`
	Failed   int `json:"failed"`
	// Effects counts compare-and-set writes applied; Conflicts those that
	// found another writer's version, and Replans the plans made again.
	Effects      int    `json:"effects"`
	Conflicts    int    `json:"conflicts"`
	Replans      int    `json:"replans"`
	TookOverFrom string `json:"took_over_from,omitempty"`
	// ExitCode is the command's exit code for this outcome alone.
	ExitCode int `json:"exit_code"`
	// Error is why the run did not succeed; Note says why nothing ran
	// although that is fine (the run had already succeeded).
	Error string `json:"error,omitempty"`
	Note  string `json:"note,omitempty"`
	// Resume is the command that resumes an interrupted run.
	Resume string `json:"resume,omitempty"`
}

func viewResult(env *Env, res runner.Result, err error) runResultView {
	v := runResultView{RunID: res.RunID, Status: res.Status, Attempt: res.Attempt,
		Executed: res.Stats.Executed, Skipped: res.Stats.Skipped, Failed: res.Stats.Failed,
		Effects: res.Stats.Effects, Conflicts: res.Stats.Conflicts, Replans: res.Stats.Replans,
		TookOverFrom: res.TookOverFrom, ExitCode: ExitCode(err)}
	switch {
	case err == nil:
	case v.ExitCode == ExitOK:
		v.Note = ops.UserText(err.Error())
	default:
		v.Error = ops.UserText(err.Error())
	}
	if res.Status == checkpoint.RunInterrupted {
		v.Resume = env.Name + " resume " + res.RunID
	}
	return v
}

// printResultJSON prints a run's outcome as JSON and returns the error the
// command returns: nil when the outcome is fine although err is not (the
// run had already succeeded), so that Execute does not print it on stdout
// after the JSON.
// A run refused because it had already succeeded is reported as
// succeeded, under the ID the runner returns.
func printResultJSON(env *Env, res runner.Result, err error) error {
	if res.Status == "" {
		if !errors.Is(err, checkpoint.ErrAlreadySucceeded) || res.RunID == "" {
			return err // refused before a run existed, or held: the error says why
		}
		res.Status = checkpoint.RunSucceeded
		res.Attempt = succeededAttempt(env, res.RunID)
	}
	v := viewResult(env, res, err)
	if werr := writeJSON(env.Stdout, v); werr != nil {
		return werr
	}
	if v.ExitCode == ExitOK {
		return nil
	}
	return err
}

// succeededAttempt is the number of the attempt that made a recorded run
// succeed (a claim refused because it had leaves the result without one),
// 0 only when the store cannot say.
func succeededAttempt(env *Env, runID string) int {
	st, err := env.ExistingStore()
	if err != nil {
		return 0
	}
	info, err := st.Run(env.Ctx, runID)
	if err != nil {
		return 0
	}
	n := 0
	for _, a := range info.Attempts {
		if a.Status == checkpoint.RunSucceeded || n == 0 {
			n = a.Number
		}
	}
	return n
}

// dryRunView is `run --dry-run --json`: every step's full plan, not
// shortened like the text.
type dryRunView struct {
	RunID  string `json:"run_id"`
	DryRun bool   `json:"dry_run"` // always true: nothing was applied or checkpointed
	// Plans are the steps' planned effects in the order the job made them;
	// a write's new version is old_version + 1.
	Plans []steps.DryPlan `json:"plans"`
	// WouldRun counts the steps that would run, Checkpointed those already
	// done that a real run skips.
	WouldRun     int    `json:"would_run"`
	Checkpointed int    `json:"checkpointed"`
	Error        string `json:"error,omitempty"`
}

func printDryRunJSON(env *Env, res runner.Result, err error) error {
	if res.RunID == "" && err != nil {
		return err
	}
	v := dryRunView{RunID: res.RunID, DryRun: true, Plans: res.DryPlans,
		WouldRun: res.Stats.Executed, Checkpointed: res.Stats.Skipped}
	if v.Plans == nil {
		v.Plans = []steps.DryPlan{}
	}
	if err != nil {
		v.Error = err.Error()
	}
	if werr := writeJSON(env.Stdout, v); werr != nil {
		return werr
	}
	return err
}

// backfillView is `backfill --json`: the plan per date and, unless a dry
// run, each started run's outcome.
type backfillView struct {
	Job       string             `json:"job"`
	From      string             `json:"from"`
	To        string             `json:"to"`
	Reprocess string             `json:"reprocess"`
	DryRun    bool               `json:"dry_run"`
	Dates     []backfillDateView `json:"dates"`
}

// backfillDateView is one business date of a backfill.
type backfillDateView struct {
	Date  string `json:"date"`
	RunID string `json:"run_id"`
	// Existing is the status of the date's run before the backfill, empty
	// if it had none.
	Existing string `json:"existing,omitempty"`
	// Action is start, resume, rerun or skip; Reason says why (skip) or
	// how (rerun: forced).
	Action string `json:"action"`
	Reason string `json:"reason,omitempty"`
	// Result is the run's outcome, absent for a skipped date, a dry run,
	// or a date not reached before an interruption.
	Result *runResultView `json:"result,omitempty"`
}

func viewBackfill(c *BackfillCmd, plans []ops.BackfillPlan, results []*runResultView) backfillView {
	v := backfillView{Job: c.Job, From: c.From, To: c.To, Reprocess: c.Reprocess, DryRun: c.DryRun, Dates: []backfillDateView{}}
	for i, p := range plans {
		action, reason, _ := strings.Cut(backfillActionText(p), " (")
		d := backfillDateView{Date: p.Date, RunID: p.RunID, Action: action, Reason: strings.TrimSuffix(reason, ")"), Existing: p.Existing}
		if i < len(results) {
			d.Result = results[i]
		}
		v.Dates = append(v.Dates, d)
	}
	return v
}

// pruneView is `prune --json`.
type pruneView struct {
	DryRun    bool     `json:"dry_run"`
	OlderThan string   `json:"older_than"`
	Cutoff    string   `json:"cutoff"` // RFC 3339: runs finished before it
	Runs      []string `json:"runs"`   // IDs of the runs pruned (or that would be)
	Steps     int64    `json:"steps"`  // step checkpoints whose payloads went
	Items     int64    `json:"items"`  // item checkpoints deleted
	Bytes     int64    `json:"bytes"`  // payload bytes freed
	// IdempotencyKeys counts the API's Idempotency-Keys of those runs
	// deleted (or that would be).
	IdempotencyKeys int64 `json:"idempotency_keys"`
}

// dispatchView is one dispatch pass in `dispatch --json`.
type dispatchView struct {
	Sent   int    `json:"sent"`
	Failed int    `json:"failed"`         // retried on a later pass
	Dead   int    `json:"dead,omitempty"` // failed for the last time (--max-tries)
	Left   int    `json:"left,omitempty"` // not delivered before the claim's window ran out
	Error  string `json:"error,omitempty"`
}

// writeJSONLine writes v as one line of JSON, for commands that print a
// result per pass.
func writeJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// errJSONOnStdout is returned when --json and a delivery to stdout would
// mix on stdout.
var errJSONOnStdout = errors.New("--json prints each pass's result on stdout, where --to stdout delivers the messages; " +
	"deliver to file:PATH or a webhook, or drop --json")
