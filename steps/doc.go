// Package steps is what job code calls: run a step with a deterministic ID,
// have its output checkpointed, and get the recorded output back without
// running it again when the run is resumed.
//
// Import rule: steps imports checkpoint (the contract, never a store's
// package) and nothing else of Stepwise; jobs, runner and cmd import it.
// Effects reach their target through checkpoint.Tx.Target and
// checkpoint.Store.OpenTarget, so the same code runs on every store.
//
// The common case, inside a job function:
//
//	total, err := steps.Do(ctx, run, steps.ID("load"), func(ctx context.Context) (int64, error) {
//		return loadTotal(ctx)
//	})
//
// On the first attempt the function runs and its output is committed with
// the step's checkpoint. On any later attempt of the same run (after a crash,
// a failure or a manual rerun) the step is skipped and the recorded output
// is returned, so later steps see the same data. Step IDs are a name plus an
// optional business key (steps.ID("post", "T-1001") is "post/T-1001"), never
// a counter of call order.
//
// Each step runs its function under an OpenTelemetry span of its own
// (Config.Tracer; a batch step adds a span per chunk), so an outside call
// made from it joins the run's trace: put InjectTrace on the request's
// headers, or give the HTTP client a TraceTransport.
//
// # One batch step across many runners
//
// ForEach(…, Partitions(n)) splits a batch step into n partitions, recorded
// once and worked by the run's own process on goroutines and by any
// partition worker (runner.WorkPartition) on other hosts, each partition
// under a fence of its own. Every item is still processed exactly once and
// its effects applied exactly once. What changes: across partitions a
// guard sees other partitions' effects in commit order, not in the
// source's order, so which transfer an overdraft guard rejects can differ
// from a one-partition run. Source.PartitionBy (by debit account, say) keeps the
// items one guard decides in one partition. One partition is the default.
package steps
