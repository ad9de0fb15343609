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
// Its interval is how often the hook wants a partitioned step's summed
// progress (steps.Config.ProgressEvery): the log's, or for
// Config.OnProgress (a bar) the steps' default if that is sooner; zero
// for none.
func (r *Runner) progressHook(lease checkpoint.Lease, jobLog zerolog.Logger) (hook func(steps.Progress), interval time.Duration) {
	user, every := r.cfg.OnProgress, r.cfg.ProgressLog
	if every == 0 {
		every = DefaultProgressLog
	}
	if every < 0 || jobLog.GetLevel() > zerolog.InfoLevel {
		return user, 0
	}
	interval = every
	if user != nil {
		interval = min(every, steps.DefaultProgressEvery)
	}
	log := jobLog.With().Str(steps.FieldRunID, lease.RunID).Int(steps.FieldAttempt, lease.Attempt).Logger()
	var (
		mu   sync.Mutex
		last = map[string]time.Time{} // step -> when its progress was last logged
	)
	return func(p steps.Progress) {
		if user != nil {
			// After the line: a hook that waits (a paced demo) does
			// not hold back the chunk's line.
			defer user(p)
		}
		now := r.cfg.Clock.Now()
		mu.Lock()
		at, logged := last[p.Step]
		// A report a tenth early is on time: a partitioned step's owner
		// reports every interval, give or take its read's jitter.
		quiet := logged && now.Sub(at) < every-every/10 && !p.Final
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
	}, interval
}
