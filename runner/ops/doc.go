// Package ops is what an operator sees of runs and does to them, shared by
// the command line and the HTTP API so both show the same numbers and
// refuse exactly the same things with the same words: the views of runs,
// steps, batches, effect plans, the outbox, the audit trail and the
// schedules, and the manual operations (recover, abandon, reset a step,
// rerun, resume, accept changed items, resolve an outside call, requeue
// dead outbox messages, prune old runs; a backfill's plan and pool), each recorded in the run's audit trail with who
// did it and why. The runs' counts by status (CountRuns) are also served
// to Prometheus, read from the store at scrape time (NewStoreCollector).
//
// Import rule: ops imports runner, jobs, steps and checkpoint (the
// contract: it is handed a checkpoint.Backend); cmd and httpapi import it.
// Its errors say what is wrong in words and carry data (a *Refusal names
// what overrides it); they never name a command-line flag or an HTTP
// field: each caller adds its own hint.
//
// The common case, a run as `stepwise show --json` prints it:
//
//	v, err := ops.Show(ctx, st, "settle/2026-11-28", ops.ShowOptions{Effects: true}, time.Now())
//
// and an operation:
//
//	err := ops.Abandon(ctx, st, ops.Who{Operator: "alice", Reason: "wrong ledger"}, "settle/2026-11-28", time.Now())
package ops
