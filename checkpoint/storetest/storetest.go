package storetest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// Harness tells the suite how to reach one backend.
type Harness struct {
	// NewDatabase creates a fresh, empty database that only t uses (a file
	// in t.TempDir(), a schema or database of its own) and returns what
	// Open takes to reach it. It removes the database at t's cleanup if
	// that is needed. The suite's tests run in parallel, so it is called
	// from several at once. Required.
	NewDatabase func(t *testing.T) string
	// Open opens one more handle on the database db, migrating it first if
	// needed. Each handle stands for one host: it shares nothing with the
	// other handles but the database. The suite closes every handle it
	// opens. Required.
	Open func(ctx context.Context, db string) (checkpoint.Store, error)
	// ServerClock says Open's handles judge leases and stamp run times by
	// the database's own clock, ignoring the times in requests, as a
	// store does in production (PostgreSQL's now()). The tests whose
	// outcome depends on times the suite chooses (a lease taken over by
	// moving the clock past it, a time read back as given) then run on
	// handles from OpenCallerClock; every other test runs on Open's, so
	// the production mode is certified by all the suite can check in it.
	// False (SQLite, which only ever uses request times) runs every test
	// on Open's handles.
	ServerClock bool
	// OpenCallerClock opens a handle on db as Open does, but one that
	// takes every time from the requests. Required when ServerClock is
	// set; unused otherwise.
	OpenCallerClock func(ctx context.Context, db string) (checkpoint.Store, error)
	// NewTargetDatabase creates a fresh database of the backend's own kind
	// that is not the checkpoint database (another file, another
	// database on the server), for the separate-store effect target
	// tests, and returns how to reach it. It removes it at t's cleanup if
	// that is needed. Required.
	NewTargetDatabase func(t *testing.T) TargetDatabase
	// SchemaVersion is the newest schema version the backend's migrations
	// know. Required.
	SchemaVersion int
	// SchemaVersions, if set, returns the schema versions recorded in db,
	// read the way the backend keeps them; the migration tests then check
	// each version is applied exactly once, on the first open, on a reopen
	// and when several hosts open together. Nil skips those checks.
	SchemaVersions func(t *testing.T, db string) []int
	// MarkNewer, if set, records in db that a binary knowing schema version
	// v migrated it, as a newer Stepwise would; the migration tests then
	// check Open refuses the database with ErrTooNew naming both versions.
	// Nil skips that test.
	MarkNewer func(t *testing.T, db string, v int)
	// BlockFor is how long the fence race lets B's claim run into A's
	// open transaction before A commits. It only shapes the interleaving:
	// no outcome is judged by it. A store that blocks B costs BlockFor a
	// round; one that does not must let B's claim finish within it to be
	// caught in the act, so it should exceed a claim's round trips.
	// Defaults to 10ms.
	BlockFor time.Duration
	// Rounds is how many times the fence race runs for each kind of fenced
	// write. Defaults to 200, or 50 when the race detector is compiled in:
	// it makes a round CPU-bound and ten times slower, and checks only the
	// suite's own goroutines, not the interleaving of transactions the
	// rounds explore, so `go test` without -race runs the full count.
	Rounds int
}

func (h *Harness) validate(t *testing.T) {
	t.Helper()
	var missing []string
	if h.NewDatabase == nil {
		missing = append(missing, "NewDatabase")
	}
	if h.Open == nil {
		missing = append(missing, "Open")
	}
	if h.NewTargetDatabase == nil {
		missing = append(missing, "NewTargetDatabase")
	}
	if h.ServerClock && h.OpenCallerClock == nil {
		missing = append(missing, "OpenCallerClock (ServerClock is set)")
	}
	if h.SchemaVersion <= 0 {
		missing = append(missing, "SchemaVersion")
	}
	if len(missing) > 0 {
		t.Fatalf("storetest: the Harness lacks %s; see the field comments of storetest.Harness", strings.Join(missing, ", "))
	}
	if h.BlockFor <= 0 {
		h.BlockFor = 10 * time.Millisecond
	}
	if h.Rounds <= 0 {
		h.Rounds = 200
		if raceDetector {
			h.Rounds = 50
		}
	}
}

// Run runs the whole suite against the backend h reaches, one subtest per
// concept, each test on a database of its own. The concepts run in
// parallel (t.Parallel), but for the fence race, whose rounds shape an
// interleaving by sleeping and so run alone.
func Run(t *testing.T, h Harness) {
	RunConcepts(t, h, Concepts()...)
}

// Concept is one part of the contract the suite checks, run as a subtest
// of its name.
type Concept string

// The suite's concepts, in the order Run runs them.
const (
	Migration      Concept = "Migration"
	ClaimAndLease  Concept = "ClaimAndLease"
	FenceRace      Concept = "FenceRace"
	Steps          Concept = "Steps"
	Items          Concept = "Items"
	ChunkPlans     Concept = "ChunkPlans"
	Targets        Concept = "Targets"
	Outbox         Concept = "Outbox"
	Queue          Concept = "Queue"
	Schedules      Concept = "Schedules"
	Operations     Concept = "Operations"
	ErrorsAndClock Concept = "ErrorsAndClock"
	API            Concept = "API"
	PartitionsOf   Concept = "Partitions"
	Takeover       Concept = "Takeover"
)

var concepts = map[Concept]func(*testing.T, Harness){
	Migration: testMigration, ClaimAndLease: testClaimAndLease, FenceRace: testFenceRace,
	Steps: testSteps, Items: testItems, ChunkPlans: testChunkPlans, Targets: testTargets,
	Outbox: testOutbox, Queue: testQueue, Schedules: testSchedules, Operations: testOperations, ErrorsAndClock: testErrorsAndClock,
	API: testAPI, PartitionsOf: testPartitions, Takeover: testTakeover,
}

// Concepts returns every concept of the suite: what a complete store
// passes.
func Concepts() []Concept {
	return []Concept{Migration, ClaimAndLease, FenceRace, Steps, Items, ChunkPlans, Targets, Outbox, Queue, Schedules, Operations, ErrorsAndClock, API, PartitionsOf, Takeover}
}

// RunConcepts runs the named concepts only: for a store still being
// built, which says in its own test which concepts it does not offer yet.
// A store is complete only when Run passes.
func RunConcepts(t *testing.T, h Harness, cs ...Concept) {
	h.validate(t)
	for _, c := range cs {
		fn, ok := concepts[c]
		if !ok {
			t.Fatalf("storetest: no concept %q", c)
		}
		if c == FenceRace {
			// Every round takes A's run over at a later time: the caller's
			// clock. It runs first and alone (the parallel concepts wait).
			t.Run(string(c), func(t *testing.T) { fn(t, h.callerClock()) })
			continue
		}
		t.Run(string(c), func(t *testing.T) {
			t.Parallel()
			fn(t, h)
		})
	}
}

// callerClock returns the harness whose handles take every time from the
// requests: h itself unless h.ServerClock.
func (h Harness) callerClock() Harness {
	if !h.ServerClock {
		return h
	}
	h.Open, h.ServerClock = h.OpenCallerClock, false
	return h
}

// callerClock runs fn as the subtest name on handles that take every time
// from the requests (see Harness.ServerClock): for a test that moves time
// past a lease or reads back the times it gave.
func callerClock(t *testing.T, h Harness, name string, fn func(t *testing.T, h Harness)) {
	t.Helper()
	t.Run(name, func(t *testing.T) { fn(t, h.callerClock()) })
}

// t0 is the suite's "now". On the caller's clock the stores never read
// the clock, so every time they record comes from a request; it is far from the wall clock and has
// microsecond precision, the precision every store keeps.
var t0 = time.Date(2031, 3, 14, 15, 9, 26, 535897000, time.UTC)

// lease is the lease length of the suite's claims.
const lease = time.Minute

// Owners of the suite's claims: a name and the details a runner adds.
const (
	ownerA = "host-a:101 boot=1 pidns=1"
	ownerB = "host-b:202 boot=2 pidns=2"
	ownerC = "host-c:303 boot=3 pidns=3"
)

const params = `{"date":"2031-03-14"}`

// env is one test's database and the handles opened on it.
type env struct {
	t   *testing.T
	h   Harness
	db  string
	ctx context.Context
}

// newEnv makes a fresh database for t.
func newEnv(t *testing.T, h Harness) *env {
	t.Helper()
	return &env{t: t, h: h, db: h.NewDatabase(t), ctx: context.Background()}
}

// open opens one more handle (host) on the test's database, closed at the
// test's cleanup.
func (e *env) open() checkpoint.Store {
	e.t.Helper()
	st, err := e.h.Open(e.ctx, e.db)
	if err != nil {
		e.t.Fatalf("open a handle on %s: %v", e.db, err)
	}
	e.t.Cleanup(func() { st.Close() })
	return st
}

// claimReq is a claim of runID ("job/key") by owner at now with the
// suite's lease and parameters.
func claimReq(runID, owner string, now time.Time) checkpoint.ClaimRequest {
	job, key, _ := strings.Cut(runID, "/")
	return checkpoint.ClaimRequest{
		RunID: runID, Job: job, RunKey: key,
		Params: []byte(params), ParamsHash: "sha256:" + params,
		Owner: owner, Now: now, LeaseFor: lease,
	}
}

// claim claims runID for owner at now and fails the test if it cannot.
func (e *env) claim(st checkpoint.Store, runID, owner string, now time.Time) checkpoint.Claim {
	e.t.Helper()
	c, err := st.Claim(e.ctx, claimReq(runID, owner, now))
	if err != nil {
		e.t.Fatalf("claim %s for %s at %s: %v", runID, owner, now.Format(time.RFC3339Nano), err)
	}
	return c
}

// inTx runs fn in a write transaction of l and fails the test on error.
func (e *env) inTx(st checkpoint.Store, l checkpoint.Lease, fn func(tx checkpoint.Tx) error) {
	e.t.Helper()
	if err := st.InTx(e.ctx, l, fn); err != nil {
		e.t.Fatalf("write run %s under fence %d: %v", l.RunID, l.Fence, err)
	}
}

// run reads one run and its attempts.
func (e *env) run(st checkpoint.Store, runID string) checkpoint.RunInfo {
	e.t.Helper()
	info, err := st.Run(e.ctx, runID)
	if err != nil {
		e.t.Fatalf("read run %s: %v", runID, err)
	}
	return info
}

// steps reads a run's step checkpoints, by ID.
func (e *env) steps(st checkpoint.Store, runID string) map[string]checkpoint.Step {
	e.t.Helper()
	out := map[string]checkpoint.Step{}
	if err := st.Steps(e.ctx, runID, func(s checkpoint.Step) error {
		out[s.ID] = s
		return nil
	}); err != nil {
		e.t.Fatalf("read steps of %s: %v", runID, err)
	}
	return out
}

// items reads the items q selects, in the order the store gives them.
func (e *env) items(st checkpoint.Store, q checkpoint.ItemQuery) []checkpoint.Item {
	e.t.Helper()
	var out []checkpoint.Item
	if err := st.Items(e.ctx, q, func(it checkpoint.Item) error {
		out = append(out, it)
		return nil
	}); err != nil {
		e.t.Fatalf("read items %+v: %v", q, err)
	}
	return out
}

// completed is a completed step checkpoint with the given ID and output.
func completed(id, output string) checkpoint.Step {
	return checkpoint.Step{
		ID: id, Status: checkpoint.StepCompleted, Output: []byte(output),
		InputHash: "in:" + id, Tries: 1, StartedAt: t0, FinishedAt: t0.Add(time.Second),
	}
}

// sameTime reports whether a stored time is the given one, to the
// microsecond every store keeps (a store may round or truncate below it).
func sameTime(stored, given time.Time) bool {
	d := stored.Sub(given)
	return d > -time.Microsecond && d < time.Microsecond
}

// The parts of checkpoint.Backend beyond Store that the suite tests. A
// harness opens a checkpoint.Store, so a store wrapped for a test (the
// naive store that shows the fence race bites) need offer only what its
// tests use; capability fails a test whose store lacks the part it needs.
type (
	operator  = checkpoint.Operator
	outbox    = checkpoint.OutboxStore
	schedules = checkpoint.ScheduleStore
	listings  = checkpoint.Inspector
)

// capability returns st as a T, or fails the test naming what st lacks.
func capability[T any](t *testing.T, st checkpoint.Store, what string) T {
	t.Helper()
	c, ok := st.(T)
	if !ok {
		t.Fatalf("storetest: the store %T has no %s (%T); every store must offer it", st, what, (*T)(nil))
	}
	return c
}

// audit is an operator's audit record at the given time.
func audit(runID, command string, at time.Time) checkpoint.Audit {
	return checkpoint.Audit{RunID: runID, At: at, Operator: "ops@host-c", Command: command, Reason: "conformance"}
}
