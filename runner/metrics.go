package runner

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// Metrics are the Prometheus series of a Scheduler and the runs it starts.
// Create them with NewMetrics and give them to SchedulerConfig.Metrics; a
// nil *Metrics records nothing.
//
// Series (all counters are _total):
//
//	stepwise_runs_started_total{job}          runs claimed (created, resumed or taken over)
//	stepwise_runs_succeeded_total{job}
//	stepwise_runs_failed_total{job}
//	stepwise_runs_interrupted_total{job}      stopped resumably (shutdown past the grace period)
//	stepwise_steps_executed_total{job}        steps whose function ran
//	stepwise_steps_skipped_total{job}         steps returned from their checkpoint
//	stepwise_steps_failed_total{job}
//	stepwise_effects_applied_total{job}       compare-and-set writes applied
//	stepwise_cas_conflicts_total{job}         writes that found another writer's version
//	stepwise_replans_total{job}               plans made again after a conflict
//	stepwise_duplicate_fires_total{schedule}  fires whose run had already succeeded or was running elsewhere
//	stepwise_misfires_skipped_total{schedule,reason}  missed fires not run: reason "policy" or "deadline"
//	stepwise_overlap_skipped_total{schedule}  fires skipped under OverlapForbid
//	stepwise_fire_errors_total{schedule}      fires whose run could not start or end as a run
//	stepwise_lease_takeovers_total{kind}      leases taken from a dead or stalled owner: kind "run" or "schedule"
//	stepwise_schedule_lag_seconds{schedule}   how late the latest run of the schedule started
//	stepwise_schedule_leader{schedule}        1 while this scheduler fires the schedule
type Metrics struct {
	runsStarted, runsSucceeded, runsFailed, runsInterrupted *prometheus.CounterVec
	stepsExecuted, stepsSkipped, stepsFailed                *prometheus.CounterVec
	effectsApplied, casConflicts, replans                   *prometheus.CounterVec
	duplicateFires, misfiresSkipped, overlapSkipped         *prometheus.CounterVec
	fireErrors, leaseTakeovers                              *prometheus.CounterVec
	lag, leader                                             *prometheus.GaugeVec
}

// Misfire reasons, the reason label of stepwise_misfires_skipped_total.
const (
	misfireReasonPolicy   = "policy"
	misfireReasonDeadline = "deadline"
)

// Lease kinds, the kind label of stepwise_lease_takeovers_total.
const (
	leaseKindRun      = "run"
	leaseKindSchedule = "schedule"
)

// NewMetrics creates the series and registers them with reg, e.g. a
// prometheus.NewRegistry() served by promhttp.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "stepwise", Name: name, Help: help}, labels)
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "stepwise", Name: name, Help: help}, labels)
	}
	m := &Metrics{
		runsStarted:     counter("runs_started_total", "Runs claimed by this process: created, resumed or taken over.", "job"),
		runsSucceeded:   counter("runs_succeeded_total", "Runs that ended succeeded.", "job"),
		runsFailed:      counter("runs_failed_total", "Runs that ended failed.", "job"),
		runsInterrupted: counter("runs_interrupted_total", "Runs stopped resumably (interrupted).", "job"),
		stepsExecuted:   counter("steps_executed_total", "Steps whose function ran and completed.", "job"),
		stepsSkipped:    counter("steps_skipped_total", "Steps returned from their checkpoint without running.", "job"),
		stepsFailed:     counter("steps_failed_total", "Steps whose function returned an error.", "job"),
		effectsApplied:  counter("effects_applied_total", "Compare-and-set writes applied by effect steps and batch chunks.", "job"),
		casConflicts:    counter("cas_conflicts_total", "Compare-and-set writes that found another writer's version.", "job"),
		replans:         counter("replans_total", "Effect plans made again after a version conflict.", "job"),
		duplicateFires:  counter("duplicate_fires_total", "Fires whose run had already succeeded or was held by another runner: deduplicated by the run key.", "schedule"),
		misfiresSkipped: counter("misfires_skipped_total", "Missed fires not run, by the misfire policy or past the starting deadline.", "schedule", "reason"),
		overlapSkipped:  counter("overlap_skipped_total", "Fires skipped because an earlier run of the schedule was unfinished (overlap forbid).", "schedule"),
		fireErrors:      counter("fire_errors_total", "Fires whose run could not be started or recorded.", "schedule"),
		leaseTakeovers:  counter("lease_takeovers_total", "Leases taken over from a dead or stalled owner.", "kind"),
		lag:             gauge("schedule_lag_seconds", "How late after its fire time the schedule's latest run started.", "schedule"),
		leader:          gauge("schedule_leader", "1 while this scheduler holds the schedule's lease and fires it.", "schedule"),
	}
	for _, c := range []prometheus.Collector{m.runsStarted, m.runsSucceeded, m.runsFailed, m.runsInterrupted,
		m.stepsExecuted, m.stepsSkipped, m.stepsFailed, m.effectsApplied, m.casConflicts, m.replans,
		m.duplicateFires, m.misfiresSkipped, m.overlapSkipped,
		m.fireErrors, m.leaseTakeovers, m.lag, m.leader} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, kind := range []string{leaseKindRun, leaseKindSchedule} {
		m.leaseTakeovers.WithLabelValues(kind)
	}
	return m, nil
}

// known creates the series of a schedule and its job at zero, so they are
// scraped before anything happens.
func (m *Metrics) known(schedule, job string) {
	if m == nil {
		return
	}
	for _, c := range []*prometheus.CounterVec{m.runsStarted, m.runsSucceeded, m.runsFailed, m.runsInterrupted,
		m.stepsExecuted, m.stepsSkipped, m.stepsFailed, m.effectsApplied, m.casConflicts, m.replans} {
		c.WithLabelValues(job)
	}
	for _, c := range []*prometheus.CounterVec{m.duplicateFires, m.overlapSkipped, m.fireErrors} {
		c.WithLabelValues(schedule)
	}
	m.misfiresSkipped.WithLabelValues(schedule, misfireReasonPolicy)
	m.misfiresSkipped.WithLabelValues(schedule, misfireReasonDeadline)
	m.lag.WithLabelValues(schedule)
	m.leader.WithLabelValues(schedule)
}

func (m *Metrics) runStarted(job string, c checkpoint.Claim) {
	if m == nil {
		return
	}
	m.runsStarted.WithLabelValues(job).Inc()
	if c.TookOverFrom != "" {
		m.leaseTakeovers.WithLabelValues(leaseKindRun).Inc()
	}
}

// runEnded counts a run's ending and what it did with its steps.
func (m *Metrics) runEnded(job string, res Result) {
	if m == nil {
		return
	}
	switch res.Status {
	case checkpoint.RunSucceeded:
		m.runsSucceeded.WithLabelValues(job).Inc()
	case checkpoint.RunFailed:
		m.runsFailed.WithLabelValues(job).Inc()
	case checkpoint.RunInterrupted:
		m.runsInterrupted.WithLabelValues(job).Inc()
	}
	m.stepsExecuted.WithLabelValues(job).Add(float64(res.Stats.Executed))
	m.stepsSkipped.WithLabelValues(job).Add(float64(res.Stats.Skipped))
	m.stepsFailed.WithLabelValues(job).Add(float64(res.Stats.Failed))
	m.effectsApplied.WithLabelValues(job).Add(float64(res.Stats.Effects))
	m.casConflicts.WithLabelValues(job).Add(float64(res.Stats.Conflicts))
	m.replans.WithLabelValues(job).Add(float64(res.Stats.Replans))
}

func (m *Metrics) duplicateFire(schedule string) {
	if m != nil {
		m.duplicateFires.WithLabelValues(schedule).Inc()
	}
}

func (m *Metrics) misfiresSkippedN(schedule, reason string, n int) {
	if m != nil && n > 0 {
		m.misfiresSkipped.WithLabelValues(schedule, reason).Add(float64(n))
	}
}

func (m *Metrics) overlapSkip(schedule string) {
	if m != nil {
		m.overlapSkipped.WithLabelValues(schedule).Inc()
	}
}

func (m *Metrics) fireError(schedule string) {
	if m != nil {
		m.fireErrors.WithLabelValues(schedule).Inc()
	}
}

func (m *Metrics) scheduleTakeover() {
	if m != nil {
		m.leaseTakeovers.WithLabelValues(leaseKindSchedule).Inc()
	}
}

func (m *Metrics) fireLag(schedule string, lag time.Duration) {
	if m != nil {
		m.lag.WithLabelValues(schedule).Set(lag.Seconds())
	}
}

func (m *Metrics) setLeader(schedule string, leader bool) {
	if m == nil {
		return
	}
	v := 0.0
	if leader {
		v = 1
	}
	m.leader.WithLabelValues(schedule).Set(v)
}
