// Package runner executes runs: it claims a run (a lease and a fence number),
// records the attempt, drives the job function with a steps.Run, heartbeats
// the lease, and records how the attempt ended.
//
// Import rule: runner imports jobs, steps and checkpoint (the contract,
// never a store's package: it is handed a checkpoint.Backend, the one typed
// handle on a store, and never looks for a capability by type assertion);
// only cmd
// imports runner.
//
// The common case:
//
//	r, err := runner.New(runner.Config{Store: st, Jobs: registry})
//	if err != nil {
//		return err
//	}
//	res, err := r.Run(ctx, runner.Request{Job: "report", Values: map[string]string{"date": "2026-11-28"}})
//
// Running the same job with the same identifying parameters again resumes
// the same run: completed steps are skipped and their recorded outputs
// returned. A run held by a live runner is refused with a
// *checkpoint.LeaseHeldError, or waited for with Config.Wait.
//
// A panic in job code (the job function, a step's or a batch item's
// function) is recovered: the attempt is recorded as failed with the panic
// value and stack (*PanicError), and other runs in the process go on.
// Batch steps' progress is logged every Config.ProgressLog with the run's
// job, run_id and attempt (see steps.FieldJob and the other field names).
//
// Each attempt is an OpenTelemetry span ("attempt JOB") from
// Config.TracerProvider (by default the global provider, a no-op unless
// the program set one), the parent of its steps' and batch chunks' spans
// (see steps.AttrRunID for their attributes); a step replayed from its
// checkpoint keeps its span, marked stepwise.replayed. Config.Metrics
// counts the runs the runner executes, however they were started, with
// attempt and step duration histograms; what the whole deployment
// recorded (each job's last success, the runs by status) is read from
// the store instead (ops.NewStoreCollector).
package runner
