package web

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/runner/ops"
)

// The job page's charts are SVG drawn by its template from the geometry
// computed here: no script, no library, nothing fetched. Colours come from
// the stylesheet (classes), so they follow the light and dark themes.
const (
	chartWidth  = 720 // the viewBox's width; the SVG scales to its box
	chartHeight = 140
	chartTop    = 8  // room above the tallest bar
	chartBottom = 18 // room below the bars for the first and last run keys
	chartLeft   = 56 // room for the scale's labels
	barGap      = 2
	minSlots    = 12 // the fewest bars the width is shared by
)

// chart is one bar chart: a bar per run, oldest left, each of one or more
// stacked segments.
type chart struct {
	ID, Label   string // element id, and what it shows for assistive technology
	Width       int
	Height      int
	Base        int // the bars' baseline (y)
	Left        int
	Max, Mid    string // the scale's labels, at the top and the middle
	MidY        int
	First, Last string // the first and last run keys, under the bars
	LastX       int    // where the last run's key ends
	Bars        []chartBar
	Legend      []chartLegend
}

// chartBar is one run's bar: its link, tooltip and segments.
type chartBar struct {
	Href, Title string
	X, W        int
	Segs        []chartSeg
}

// chartSeg is one stacked part of a bar.
type chartSeg struct {
	Class string
	Y, H  int
}

// chartLegend names a segment class.
type chartLegend struct{ Class, Name string }

// scale maps a value to a bar height within the chart.
func (c *chart) scale(max float64) func(float64) int {
	span := float64(c.Base - chartTop)
	return func(v float64) int {
		if max <= 0 || v <= 0 {
			return 0
		}
		return max1(int(v/max*span + 0.5))
	}
}

func max1(n int) int { return max(n, 1) } // a bar for a value above 0 is never invisible

// newChart lays out n bars.
func newChart(id, label string, runs []ops.RunPoint) chart {
	c := chart{ID: id, Label: label, Width: chartWidth, Height: chartHeight, Base: chartHeight - chartBottom, Left: chartLeft}
	c.MidY = (c.Base + chartTop) / 2
	if len(runs) > 0 {
		c.First, c.Last = runs[0].Key, runs[len(runs)-1].Key
	}
	// Bars are never wider than a twelfth of the chart: a job with two
	// runs so far shows two bars at the left, not two slabs.
	slot := (chartWidth - chartLeft) / max(len(runs), minSlots)
	for i, r := range runs {
		c.Bars = append(c.Bars, chartBar{Href: runURL(r.ID), X: chartLeft + i*slot + barGap/2, W: max(slot-barGap, 1), Title: r.Key})
	}
	c.LastX = chartLeft + len(runs)*slot
	if len(runs) < 3 { // no room for two keys apart
		c.Last = ""
	}
	return c
}

// durationChart is a bar per run, as tall as the time its attempts took,
// coloured by its status.
func durationChart(runs []ops.RunPoint) chart {
	c := newChart("duration-chart", fmt.Sprintf("Duration of the last %d runs, oldest first", len(runs)), runs)
	top := 0.0
	for _, r := range runs {
		top = max(top, r.Seconds)
	}
	h := c.scale(top)
	for i, r := range runs {
		b := &c.Bars[i]
		hi := h(r.Seconds)
		b.Segs = []chartSeg{{Class: "bar s-" + r.Status, Y: c.Base - hi, H: hi}}
		b.Title = fmt.Sprintf("%s: %s, took %s", r.Key, r.Status, duration(time.Duration(r.Seconds*float64(time.Second))))
	}
	c.Max, c.Mid = duration(time.Duration(top*float64(time.Second))), duration(time.Duration(top/2*float64(time.Second)))
	c.Legend = []chartLegend{{"s-succeeded", "succeeded"}, {"s-failed", "failed"}, {"s-running", "running"}, {"s-interrupted", "interrupted"}}
	return c
}

// itemsChart is a bar per run of its batch items stacked: posted at the
// bottom, then rejected, then skipped.
func itemsChart(runs []ops.RunPoint) chart {
	c := newChart("items-chart", fmt.Sprintf("Batch items of the last %d runs, oldest first: posted, rejected and skipped", len(runs)), runs)
	top := int64(0)
	for _, r := range runs {
		top = max(top, r.Posted+r.Rejected+r.Skipped)
	}
	h := c.scale(float64(top))
	for i, r := range runs {
		b := &c.Bars[i]
		y := c.Base
		for _, part := range []struct {
			class string
			n     int64
		}{{"seg-posted", r.Posted}, {"seg-rejected", r.Rejected}, {"seg-skipped", r.Skipped}} {
			hi := h(float64(part.n))
			if hi == 0 {
				continue
			}
			y -= hi
			b.Segs = append(b.Segs, chartSeg{Class: "bar " + part.class, Y: y, H: hi})
		}
		b.Title = fmt.Sprintf("%s: %s posted, %s rejected, %s skipped", r.Key, groupDigits(r.Posted), groupDigits(r.Rejected), groupDigits(r.Skipped))
	}
	c.Max, c.Mid = groupDigits(top), groupDigits(top/2)
	c.Legend = []chartLegend{{"seg-posted", "posted"}, {"seg-rejected", "rejected"}, {"seg-skipped", "skipped"}}
	return c
}

// jobPage is the data of a job's page.
type jobPage struct {
	common
	Job      string
	History  ops.JobHistory
	Counts   ops.RunCounts
	Duration chart
	Items    *chart // nil unless the runs have batch items
}

func (h *Handler) job(w http.ResponseWriter, r *http.Request, who Caller, known bool) {
	name := strings.TrimSpace(r.PathValue("name"))
	p := jobPage{common: h.common("Job "+name, "runs", who, known), Job: name}
	p.Refresh = int(h.cfg.Refresh.Milliseconds()) * 5
	now := ops.Now(r.Context(), h.cfg.Store, p.Now)
	var err error
	if p.History, err = ops.History(r.Context(), h.cfg.Store, name, ops.HistoryRuns, now); err == nil {
		p.Counts, err = ops.CountRuns(r.Context(), h.cfg.Store, ops.RunsQuery{Job: name}, now)
	}
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, "Job unavailable", "The job's runs could not be read; the server's log has why.", err)
		return
	}
	p.Duration = durationChart(p.History.Runs)
	if p.History.Batch {
		c := itemsChart(p.History.Runs)
		p.Items = &c
	}
	h.render(w, r, http.StatusOK, "job", p)
}

// statusCount is one status of the runs list's counts, with the query
// listing those runs.
type statusCount struct {
	Status  string
	Count   int64
	Query   string
	Current bool // the list is filtered by this status
}

// filterQuery is the runs list's query for the given filters.
func filterQuery(job, prefix, status string) string {
	q := url.Values{}
	if job != "" {
		q.Set("job", job)
	}
	if prefix != "" {
		q.Set("key", prefix)
	}
	if status != "" {
		q.Set("status", status)
	}
	return q.Encode()
}

// statusCounts are the counts at the top of the runs list: the runs the
// list's job and key filters select, by status, each linking to them.
func statusCounts(c ops.RunCounts, job, prefix, current string) []statusCount {
	out := make([]statusCount, 0, len(c.Counts))
	for _, sc := range c.Counts {
		out = append(out, statusCount{Status: sc.Status, Count: sc.Count, Query: filterQuery(job, prefix, sc.Status), Current: sc.Status == current})
	}
	return out
}
