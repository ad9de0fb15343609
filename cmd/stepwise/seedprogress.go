package main

import (
	"io"
	"os"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"github.com/schollz/progressbar/v3"

	"github.com/stepwise-run/stepwise/cmd"
)

// seedLogEvery is how often the seed's progress is logged when no bar
// shows it: its first batch, then at most this often.
const seedLogEvery = 2 * time.Second

// seedProgress shows a seed's progress on stderr as the --progress flag
// asks: a live bar on a terminal, otherwise a log line (in the --log-format
// and at info, so --log-level warn silences it) when the seed starts and
// every few seconds. With --json, auto shows none: a machine reads the
// result. It never writes to stdout.
type seedProgress struct {
	mode string // bar, log or none
	w    io.Writer
	log  zerolog.Logger
	now  func() time.Time
	bar  *progressbar.ProgressBar
	last time.Time // when a line was last logged; zero before the first
}

// newSeedProgress returns the display mode asks for (auto, bar, log or
// none) for a command whose output is JSON when asJSON.
func newSeedProgress(env *cmd.Env, mode string, asJSON bool) *seedProgress {
	if mode == "auto" {
		switch {
		case asJSON:
			mode = "none"
		case isTerminal(env.Stderr):
			mode = "bar"
		default:
			mode = "log"
		}
	}
	return &seedProgress{mode: mode, w: env.Stderr, log: env.Logger(), now: time.Now}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isatty.IsTerminal(f.Fd())
}

// report is the progress of settlement.SeedReporting, or nil when none is
// shown.
func (p *seedProgress) report() func(done, total int) {
	switch p.mode {
	case "bar":
		return p.drawBar
	case "log":
		return p.logLine
	}
	return nil
}

func (p *seedProgress) drawBar(done, total int) {
	if p.bar == nil {
		p.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(p.w),
			progressbar.OptionSetDescription("seeding transfers"),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("transfers"),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionSetSpinnerChangeInterval(0),
		)
	}
	p.bar.Set(done)
}

func (p *seedProgress) logLine(done, total int) {
	now := p.now()
	if done >= total || (!p.last.IsZero() && now.Sub(p.last) < seedLogEvery) {
		return // the command's own line says it is done
	}
	p.last = now
	p.log.Info().Int("done", done).Int("total", total).Msg("seeding transfers")
}

// close erases the bar, so what follows starts on a clean line.
func (p *seedProgress) close() {
	if p.bar != nil {
		p.bar.Clear()
		p.bar.Exit()
		p.bar = nil
	}
}
