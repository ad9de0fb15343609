package web

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// RefreshHeader marks the requests a page's script makes to refresh its
// live sections: the run page then leaves out its effects.
const RefreshHeader = "X-Stepwise-Refresh"

// runsPageSize is how many runs the runs list shows a page.
const runsPageSize = 50

// runStatuses are the statuses the runs list filters by.
var runStatuses = []string{checkpoint.RunRunning, ops.StatusStale, checkpoint.RunFailed, checkpoint.RunInterrupted,
	checkpoint.RunSucceeded, checkpoint.RunAbandoned}

// runsPage is the data of the runs list.
type runsPage struct {
	common
	Job, Status, Prefix string
	Statuses            []string
	Jobs                []string
	Runs                []ops.RunView
	// Counts are the runs the job and key filters select, by status;
	// Total is their sum.
	Counts []statusCount
	Total  int64
	// AllQuery is the query of the runs the job and key filters select,
	// of any status.
	AllQuery string
	// Next is the query of the next page ("" on the last one); First
	// says whether this is the first page.
	Next  string
	First bool
}

func (h *Handler) runs(w http.ResponseWriter, r *http.Request, who Caller, known bool) {
	q := r.URL.Query()
	p := runsPage{common: h.common("Runs", "runs", who, known), Job: strings.TrimSpace(q.Get("job")),
		Status: q.Get("status"), Prefix: strings.TrimSpace(q.Get("key")), Statuses: runStatuses, First: q.Get("after") == ""}
	p.Refresh = int(h.cfg.Refresh.Milliseconds())
	if p.Status != "" && !slices.Contains(runStatuses, p.Status) {
		h.fail(w, r, http.StatusBadRequest, "Unknown status", fmt.Sprintf("There is no run status %q; choose one of %s.",
			p.Status, strings.Join(runStatuses, ", ")), nil)
		return
	}
	rq := ops.RunsQuery{Job: p.Job, Status: p.Status, RunKeyPrefix: p.Prefix, Limit: runsPageSize}
	if a := q.Get("after"); a != "" {
		c, ok := parseCursor(a)
		if !ok {
			h.fail(w, r, http.StatusBadRequest, "Bad page", "The page asked for (after="+a+") is not one this list made; start from the first page.", nil)
			return
		}
		rq.After = &c
	}
	now := ops.Now(r.Context(), h.cfg.Store, p.Now)
	page, err := ops.ListRuns(r.Context(), h.cfg.Store, rq, now)
	var counts ops.RunCounts
	if err == nil {
		counts, err = ops.CountRuns(r.Context(), h.cfg.Store, ops.RunsQuery{Job: p.Job, RunKeyPrefix: p.Prefix}, now)
		p.Counts, p.Total = statusCounts(counts, p.Job, p.Prefix, p.Status), counts.Total
		p.AllQuery = filterQuery(p.Job, p.Prefix, "")
	}
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, "Runs unavailable", "The runs could not be read; the server's log has why.", err)
		return
	}
	p.Runs = page.Runs
	if page.Next != nil {
		nq := q
		nq.Set("after", formatCursor(*page.Next))
		p.Next = nq.Encode()
	}
	jobs := map[string]bool{}
	for _, r := range p.Runs {
		jobs[r.Job] = true
	}
	if h.cfg.Schedules != nil {
		if ss, err := h.cfg.Schedules(); err == nil {
			for _, s := range ss {
				jobs[s.Job] = true
			}
		}
	}
	for j := range jobs {
		p.Jobs = append(p.Jobs, j)
	}
	slices.Sort(p.Jobs)
	h.render(w, r, http.StatusOK, "runs", p)
}

// formatCursor and parseCursor carry a run listing's position in a query.
func formatCursor(c checkpoint.RunCursor) string {
	return c.CreatedAt.UTC().Format(time.RFC3339Nano) + "|" + c.ID
}

func parseCursor(s string) (checkpoint.RunCursor, bool) {
	at, id, ok := strings.Cut(s, "|")
	t, err := time.Parse(time.RFC3339Nano, at)
	if !ok || err != nil || id == "" {
		return checkpoint.RunCursor{}, false
	}
	return checkpoint.RunCursor{CreatedAt: t, ID: id}, true
}

// Bounds of what the run page lists; each says when it is cut.
const (
	itemsPageSize   = 50  // rejected or skipped items a page
	maxChunkPlans   = 100 // chunk plans the effects table reads without a search
	maxEffectKeys   = 500 // keys the effects table lists
	maxOutboxListed = 200
)

// runPage is the data of one run's page.
type runPage struct {
	common
	V        ops.ShowView
	Live     bool // running and not stale: refreshes fast
	Timeline []timelineRow
	Batches  []batchRow
	Rejected itemsTable
	Skipped  itemsTable
	Effects  effectsTable
	// Refreshing: the page's script asked for its live sections only;
	// the effects are left out.
	Refreshing bool
	Steps      []string // step IDs, for reset and rerun from a step
	Calling    []string // steps whose outside call's outcome is unknown
	Resolved   []string // outside calls an operator resolved (resolve --replace)
}

// timelineRow is one step on the run's timeline: where its bar starts and
// how long it is, in per mille of the run's span (set by the script).
type timelineRow struct {
	ops.StepView
	Offset, Width int
	Took          time.Duration
}

// batchRow is a batch step's progress.
type batchRow struct {
	ops.BatchView
	Known   bool    // Total is known
	Percent float64 // of Total done
	// Live says the batch is running now: its rate and ETA are shown
	// (once it stopped, the rate over one attempt's time would mislead).
	Live bool
	ETA  time.Duration
	// Partitions are the step's partitions when it is partitioned, each
	// with its own share done.
	Partitions []partitionRow
}

// partitionRow is one partition of a batch step's progress.
type partitionRow struct {
	ops.PartitionView
	Percent float64 // of Total done
}

// itemsTable is one page of a run's rejected or skipped items.
type itemsTable struct {
	Status string
	Page   *ops.ItemsPage
	// More is the query of the next page; Shown says from which item.
	More  string
	After string
}

// effectsTable is each key's before -> after over the run's effect steps
// and the chunk plans read.
type effectsTable struct {
	Keys       []keyEffect
	Search     string
	Matched    int   // keys matching Search (Keys holds the first maxEffectKeys)
	Plans      int   // chunk plans read
	PlansTotal int64 // chunk plans recorded
	Superseded int   // plans read that lost a race and applied nothing
}

// keyEffect is what the run did to one key: its value before the run's
// first write and after its last, with every write.
type keyEffect struct {
	Target, Key   string
	Before, After int64
	Writes        []keyWrite
	// Pending is set when a write is planned, not known to be applied.
	Pending bool
}

// Delta is the key's net change.
func (k keyEffect) Delta() int64 { return k.After - k.Before }

// keyWrite is one write of a key, by a step or a chunk plan.
type keyWrite struct {
	Step, Chunk   string
	Before, After int64
	State         string // applied, planned, not applied
}

func (h *Handler) run(w http.ResponseWriter, r *http.Request, who Caller, known bool) {
	id := r.PathValue("id")
	ctx, q := r.Context(), r.URL.Query()
	now := ops.Now(ctx, h.cfg.Store, h.cfg.Now())
	// A page's own refresh (its script asks every few seconds) leaves the
	// effects out: reading chunk plans is the page's heaviest part, and
	// they change only while a batch runs.
	refresh := r.Header.Get(RefreshHeader) != ""
	v, err := ops.Show(ctx, h.cfg.Store, id, ops.ShowOptions{Effects: !refresh, ChunkPlans: maxChunkPlans}, now)
	if errors.Is(err, checkpoint.ErrNotFound) {
		h.fail(w, r, http.StatusNotFound, "No such run", fmt.Sprintf("There is no run %q in this store; the runs list has those there are.", id), nil)
		return
	}
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, "Run unavailable", "Run "+id+" could not be read; the server's log has why.", err)
		return
	}
	p := runPage{common: h.common(id, "runs", who, known), V: v}
	p.Live = v.Run.Status == checkpoint.RunRunning && !v.Run.Stale
	p.Refresh = int(h.cfg.Refresh.Milliseconds())
	if !p.Live {
		p.Refresh *= 5 // still notices an operation from elsewhere
	}
	p.Timeline = timeline(v, now)
	for _, s := range p.Timeline {
		p.Steps = append(p.Steps, s.ID)
		if s.Status == checkpoint.StepCalling {
			p.Calling = append(p.Calling, s.ID)
		}
	}
	for _, s := range v.Steps {
		if s.Call != nil && s.Call.Resolved != nil {
			p.Resolved = append(p.Resolved, s.ID)
		}
	}
	for _, b := range v.Batches {
		row := progress(b, p.Live)
		for _, pv := range v.Partitions {
			if pv.Step != b.Step {
				continue
			}
			pr := partitionRow{PartitionView: pv, Percent: 100}
			if pv.Total > 0 {
				pr.Percent = min(100, float64(pv.Done)*100/float64(pv.Total))
			}
			row.Partitions = append(row.Partitions, pr)
		}
		p.Batches = append(p.Batches, row)
	}
	for _, t := range []struct {
		status string
		dst    *itemsTable
	}{{checkpoint.StepRejected, &p.Rejected}, {checkpoint.ItemSkipped, &p.Skipped}} {
		it, err := h.items(r, v, t.status)
		if err != nil {
			h.fail(w, r, http.StatusInternalServerError, "Run unavailable", "The items of run "+id+" could not be read; the server's log has why.", err)
			return
		}
		*t.dst = it
	}
	if p.Refreshing = refresh; !refresh {
		if p.Effects, err = h.effects(r, v, strings.TrimSpace(q.Get("key"))); err != nil {
			h.fail(w, r, http.StatusInternalServerError, "Run unavailable", "The effects of run "+id+" could not be read; the server's log has why.", err)
			return
		}
	}
	if len(p.V.Outbox) > maxOutboxListed {
		p.V.Outbox = p.V.Outbox[:maxOutboxListed]
	}
	h.render(w, r, http.StatusOK, "run", p)
}

// items reads one page of the run's items of a status; the page's start
// comes from the query (STATUS_step and STATUS_key: after that item).
func (h *Handler) items(r *http.Request, v ops.ShowView, status string) (itemsTable, error) {
	q := r.URL.Query()
	t := itemsTable{Status: status}
	iq := ops.ItemsQuery{RunID: v.Run.ID, Status: status, AfterStep: q.Get(status + "_step"), AfterKey: q.Get(status + "_key"), Limit: itemsPageSize}
	if iq.AfterStep != "" {
		t.After = iq.AfterStep + "/" + iq.AfterKey
	}
	page, err := ops.Items(r.Context(), h.cfg.Store, iq, v.Batches)
	if err != nil {
		return t, err
	}
	t.Page = page
	if page.Next != "" && len(page.Items) > 0 {
		last := page.Items[len(page.Items)-1]
		nq := r.URL.Query()
		nq.Set(status+"_step", last.Step)
		nq.Set(status+"_key", last.Key)
		t.More = nq.Encode()
	}
	return t, nil
}

// timeline places each step on the run's span, from its creation to its
// end (or now).
func timeline(v ops.ShowView, now time.Time) []timelineRow {
	start, end := v.Run.CreatedAt, ended(v.Run, now)
	ss := slices.Clone(v.Steps)
	slices.SortStableFunc(ss, func(a, b ops.StepView) int { return a.StartedAt.Compare(b.StartedAt) })
	for _, s := range ss {
		if s.FinishedAt != nil && s.FinishedAt.After(end) {
			end = *s.FinishedAt
		}
	}
	span := end.Sub(start)
	rows := make([]timelineRow, 0, len(ss))
	for _, s := range ss {
		stop := now
		if s.FinishedAt != nil {
			stop = *s.FinishedAt
		} else if v.Run.Status != checkpoint.RunRunning || v.Run.Stale {
			stop = v.Run.UpdatedAt // not running now: it stopped when the run last moved
		}
		if stop.Before(s.StartedAt) {
			stop = s.StartedAt
		}
		row := timelineRow{StepView: s, Took: stop.Sub(s.StartedAt), Width: 1000}
		if span > 0 {
			row.Offset = clamp(int(s.StartedAt.Sub(start)*1000/span), 0, 1000)
			row.Width = clamp(int(stop.Sub(s.StartedAt)*1000/span), 4, 1000-row.Offset) // a quick step stays visible
		}
		rows = append(rows, row)
	}
	return rows
}

func clamp(n, lo, hi int) int { return max(lo, min(n, hi)) }

// ended is when a run stopped: its end, or its last move if it failed,
// was interrupted or its runner is gone; now while it runs.
func ended(r ops.RunView, now time.Time) time.Time {
	switch {
	case r.FinishedAt != nil:
		return *r.FinishedAt
	case r.Status == checkpoint.RunRunning && !r.Stale:
		return now
	}
	return r.UpdatedAt
}

// progress is a batch's share done and, while it runs, the time left at
// its rate.
func progress(b ops.BatchView, live bool) batchRow {
	row := batchRow{BatchView: b, Known: b.Total >= 0, Live: live}
	switch {
	case b.Total > 0:
		row.Percent = min(100, float64(b.Done)*100/float64(b.Total))
	case b.Total == 0:
		row.Percent = 100
	}
	if live && row.Known && b.RatePerSecond > 0 && b.Done < b.Total {
		row.ETA = time.Duration(float64(b.Total-b.Done) / b.RatePerSecond * float64(time.Second))
	}
	return row
}

// effectKeys collects what a run's effects did to each key, keeping the
// keys containing a search text (any case), at most maxEffectKeys of them
// (in the order met; the others are only counted).
type effectKeys struct {
	needle string
	byKey  map[[2]string]*keyEffect
	order  [][2]string
	t      *effectsTable
}

func (c *effectKeys) add(target, step, chunk, state string, w checkpoint.Write) {
	if c.needle != "" && !strings.Contains(strings.ToLower(w.Key), c.needle) {
		return
	}
	k := [2]string{target, w.Key}
	e := c.byKey[k]
	if e == nil {
		c.t.Matched++
		if len(c.order) == maxEffectKeys {
			return
		}
		e = &keyEffect{Target: target, Key: w.Key, Before: w.OldValue}
		c.byKey[k] = e
		c.order = append(c.order, k)
	}
	e.After = w.NewValue
	e.Pending = e.Pending || state == checkpoint.StepPlanned
	e.Writes = append(e.Writes, keyWrite{Step: step, Chunk: chunk, Before: w.OldValue, After: w.NewValue, State: state})
}

func (c *effectKeys) plan(p ops.ChunkPlanView) {
	c.t.Plans++
	if p.Status == checkpoint.ChunkSuperseded {
		c.t.Superseded++
		return
	}
	for _, w := range p.Writes {
		c.add(p.Target, p.Step, p.EffectID, p.Status, w)
	}
}

// effects gathers each key's writes from the effect steps' plans and the
// chunk plans, ordered by target and key. Without a search it reads the
// chunk plans Show read (the first maxChunkPlans); a search reads every
// chunk plan of the run, one at a time, keeping the matching keys.
func (h *Handler) effects(r *http.Request, v ops.ShowView, search string) (effectsTable, error) {
	t := effectsTable{Search: search, PlansTotal: v.ChunkPlansTotal}
	c := &effectKeys{needle: strings.ToLower(search), byKey: map[[2]string]*keyEffect{}, t: &t}
	for _, s := range v.Steps {
		if s.Plan == nil {
			continue
		}
		state := "applied"
		if !s.Plan.Applied {
			state = s.Status // planned (may have applied), or failed before applying
		}
		for _, w := range s.Plan.Writes {
			c.add(s.Plan.Target, s.ID, s.Plan.EffectID, state, w)
		}
	}
	if search == "" {
		for _, p := range v.ChunkPlans {
			c.plan(p)
		}
	} else {
		for _, b := range v.Batches {
			err := ops.StepChunkPlans(r.Context(), h.cfg.Store, v.Run.ID, b.Step, func(p ops.ChunkPlanView) error {
				c.plan(p)
				return nil
			})
			if err != nil {
				return t, err
			}
		}
	}
	for _, k := range c.order {
		t.Keys = append(t.Keys, *c.byKey[k])
	}
	slices.SortStableFunc(t.Keys, func(a, b keyEffect) int { return cmp.Or(cmp.Compare(a.Target, b.Target), cmp.Compare(a.Key, b.Key)) })
	return t, nil
}

// schedulesPage is the data of the schedules page.
type schedulesPage struct {
	common
	Schedules []scheduleRow
	Threshold time.Duration
}

// scheduleRow is a schedule with its misfire state: its view's Missed
// fires (ops.AddMissed, as `schedules` lists them) and what the
// scheduler is doing with it.
type scheduleRow struct {
	ops.ScheduleView
	State string // what the scheduler is doing with it, in words
}

// nextFiresListed bounds the next fires the schedules page lists.
const nextFiresListed = 5

func (h *Handler) schedules(w http.ResponseWriter, r *http.Request, who Caller, known bool) {
	p := schedulesPage{common: h.common("Schedules", "schedules", who, known), Threshold: h.cfg.MisfireThreshold}
	p.Refresh = int(h.cfg.Refresh.Milliseconds()) * 5
	var scheds []runner.Schedule
	if h.cfg.Schedules != nil {
		var err error
		if scheds, err = h.cfg.Schedules(); err != nil {
			h.fail(w, r, http.StatusInternalServerError, "Schedules unavailable", "The schedules could not be built; the server's log has why.", err)
			return
		}
	}
	states, err := h.cfg.Store.Schedules(r.Context())
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, "Schedules unavailable", "The schedules' state could not be read; the server's log has why.", err)
		return
	}
	for _, s := range scheds {
		v, err := ops.ViewSchedule(s, states, p.Now, p.Now, nextFiresListed)
		if err != nil {
			h.fail(w, r, http.StatusInternalServerError, "Schedules unavailable", "Schedule "+s.Name+" could not be shown; the server's log has why.", err)
			return
		}
		row := scheduleRow{ScheduleView: v}
		h.misfires(&row, s, p.Now)
		p.Schedules = append(p.Schedules, row)
	}
	h.render(w, r, http.StatusOK, "schedules", p)
}

// misfires fills in a schedule's misfire state: the fires after its
// settle mark that are later than the misfire threshold allows.
func (h *Handler) misfires(row *scheduleRow, s runner.Schedule, now time.Time) {
	switch {
	case row.ServedSince == nil:
		row.State = "never served: no scheduler has fired it from this store"
		return
	case row.LeaseOwner != "":
		row.State = "fired by " + row.LeaseOwner
	default:
		row.State = "no scheduler holds it: fires are missed until serve runs"
	}
	_ = ops.AddMissed(&row.ScheduleView, s, now, h.cfg.MisfireThreshold) // a schedule that cannot list its fires shows none
	if row.Paused != nil {
		row.State = "paused: its fires are held; " + row.State
	}
}
