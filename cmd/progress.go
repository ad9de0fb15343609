package cmd

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"github.com/schollz/progressbar/v3"

	"github.com/stepwise-run/stepwise/steps"
)

// progressLogEvery is how often a batch step's progress is logged when
// stderr is not a terminal.
const progressLogEvery = 5 * time.Second

// progress shows batch steps' progress: a live bar on a terminal, a
// structured log line every few seconds otherwise.
type progress struct {
	mode    string // bar, log or none
	w       io.Writer
	log     zerolog.Logger
	mu      sync.Mutex
	bar     *progressbar.ProgressBar
	step    string
	lastLog time.Time
}

func newProgress(mode string, w io.Writer, log zerolog.Logger) *progress {
	if mode == "auto" {
		mode = "log"
		if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			mode = "bar"
		}
	}
	return &progress{mode: mode, w: w, log: log}
}

// report is the runner's OnProgress hook.
func (p *progress) report(pr steps.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch p.mode {
	case "bar":
		if p.bar == nil || p.step != pr.Step {
			p.finishBar()
			p.step = pr.Step
			p.bar = progressbar.NewOptions64(pr.Total,
				progressbar.OptionSetWriter(p.w),
				progressbar.OptionSetDescription(pr.Step),
				progressbar.OptionShowCount(),
				progressbar.OptionShowIts(),
				progressbar.OptionSetItsString("items"),
				progressbar.OptionSetPredictTime(true),
				progressbar.OptionThrottle(100*time.Millisecond),
				progressbar.OptionClearOnFinish(),
			)
		}
		desc := pr.Step
		if pr.Rejected > 0 || pr.Skipped > 0 {
			desc = fmt.Sprintf("%s (%d rejected, %d skipped)", pr.Step, pr.Rejected, pr.Skipped)
		}
		p.bar.Describe(desc)
		p.bar.Set64(pr.Done)
	case "log":
		now := time.Now()
		if now.Sub(p.lastLog) < progressLogEvery && pr.Done != pr.Total {
			return
		}
		p.lastLog = now
		ev := p.log.Info().Str(steps.FieldStepID, pr.Step).Int64("done", pr.Done).Int64("total", pr.Total).
			Int64("rejected", pr.Rejected).Int64("skipped", pr.Skipped).Int64("replayed", pr.Replayed)
		if el := now.Sub(pr.StartedAt).Seconds(); el > 0 && pr.Done > pr.Replayed {
			rate := float64(pr.Done-pr.Replayed) / el
			ev = ev.Float64("rate", rate)
			if pr.Total > 0 && rate > 0 {
				ev = ev.Dur("eta", time.Duration(float64(pr.Total-pr.Done)/rate*float64(time.Second)))
			}
		}
		ev.Msg("progress")
	}
}

// finishBar ends the current bar, if any.
func (p *progress) finishBar() {
	if p.bar != nil {
		p.bar.Finish()
		fmt.Fprintln(p.w)
		p.bar = nil
	}
}

// close ends the display.
func (p *progress) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.finishBar()
}
