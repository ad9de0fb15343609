package steps

// Log field names of Stepwise's structured logs, shared by steps, runner
// and cmd so that one name always means one thing.
//
// Every line about a run carries FieldJob, FieldRunID and FieldAttempt
// (the runner sets them on the logger it gives the steps), and a line
// about a step or batch item adds FieldStepID. Durations are logged as
// seconds (a float) under a name ending in _seconds, the unit Prometheus
// and the /metrics endpoint use; never as bare milliseconds.
const (
	FieldRunID   = "run_id"
	FieldStepID  = "step_id"
	FieldAttempt = "attempt"
	FieldJob     = "job"

	// FieldTookSeconds is how long a step or batch step took.
	FieldTookSeconds = "took_seconds"
	// FieldRetryInSeconds is how long until a failed try, delivery or
	// fire is tried again.
	FieldRetryInSeconds = "retry_in_seconds"
	// FieldTimeoutSeconds is a step's timeout per try.
	FieldTimeoutSeconds = "timeout_seconds"
	// FieldETASeconds is a batch step's estimated time to finish.
	FieldETASeconds = "eta_seconds"
)
