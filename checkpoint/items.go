package checkpoint

// Item statuses (besides StepCompleted, StepRejected and StepPlanned).
const (
	// ItemSkipped: the item failed and the step's skip policy let the step
	// go on; a plain rerun does not retry it.
	ItemSkipped = "skipped"
)

// Item is the checkpoint of one item of a batch step.
type Item struct {
	Step    string // the batch step's name
	Key     string // the item's business key
	Status  string
	Output  []byte
	Error   string
	Attempt int
	Chunk   string // effect ID of its chunk plan (separate store)
	// Fingerprint identifies the item's content when it was processed
	// (steps hashes the item, or what the job declares), so a rerun can
	// tell a changed item from the same one. Nil for items recorded before
	// fingerprints were (schema version 7).
	Fingerprint []byte
}

// ItemQuery selects item checkpoints of one batch step of one run. With
// Keys set only those keys are read; with From/To set only keys in that
// inclusive range; otherwise all, in key order.
type ItemQuery struct {
	RunID string
	Step  string
	Keys  []string
	From  string
	To    string
	// KeysOnly skips reading outputs and errors.
	KeysOnly bool
	// Status, if set, selects only items with this status (with neither
	// Keys nor a range set).
	Status string
	// Limit, if positive, reads at most this many items (with neither Keys
	// nor a range set).
	Limit int
	// After, with Status set, starts after this item key: the last key of
	// the previous page (keyset paging).
	After string
	// Last reads keys in descending order (with KeysOnly and neither Keys,
	// a range nor Status set): with Limit 1, the step's greatest key.
	Last bool
}

// Chunk plan statuses (besides StepPlanned).
const (
	// ChunkApplied: the chunk plan's writes applied (a same-store chunk's
	// plan is recorded applied, in the transaction that applied it).
	ChunkApplied = "applied"
	// ChunkSuperseded: the plan lost a race to another writer; nothing of
	// it applied and a newer plan of the same items replaced it.
	ChunkSuperseded = "superseded"
)

// ChunkPlan is a recorded effect plan of one chunk of a batch step.
type ChunkPlan struct {
	Step     string
	EffectID string
	// Status is StepPlanned, ChunkApplied or ChunkSuperseded. PutChunkPlan
	// records StepPlanned when empty.
	Status string
	// Plan is the plan's record as its writer encoded it (steps:
	// EncodeChunkPlan, or JSON before it); stores keep the bytes as given.
	Plan []byte
	// Supersedes names an earlier plan of the same items that lost a race
	// (nothing of it applied); recording this plan retires it.
	Supersedes string
}

// ItemCount is how many items of one batch step have one status.
type ItemCount struct {
	Step   string
	Status string
	Count  int64
}
