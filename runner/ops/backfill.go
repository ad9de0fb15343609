package ops

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
)

// ErrBadBackfill is wrapped by PlanBackfill's refusals of its request: a
// job without exactly one identifying date parameter, dates that run
// backwards, a span of more than MaxBackfillDays.
var ErrBadBackfill = errors.New("bad backfill request")

// badBackfill is a refused backfill request: its message says what is
// wrong; it matches ErrBadBackfill.
type badBackfill struct{ msg string }

func (e *badBackfill) Error() string { return e.msg }
func (e *badBackfill) Unwrap() error { return ErrBadBackfill }

func refuseBackfill(format string, args ...any) error {
	return &badBackfill{fmt.Sprintf(format, args...)}
}

// MaxBackfillDays is the most dates one backfill plans (ten years).
const MaxBackfillDays = 3660

// Reprocess says what a backfill does with the dates that have a run.
type Reprocess string

// The Reprocess choices.
const (
	// ReprocessNone skips them: only dates without a run start.
	ReprocessNone Reprocess = "none"
	// ReprocessFailed also resumes failed, interrupted and stale runs.
	ReprocessFailed Reprocess = "failed"
	// ReprocessAll also reruns succeeded and abandoned runs, forced.
	ReprocessAll Reprocess = "all"
)

// BackfillRequest asks for one run of Job per business date, From to To
// (both included, dates in UTC), with the same other Params each.
type BackfillRequest struct {
	Job       jobs.Job
	From, To  time.Time
	Params    map[string]string
	Reprocess Reprocess
}

// BackfillAction is what a backfill does with one date.
type BackfillAction string

// The backfill actions.
const (
	BackfillStart  BackfillAction = "start"  // the date has no run
	BackfillResume BackfillAction = "resume" // its run failed, was interrupted or is stale
	BackfillRerun  BackfillAction = "rerun"  // its run succeeded or was abandoned: rerun, forced
	BackfillSkip   BackfillAction = "skip"   // left as it is (Why says why)
)

// BackfillPlan is what a backfill does with one date.
type BackfillPlan struct {
	Job    string            // the job's name
	Date   string            // YYYY-MM-DD
	RunID  string            // the date's run
	Values map[string]string // the run's parameters
	// Existing is the status of the date's run, "" if it has none.
	Existing string
	Action   BackfillAction
	// Why says why a date is skipped: "pruned", "running", "queued for a
	// worker", or its run's status.
	Why string
	// ReprocessResumes is true for a skip that ReprocessFailed resumes.
	ReprocessResumes bool
}

// Starts reports whether the plan starts (or resumes, or reruns) a run.
func (p BackfillPlan) Starts() bool { return p.Action != BackfillSkip }

// Force reports whether the plan's run is forced (a rerun).
func (p BackfillPlan) Force() bool { return p.Action == BackfillRerun }

// BackfillDateParam returns the name of job's one identifying date
// parameter (a key parameter of format "date"); a job with none, or two,
// is refused with ErrBadBackfill.
func BackfillDateParam(job jobs.Job) (string, error) {
	name := ""
	for _, p := range job.Params() {
		if p.Key && p.Format == "date" {
			if name != "" {
				return "", refuseBackfill("job %s has two date key parameters (%s, %s); backfill needs exactly one", job.Name(), name, p.Name)
			}
			name = p.Name
		}
	}
	if name == "" {
		return "", refuseBackfill("job %s has no identifying date parameter (a key param with format:\"date\"); backfill needs one", job.Name())
	}
	return name, nil
}

// PlanBackfill decides what a backfill does with each date of req, by the
// date's run in st (at now, for staleness).
func PlanBackfill(ctx context.Context, st checkpoint.Backend, req BackfillRequest, now time.Time) ([]BackfillPlan, error) {
	dateParam, err := BackfillDateParam(req.Job)
	if err != nil {
		return nil, err
	}
	if req.To.Before(req.From) {
		return nil, refuseBackfill("it ends (%s) before it begins (%s)", req.To.Format(time.DateOnly), req.From.Format(time.DateOnly))
	}
	if days := int(req.To.Sub(req.From).Hours()/24) + 1; days > MaxBackfillDays {
		return nil, refuseBackfill("%s to %s spans %d days; backfill at most ten years at a time",
			req.From.Format(time.DateOnly), req.To.Format(time.DateOnly), days)
	}
	var plans []BackfillPlan
	for d := req.From; !d.After(req.To); d = d.AddDate(0, 0, 1) {
		values := maps.Clone(req.Params)
		if values == nil {
			values = map[string]string{}
		}
		values[dateParam] = d.Format(time.DateOnly)
		dec, err := req.Job.Decode(values, nil)
		if err != nil {
			return nil, err
		}
		p := BackfillPlan{Job: req.Job.Name(), Date: values[dateParam], RunID: jobs.RunID(req.Job.Name(), dec.RunKey), Values: values, Action: BackfillStart}
		info, err := st.Run(ctx, p.RunID)
		switch {
		case errors.Is(err, checkpoint.ErrNotFound):
		case err != nil:
			return nil, err
		default:
			p.Existing = info.Run.Status
			p.decide(info.Run, req.Reprocess, now)
		}
		plans = append(plans, p)
	}
	return plans, nil
}

// decide sets what the backfill does with a date that has run.
func (p *BackfillPlan) decide(run checkpoint.Run, reprocess Reprocess, now time.Time) {
	p.Action = BackfillSkip
	switch {
	case !run.PrunedAt.IsZero():
		p.Why = "pruned"
	case run.Status == checkpoint.RunRunning && !Stale(run, now):
		p.Why = "running"
	case run.Status == checkpoint.RunQueued:
		p.Why = "queued for a worker"
	case run.Status == checkpoint.RunSucceeded || run.Status == checkpoint.RunAbandoned:
		p.Why = run.Status
		if reprocess == ReprocessAll {
			p.Action, p.Why = BackfillRerun, ""
		}
	case reprocess == ReprocessNone:
		p.Why, p.ReprocessResumes = run.Status, true
	default:
		p.Action = BackfillResume
	}
}

// RunBackfill runs the plans that start a run with r, up to parallel at
// once (r's job concurrency limits still hold), in date order; it starts
// none once ctx ends. request gives what each plan's runner.Request adds
// to the plan's job, parameters and Force (its audit records, say); done
// receives each outcome, one call at a time, as it comes. It returns when
// every started run has ended.
func RunBackfill(ctx context.Context, r *runner.Runner, plans []BackfillPlan, parallel int,
	request func(BackfillPlan) runner.Request, done func(i int, res runner.Result, err error)) {
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		slots = make(chan struct{}, max(parallel, 1))
	)
	for i, p := range plans {
		if !p.Starts() {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			req := request(p)
			req.Job, req.Values, req.Force = p.Job, p.Values, p.Force()
			res, err := r.Run(ctx, req)
			mu.Lock()
			defer mu.Unlock()
			done(i, res, err)
		})
	}
	wg.Wait()
}
