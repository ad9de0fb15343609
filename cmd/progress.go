package cmd

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/schollz/progressbar/v3"

	"github.com/stepwise-run/stepwise/steps"
)

// progress shows batch steps' progress of run and resume: a live bar on a
// terminal; otherwise the runner logs a progress line every few seconds
// (runner.Config.ProgressLog), as it does for serve and backfill.
//
// While a bar is up, log lines must go through the progress (it is the
// log's writer, see Write): each line clears the bar first, so no line
// lands on the bar's, and the bar is drawn again by the next chunk. The
// bar is drawn only from report, never from a timer, so nothing is
// written after close.
type progress struct {
	mode string // bar, log or none
	w    io.Writer
	mu   sync.Mutex
	bar  *progressbar.ProgressBar
	step string
	desc string // the bar's description: the step and its rejected and skipped counts
	// shown is set while the bar may be on the screen: drawn by report
	// and not cleared since.
	shown bool
}

func newProgress(mode string, w io.Writer) *progress {
	if mode == "auto" {
		mode = "log"
		if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			mode = "bar"
		}
	}
	return &progress{mode: mode, w: w}
}

// logEvery is the runner's ProgressLog for this display: the runner's
// default in log mode, none when a bar shows progress or none is wanted.
func (p *progress) logEvery() time.Duration {
	if p.mode == "log" {
		return 0
	}
	return -1
}

// hook is the runner's OnProgress: nil unless a bar is shown.
func (p *progress) hook() func(steps.Progress) {
	if p.mode != "bar" {
		return nil
	}
	return p.report
}

// report draws a batch step's progress on the bar.
func (p *progress) report(pr steps.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	desc := pr.Step
	if pr.Rejected > 0 || pr.Skipped > 0 {
		desc = fmt.Sprintf("%s (%d rejected, %d skipped)", pr.Step, pr.Rejected, pr.Skipped)
	}
	if p.bar == nil || p.step != pr.Step {
		p.clearBar()
		p.step, p.desc = pr.Step, desc
		p.bar = progressbar.NewOptions64(pr.Total,
			progressbar.OptionSetWriter(p.w),
			progressbar.OptionSetDescription(desc),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("items"),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
			// No spinner timer for an unknown total: the bar would be
			// redrawn between a log line's clear and its write, and
			// after close.
			progressbar.OptionSetSpinnerChangeInterval(0),
		)
	}
	p.bar.Set64(pr.Done)
	if desc != p.desc { // Describe draws too (throttled), so after the count
		p.desc = desc
		p.bar.Describe(desc)
	}
	p.shown = true
}

// Write writes one log line, clearing the bar first if one is shown.
func (p *progress) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil && p.shown {
		p.bar.Clear()
		p.shown = false
	}
	return p.w.Write(b)
}

// clearBar erases the current bar, if any, and forgets it.
func (p *progress) clearBar() {
	if p.bar != nil {
		if p.shown {
			p.bar.Clear()
		}
		p.bar.Exit()
		p.bar, p.shown = nil, false
	}
}

// close erases the bar, so the run's outcome is printed on a clean line.
func (p *progress) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearBar()
}
