package runner

import (
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/steps"
)

// DefaultProgressLog is how often a batch step's progress is logged when
// Config.ProgressLog is zero.
const DefaultProgressLog = 5 * time.Second

// progressHook returns the OnProgress of one attempt: it passes each report
// to Config.OnProgress and logs a "progress" line with the run's job,
// run_id and attempt: a step's first chunk, then at most every
// Config.ProgressLog, and its last chunk. Nil when there is nothing to do.
func (r *Runner) progressHook(lease checkpoint.Lease, jobLog zerolog.Logger) func(steps.Progress) {
	user, every := r.cfg.OnProgress, r.cfg.ProgressLog
	if every == 0 {
		every = DefaultProgressLog
	}
	if every < 0 || jobLog.GetLevel() > zerolog.InfoLevel {
		return user
	}
	log := jobLog.With().Str(steps.FieldRunID, lease.RunID).Int(steps.FieldAttempt, lease.Attempt).Logger()
	var (
		mu   sync.Mutex
		last = map[string]time.Time{} // step -> when its progress was last logged
	)
	return func(p steps.Progress) {
		if user != nil {
			user(p)
		}
		now := r.cfg.Clock.Now()
		mu.Lock()
		at, logged := last[p.Step]
		quiet := logged && now.Sub(at) < every && !p.Final
		if !quiet {
			last[p.Step] = now
		}
		mu.Unlock()
		if quiet {
			return
		}
		ev := log.Info().Str(steps.FieldStepID, p.Step).Int64("done", p.Done).Int64("total", p.Total).
			Int64("rejected", p.Rejected).Int64("skipped", p.Skipped).Int64("replayed", p.Replayed)
		if el := now.Sub(p.StartedAt).Seconds(); el > 0 && p.Done > p.Replayed {
			rate := float64(p.Done-p.Replayed) / el
			ev = ev.Float64("items_per_second", rate)
			if p.Total > 0 && rate > 0 {
				ev = ev.Float64(steps.FieldETASeconds, float64(p.Total-p.Done)/rate)
			}
		}
		ev.Msg("progress")
	}
}
