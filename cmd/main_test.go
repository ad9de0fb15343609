package cmd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/checkpoint/stores"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// The crash tests run the stepwise CLI in real processes: the test binary
// re-executes itself with childEnv set, and TestMain then acts as the CLI
// (through Main, so signal handling is the real one) with the test registry
// instead of running tests. Arguments for the CLI follow a "--" marker.
const (
	childEnv = "STEPWISE_TEST_CHILD"
	// gateEnv makes the child report readiness on fd 3 and then wait for
	// fd 4 to close before running, so the parent can release several
	// children at the same moment.
	gateEnv = "STEPWISE_TEST_GATE"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		childMain()
		return // Main exits; not reached
	}
	os.Exit(m.Run())
}

func childMain() {
	args := crashtest.ChildArgs()
	if os.Getenv(gateEnv) == "1" {
		ready, gate := os.NewFile(3, "ready"), os.NewFile(4, "gate")
		if _, err := ready.Write([]byte{1}); err != nil {
			fmt.Fprintf(os.Stderr, "test child: report ready: %v\n", err)
			os.Exit(97)
		}
		ready.Close()
		io.Copy(io.Discard, gate) // returns when the parent closes its end
		gate.Close()
	}
	os.Args = append([]string{os.Args[0]}, args...)
	Main(testRegistry(), Name("stepwise")) // the test binary is cmd.test
}

func testRegistry() *jobs.Registry {
	var reg jobs.Registry
	reg.MustRegister(crashyJob)
	reg.MustRegister(failureJobs...) // failures_test.go
	reg.MustRegister(callJobs...)    // calls_test.go
	reg.MustRegister(limitedJob)     // worker_test.go
	return &reg
}

// crashyParams are the parameters of the test job. Side names the file each
// step appends to, so a test can count how often each step's function ran
// across processes.
type crashyParams struct {
	Key   string        `param:"key,key" help:"run key"`
	Side  string        `param:"side,required" help:"side-effect log file"`
	Steps int           `param:"steps" default:"3" help:"number of steps"`
	Pace  time.Duration `param:"pace" default:"0s" help:"pause in every step"`
	// Block and BlockAt make step/BlockAt wait until the file Block
	// exists, so a test can hold a runner inside a step for as long as it
	// needs, without sleeping.
	Block   string `param:"block" help:"file whose existence releases the blocking step"`
	BlockAt int    `param:"block-at" default:"0" help:"index of the blocking step (0: none)"`
	// Stubborn makes the blocking step ignore cancellation: it notes the
	// cancel in the side file and finishes when released.
	Stubborn bool `param:"stubborn" default:"false" help:"the blocking step ignores cancellation"`
}

// stepOutput is each step's output. Nanos and Attempt differ on every
// execution, so an output replayed from a checkpoint is told apart from a
// recomputed one.
type stepOutput struct {
	Step    string `json:"step"`
	Attempt int    `json:"attempt"`
	Nanos   int64  `json:"nanos"`
}

var crashyJob = jobs.Define("crashy", runCrashy,
	jobs.Help("test job: numbered steps that log every execution to a side file"))

// Side file lines.
const (
	sideRan       = "ran"       // "ran step/i": the step's function started
	sideSaw       = "saw"       // "saw step/i {json}": what Do returned to the job
	sideCancelled = "cancelled" // "cancelled step/i": the blocking step saw its context end
)

func runCrashy(ctx context.Context, run *steps.Run, p crashyParams) error {
	for i := 1; i <= p.Steps; i++ {
		id := steps.ID("step", strconv.Itoa(i))
		out, err := steps.Do(ctx, run, id, func(ctx context.Context) (stepOutput, error) {
			if err := appendLine(p.Side, sideRan+" "+id); err != nil {
				return stepOutput{}, err
			}
			if i == p.BlockAt {
				if err := block(ctx, p, id); err != nil {
					return stepOutput{}, err
				}
			}
			if p.Pace > 0 {
				t := time.NewTimer(p.Pace)
				select {
				case <-ctx.Done():
					t.Stop()
					return stepOutput{}, ctx.Err()
				case <-t.C:
				}
			}
			return stepOutput{Step: id, Attempt: run.Attempt(), Nanos: time.Now().UnixNano()}, nil
		})
		if err != nil {
			return err
		}
		b, err := json.Marshal(out)
		if err != nil {
			return err
		}
		if err := appendLine(p.Side, sideSaw+" "+id+" "+string(b)); err != nil {
			return err
		}
	}
	return nil
}

// block waits until p.Block exists. Cancellation ends the wait with the
// context's error unless p.Stubborn, which only notes it in the side file.
func block(ctx context.Context, p crashyParams, id string) error {
	done := ctx.Done()
	for {
		if _, err := os.Stat(p.Block); err == nil {
			return nil
		}
		select {
		case <-done:
			if !p.Stubborn {
				return ctx.Err()
			}
			done = nil
			if err := appendLine(p.Side, sideCancelled+" "+id); err != nil {
				return err
			}
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// appendLine appends one line with a single write, so a SIGKILL never leaves
// half a line.
func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(line + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// sideLog is what the side file says happened.
type sideLog struct {
	ran       map[string]int      // step ID -> executions started
	saw       map[string][]string // step ID -> outputs the job received, in order
	cancelled map[string]int
}

func readSide(t *testing.T, path string) sideLog {
	t.Helper()
	l := sideLog{ran: map[string]int{}, saw: map[string][]string{}, cancelled: map[string]int{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return l
	}
	if err != nil {
		t.Fatalf("read side file: %v", err)
	}
	// Only complete lines count: a child may be writing right now.
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[:i+1]
	} else {
		b = nil
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		kind, rest, _ := strings.Cut(sc.Text(), " ")
		id, payload, _ := strings.Cut(rest, " ")
		switch kind {
		case sideRan:
			l.ran[id]++
		case sideSaw:
			l.saw[id] = append(l.saw[id], payload)
		case sideCancelled:
			l.cancelled[id]++
		default:
			t.Fatalf("side file %s: unexpected line %q", path, sc.Text())
		}
	}
	return l
}

// stepIDs returns step/1..step/n.
func stepIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = steps.ID("step", strconv.Itoa(i+1))
	}
	return ids
}

// checkRan fails unless each of step/1..step/n ran exactly want[id] times
// (absent means 0) and no other step ran.
func checkRan(t *testing.T, l sideLog, n int, want map[string]int) {
	t.Helper()
	for _, id := range stepIDs(n) {
		if got := l.ran[id]; got != want[id] {
			t.Errorf("%s ran %d times, want %d (all counts: %v)", id, got, want[id], l.ran)
		}
	}
	for id := range l.ran {
		if !slices.Contains(stepIDs(n), id) {
			t.Errorf("unexpected step %s ran", id)
		}
	}
}

// checkSaw fails unless every value the job received from a step is the
// step's recorded output, byte for byte: a replay hands the job exactly what
// the first execution produced.
func checkSaw(t *testing.T, l sideLog, s runState) {
	t.Helper()
	for id, outs := range l.saw {
		rec, ok := s.steps[id]
		if !ok {
			t.Errorf("job received output of %s, which has no checkpoint", id)
			continue
		}
		for i, o := range outs {
			if o != string(rec.Output) {
				t.Errorf("job received %s output #%d %s, checkpoint holds %s", id, i+1, o, rec.Output)
			}
		}
	}
}

// runState is a run as the store holds it.
type runState struct {
	found bool
	info  checkpoint.RunInfo
	steps map[string]checkpoint.Step
}

// readRun reads a run and its checkpoints from the store at db, opening
// and closing the store around the read (no child is running then).
func readRun(t *testing.T, db, runID string) runState {
	t.Helper()
	st := dialStore(t, db)
	defer st.Close()
	return readRunIn(t, st, runID)
}

// readRunIn reads a run and its checkpoints through st.
func readRunIn(t *testing.T, st checkpoint.Store, runID string) runState {
	t.Helper()
	ctx := context.Background()
	s := runState{steps: map[string]checkpoint.Step{}}
	var err error
	s.info, err = st.Run(ctx, runID)
	if errors.Is(err, checkpoint.ErrNotFound) {
		return s
	}
	if err != nil {
		t.Fatalf("read run %s: %v", runID, err)
	}
	s.found = true
	err = st.Steps(ctx, runID, func(c checkpoint.Step) error {
		s.steps[c.ID] = c
		return nil
	})
	if err != nil {
		t.Fatalf("read steps of %s: %v", runID, err)
	}
	return s
}

// completed returns the IDs of the completed steps.
func (s runState) completed() []string {
	var ids []string
	for id, c := range s.steps {
		if c.Status == checkpoint.StepCompleted {
			ids = append(ids, id)
		}
	}
	sortStepIDs(ids)
	return ids
}

// sortStepIDs sorts step/1..step/n by number (shorter first, then by text).
func sortStepIDs(ids []string) {
	slices.SortFunc(ids, func(a, b string) int {
		if len(a) != len(b) {
			return len(a) - len(b)
		}
		return strings.Compare(a, b)
	})
}

// attemptStatuses returns the statuses of the run's attempts, oldest first.
func (s runState) attemptStatuses() []string {
	var st []string
	for _, a := range s.info.Attempts {
		st = append(st, a.Status)
	}
	return st
}

// crashyArgs returns CLI arguments running the crashy job on db.
func crashyArgs(db, key, side string, params ...string) []string {
	args := []string{"--db", db, "run", "crashy", "-p", "key=" + key, "-p", "side=" + side}
	for _, p := range params {
		args = append(args, "-p", p)
	}
	return args
}

// syncBuffer is a bytes.Buffer safe to read while a child writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// childTimeout bounds how long a test waits for a CLI child.
const childTimeout = 30 * time.Second

// startChild starts the CLI with args in a new process (see crashtest.Start
// for its environment). files become the child's fds 3, 4, ...
func startChild(t *testing.T, env []string, files []*os.File, args ...string) *crashtest.Child {
	t.Helper()
	return startWrappedChild(t, nil, env, files, args...)
}

// startWrappedChild is startChild with the CLI run by a wrapper command
// (e.g. unshare): wrap, then the test binary and its arguments.
func startWrappedChild(t *testing.T, wrap, env []string, files []*os.File, args ...string) *crashtest.Child {
	t.Helper()
	return crashtest.Start(t, crashtest.Spec{Args: args, Env: append([]string{childEnv + "=1"}, env...),
		Wrap: wrap, Files: files, Timeout: childTimeout})
}

// runChild runs the CLI in a new process to its end.
func runChild(t *testing.T, env []string, args ...string) (*crashtest.Child, crashtest.Exit) {
	t.Helper()
	c := startChild(t, env, nil, args...)
	return c, c.Wait()
}

// settleKilled waits, after c was killed with SIGKILL and reaped, until
// the PostgreSQL server has ended c's sessions (pgtest.WaitSessionsGone),
// so that what the test reads next is all c will ever have written: a
// checkpoint c sent just before it died may still commit after the kill
// (TestCheckpointSentBeforeSIGKILLCommitsAfterIt). Without
// STEPWISE_TEST_PG it returns at once, and on SQLite it finds no session
// at once: a dead process's SQLite writes are over when it is.
func settleKilled(t *testing.T, c *crashtest.Child) {
	t.Helper()
	pgtest.WaitSessionsGone(t, c.SessionName())
}

// gatedChildren starts the CLI in n processes and returns once all of them
// are ready to run, with release letting them all go at the same moment.
func gatedChildren(t *testing.T, n int, args ...[]string) (cs []*crashtest.Child, release func()) {
	t.Helper()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	gateR, gateW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer readyR.Close()
	defer gateR.Close()
	for i := range n {
		cs = append(cs, startChild(t, []string{gateEnv + "=1"}, []*os.File{readyW, gateR}, args[i]...))
	}
	readyW.Close()
	buf := make([]byte, n)
	if _, err := io.ReadFull(readyR, buf); err != nil {
		gateW.Close()
		t.Fatalf("children did not get ready: %v", err)
	}
	return cs, func() { gateW.Close() }
}

// touch creates an empty file.
func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// The cmd tests run on the store STEPWISE_TEST_STORE selects: sqlite (the
// default) or postgres, on the server STEPWISE_TEST_PG names, each test in
// a schema of its own. Tests about SQLite files (paths, locks, pragmas)
// stay on SQLite whatever it says, and say so.
const (
	storeEnv      = "STEPWISE_TEST_STORE"
	storeSQLite   = "sqlite"
	storePostgres = "postgres"
)

// testStore returns the store the tests run on, failing t on a value of
// STEPWISE_TEST_STORE it does not know.
func testStore(t testing.TB) string {
	t.Helper()
	switch v := os.Getenv(storeEnv); v {
	case "", storeSQLite:
		return storeSQLite
	case storePostgres:
		return storePostgres
	default:
		t.Fatalf("%s=%q: want %s or %s", storeEnv, v, storeSQLite, storePostgres)
		return ""
	}
}

// onPostgres reports whether the tests run on PostgreSQL.
func onPostgres(t testing.TB) bool { t.Helper(); return testStore(t) == storePostgres }

// testDB returns a fresh checkpoint location on the selected store, for
// --db: a file path in a new temporary directory (not created yet), or
// the URL of a new PostgreSQL schema (dropped when t ends).
// STEPWISE_TEST_STORE=postgres without STEPWISE_TEST_PG fails t: a pass
// asked for on PostgreSQL must not quietly run nothing.
func testDB(t testing.TB) string {
	t.Helper()
	if !onPostgres(t) {
		return sqliteDB(t)
	}
	if os.Getenv(pgtest.EnvURL) == "" {
		t.Fatalf("%s=%s but %s is not set: give the server's URL, e.g. %s=postgres://postgres@127.0.0.1:5432/test",
			storeEnv, storePostgres, pgtest.EnvURL, pgtest.EnvURL)
	}
	return pgtest.Schema(t)
}

// sqliteDB returns a SQLite file path in a new temporary directory, for
// the tests that are about SQLite files whatever the selected store.
func sqliteDB(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "stepwise.db")
}

// dialStore opens the checkpoint store at loc (a path or a postgres://
// URL), creating its tables; the caller closes it. The PostgreSQL store
// runs on the caller's clock, so a test can claim a run "an hour ago"; the
// CLI under test runs on the server's, which is this machine's.
func dialStore(t testing.TB, loc string) checkpoint.Backend {
	t.Helper()
	ctx := context.Background()
	var st checkpoint.Backend
	var err error
	if stores.IsURL(loc) {
		st, err = postgres.Open(ctx, postgres.Config{URL: loc, CallerClock: true})
	} else {
		st, err = sqlite.Open(ctx, sqlite.Config{Path: loc})
	}
	if err != nil {
		t.Fatalf("open checkpoint store %s: %v", loc, err)
	}
	return st
}

// openStore is dialStore, closed when t ends.
func openStore(t testing.TB, loc string) checkpoint.Backend {
	t.Helper()
	st := dialStore(t, loc)
	t.Cleanup(func() { st.Close() })
	return st
}

// createDB creates the checkpoint store at loc with its tables.
func createDB(t *testing.T, loc string) {
	t.Helper()
	if err := dialStore(t, loc).Close(); err != nil {
		t.Fatal(err)
	}
}

// testFiles returns a fresh checkpoint location on the selected store
// (see testDB) and a side file path in a fresh temporary directory.
func testFiles(t *testing.T) (db, side string) {
	t.Helper()
	return testDB(t), filepath.Join(t.TempDir(), "side.log")
}

// sqliteFiles is testFiles on SQLite whatever the selected store: the
// database file and the side file in one fresh temporary directory.
func sqliteFiles(t *testing.T) (db, side string) {
	dir := t.TempDir()
	return filepath.Join(dir, "stepwise.db"), filepath.Join(dir, "side.log")
}
