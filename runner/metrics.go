package runner

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/steps"
)

// Metrics are the Prometheus series of what one process executes: the
// runs its Runners claim and end, however they were started (Run, Resume,
// Claim, a Worker taking the queue, a Scheduler firing), and its
// Scheduler's fires. Create them with NewMetrics and give them to
// Config.Metrics (or SchedulerConfig.Metrics, which its runner then
// uses); a nil *Metrics records nothing.
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
//	stepwise_store_faults_total{job}          transient store faults (a dropped connection, a deadlock) an attempt went on from
//	stepwise_partitions_worked_total{job}     partitions of batch steps of other runners' runs this process worked
//	stepwise_partitions_released_total{job}   such partitions handed back unworked (their replay stopped, their lease lost)
//	stepwise_duplicate_fires_total{schedule}  fires whose run had already succeeded or was running elsewhere
//	stepwise_misfires_skipped_total{schedule,reason}  missed fires not run: reason "policy" or "deadline"
//	stepwise_overlap_skipped_total{schedule}  fires skipped under OverlapForbid
//	stepwise_fire_errors_total{schedule}      fires whose run could not start or end as a run
//	stepwise_lease_takeovers_total{kind}      leases taken from a dead or stalled owner: kind "run" or "schedule"
//	stepwise_schedule_lag_seconds{schedule}   how late the latest run of the schedule started
//	stepwise_schedule_leader{schedule}        1 while this scheduler fires the schedule
//	stepwise_attempt_duration_seconds{job,status}  histogram: an attempt, from its claim request to its end
//	stepwise_step_duration_seconds{job,step}  histogram: a step that ran (replayed ones are not observed);
//	                                          step is the step ID's name, before its first "/"
//
// The counters and histograms are this process's: a pool of workers and
// serve processes each count their own, and Prometheus sums them. What
// the whole deployment recorded (each job's last success, the runs by
// status) is read from the store when scraped: see ops.NewStoreCollector.
type Metrics struct {
	runsStarted, runsSucceeded, runsFailed, runsInterrupted *prometheus.CounterVec
	stepsExecuted, stepsSkipped, stepsFailed                *prometheus.CounterVec
	effectsApplied, casConflicts, replans                   *prometheus.CounterVec
	duplicateFires, misfiresSkipped, overlapSkipped         *prometheus.CounterVec
	fireErrors, leaseTakeovers, storeFaults                 *prometheus.CounterVec
	partitionsWorked, partitionsReleased                    *prometheus.CounterVec
	lag, leader                                             *prometheus.GaugeVec
	attemptDuration, stepDuration                           *prometheus.HistogramVec
}

// Histogram buckets, in seconds: steps from a few milliseconds (a
// checkpoint commit) to an hour; attempts from a second to a night.
var (
	stepBuckets    = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
	attemptBuckets = []float64{1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800}
)

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
		storeFaults:     counter("store_faults_total", "Transient store faults (a dropped connection, a server restart, a deadlock) an attempt went on from its checkpoints after.", "job"),
		partitionsWorked: counter("partitions_worked_total",
			"Partitions of batch steps of other runners' runs that this process claimed and worked to their end.", "job"),
		partitionsReleased: counter("partitions_released_total",
			"Partitions this process claimed and handed back unworked (their replay stopped, or their lease was lost).", "job"),
		lag:    gauge("schedule_lag_seconds", "How late after its fire time the schedule's latest run started.", "schedule"),
		leader: gauge("schedule_leader", "1 while this scheduler holds the schedule's lease and fires it.", "schedule"),
		attemptDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "stepwise", Name: "attempt_duration_seconds",
			Help:    "How long an attempt of the job took, from its claim request to its end, by the status it ended with.",
			Buckets: attemptBuckets}, []string{"job", "status"}),
		stepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "stepwise", Name: "step_duration_seconds",
			Help:    "How long a step that ran took (replayed steps are not observed); step is the step ID's name, before any /key.",
			Buckets: stepBuckets}, []string{"job", "step"}),
	}
	for _, c := range []prometheus.Collector{m.runsStarted, m.runsSucceeded, m.runsFailed, m.runsInterrupted,
		m.stepsExecuted, m.stepsSkipped, m.stepsFailed, m.effectsApplied, m.casConflicts, m.replans,
		m.duplicateFires, m.misfiresSkipped, m.overlapSkipped,
		m.fireErrors, m.leaseTakeovers, m.storeFaults, m.partitionsWorked, m.partitionsReleased, m.lag, m.leader, m.attemptDuration, m.stepDuration} {
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
	m.knownJob(job)
	for _, c := range []*prometheus.CounterVec{m.duplicateFires, m.overlapSkipped, m.fireErrors} {
		c.WithLabelValues(schedule)
	}
	m.misfiresSkipped.WithLabelValues(schedule, misfireReasonPolicy)
	m.misfiresSkipped.WithLabelValues(schedule, misfireReasonDeadline)
	m.lag.WithLabelValues(schedule)
	m.leader.WithLabelValues(schedule)
}

// knownJob creates the run and step counters of job at zero, so a rate()
// sees their first increase.
func (m *Metrics) knownJob(job string) {
	if m == nil {
		return
	}
	for _, c := range []*prometheus.CounterVec{m.runsStarted, m.runsSucceeded, m.runsFailed, m.runsInterrupted,
		m.stepsExecuted, m.stepsSkipped, m.stepsFailed, m.effectsApplied, m.casConflicts, m.replans,
		m.partitionsWorked, m.partitionsReleased} {
		c.WithLabelValues(job)
	}
}

// partitionEnded counts a partition this process worked (or released
// unworked) and the writes its chunks made; the steps its replay returned
// from their checkpoints are the run's owner's, not counted here.
func (m *Metrics) partitionEnded(job string, worked bool, st steps.Stats) {
	if m == nil {
		return
	}
	if worked {
		m.partitionsWorked.WithLabelValues(job).Inc()
	} else {
		m.partitionsReleased.WithLabelValues(job).Inc()
	}
	m.effectsApplied.WithLabelValues(job).Add(float64(st.Effects))
	m.casConflicts.WithLabelValues(job).Add(float64(st.Conflicts))
	m.replans.WithLabelValues(job).Add(float64(st.Replans))
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

// storeFault counts a transient store fault an attempt of job goes on
// from.
func (m *Metrics) storeFault(job string) {
	if m != nil {
		m.storeFaults.WithLabelValues(job).Inc()
	}
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

// attemptEnded records an attempt's duration by the status it ended
// with.
func (m *Metrics) attemptEnded(job, status string, took time.Duration) {
	if m != nil {
		m.attemptDuration.WithLabelValues(job, status).Observe(took.Seconds())
	}
}

// stepHook returns the steps.Config.OnStepEnd that observes the steps of
// job's attempts, or nil for a nil *Metrics.
func (m *Metrics) stepHook(job string) func(steps.StepEnd) {
	if m == nil {
		return nil
	}
	return func(e steps.StepEnd) {
		if !e.Replayed {
			m.stepDuration.WithLabelValues(job, e.Name).Observe(e.Took.Seconds())
		}
	}
}
