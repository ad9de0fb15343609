package cmd

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// limitedJob is crashy with a concurrency limit of 2 runs at once. Each
// execution of its job function appends "start NANOS" and "end NANOS"
// (the wall clock of this host) to the file SIDE.times, around all of
// its steps.
var limitedJob = jobs.Define("limited", func(ctx context.Context, run *steps.Run, p crashyParams) error {
	if err := appendLine(p.Side+".times", fmt.Sprintf("start %d", time.Now().UnixNano())); err != nil {
		return err
	}
	err := runCrashy(ctx, run, p)
	if werr := appendLine(p.Side+".times", fmt.Sprintf("end %d", time.Now().UnixNano())); err == nil {
		err = werr
	}
	return err
}, jobs.Help("test job: crashy, at most two runs at once"), jobs.Limit(2))

// workerArgs are the arguments of a test worker on db: short polls, and
// a lease of lease (the takeover tests' are short, so a dead worker's run
// is taken over within a second or two; the others' leave renewals time
// under -race on a loaded machine, where a missed renewal self-fences).
func workerArgs(db, lease string, extra ...string) []string {
	return append([]string{"--db", db, "worker", "--poll", "50ms", "--lease", lease, "--grace", "5s"}, extra...)
}

// enqueueCrashy enqueues one crashy (or other job's) run per key, each
// with a side file of its own in dir, and returns the side files by key.
func enqueueCrashy(t *testing.T, db, dir, job string, keys []string, params ...string) map[string]string {
	t.Helper()
	sides := map[string]string{}
	for _, k := range keys {
		sides[k] = filepath.Join(dir, k+".log")
		args := []string{"--db", db, "enqueue", job, "-p", "key=" + k, "-p", "side=" + sides[k]}
		for _, p := range params {
			args = append(args, "-p", p)
		}
		c, exit := runChild(t, nil, args...)
		if exit.Code != ExitOK || !strings.Contains(c.Stdout(), "enqueued in queue default") {
			t.Fatalf("enqueue %s: %s\n%s", k, exit, c.Output())
		}
	}
	return sides
}

// waitStatus waits until every run of keys has status want, failing the
// test after a minute.
func waitStatus(t *testing.T, st checkpoint.Store, job string, keys []string, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var behind []string
		for _, k := range keys {
			info, err := st.Run(context.Background(), jobs.RunID(job, k))
			if err != nil || info.Run.Status != want {
				behind = append(behind, fmt.Sprintf("%s (%s)", k, info.Run.Status))
			}
		}
		if len(behind) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("runs not %s after a minute: %v", want, behind)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopWorkers sends SIGTERM to each worker and wants exit 0 from each.
func stopWorkers(t *testing.T, ws ...*crashtest.Child) {
	t.Helper()
	for _, w := range ws {
		if err := w.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range ws {
		if exit := w.Wait(); exit.Code != ExitOK {
			t.Errorf("worker after SIGTERM: %s; want exit 0\n%s", exit, w.Output())
		}
	}
}

// Three worker processes, two runs at a time each, share twelve queued
// runs: every run is claimed once and finished once, every step runs
// once, and SIGTERM stops each worker with exit 0.
func TestWorkerPool(t *testing.T) {
	db := testDB(t)
	createDB(t, db)
	dir := t.TempDir()
	var keys []string
	for i := range 12 {
		keys = append(keys, fmt.Sprintf("k%02d", i))
	}
	sides := enqueueCrashy(t, db, dir, "crashy", keys, "steps=2", "pace=20ms")
	var ws []*crashtest.Child
	for range 3 {
		ws = append(ws, startChild(t, nil, nil, workerArgs(db, "10s", "--concurrency", "2")...))
	}
	st := openStore(t, db)
	waitStatus(t, st, "crashy", keys, checkpoint.RunSucceeded)
	stopWorkers(t, ws...)
	owners := map[string]int{}
	for _, k := range keys {
		s := readRunIn(t, st, jobs.RunID("crashy", k))
		if len(s.info.Attempts) != 1 || s.info.Run.Fence != 1 || s.info.Attempts[0].Status != checkpoint.RunSucceeded {
			t.Errorf("%s: fence %d, attempts %+v; want one succeeded attempt under fence 1", k, s.info.Run.Fence, s.info.Attempts)
		} else {
			owners[checkpoint.OwnerName(s.info.Attempts[0].Owner)]++
		}
		checkRan(t, readSide(t, sides[k]), 2, map[string]int{"step/1": 1, "step/2": 1})
	}
	if len(owners) < 2 {
		t.Errorf("runs by owner %v; want the pool to share them", owners)
	}
}

// A worker killed mid-run leaves its run running under a lease nobody
// renews; another worker takes it once the lease expires, under a higher
// fence, and finishes it from its checkpoints. A worker paused past its
// lease (SIGSTOP) is fenced out when it wakes: its late write is refused
// and it records nothing, and SIGTERM still stops it with exit 0.
func TestWorkerTakesOverAfterLease(t *testing.T) {
	for _, how := range []string{"killed", "paused"} {
		t.Run(how, func(t *testing.T) {
			db := testDB(t)
			createDB(t, db)
			dir := t.TempDir()
			release := filepath.Join(dir, "release")
			sides := enqueueCrashy(t, db, dir, "crashy", []string{"x"}, "steps=3", "block="+release, "block-at=2")
			a := startChild(t, nil, nil, workerArgs(db, "2s")...)
			a.WaitFor("A started step/2", func() bool { return readSide(t, sides["x"]).ran["step/2"] == 1 })
			if how == "killed" {
				a.Kill()
				a.WantKilled()
				settleKilled(t, a)
			} else if err := a.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			b := startChild(t, nil, nil, workerArgs(db, "2s")...)
			b.WaitFor("B took the run over and started step/2", func() bool { return readSide(t, sides["x"]).ran["step/2"] == 2 })
			touch(t, release)
			st := openStore(t, db)
			waitStatus(t, st, "crashy", []string{"x"}, checkpoint.RunSucceeded)
			if how == "paused" {
				if err := a.Signal(syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
				a.WaitFor("A noticed it was fenced", func() bool { return strings.Contains(a.Stderr(), "fenced") })
				stopWorkers(t, a)
			}
			stopWorkers(t, b)
			s := readRunIn(t, st, jobs.RunID("crashy", "x"))
			got := []string{}
			for _, at := range s.info.Attempts {
				got = append(got, at.Status)
			}
			if !slices.Equal(got, []string{checkpoint.AttemptLost, checkpoint.RunSucceeded}) || s.info.Run.Fence != 2 {
				t.Errorf("attempts %v under fence %d; want [lost succeeded] under fence 2", got, s.info.Run.Fence)
			}
			if s.steps["step/2"].Attempt != 2 {
				t.Errorf("step/2 recorded by attempt %d; want 2 (the first worker's write fenced out)", s.steps["step/2"].Attempt)
			}
			checkRan(t, readSide(t, sides["x"]), 3, map[string]int{"step/1": 1, "step/2": 2, "step/3": 1})
		})
	}
}

// SIGTERM stops a worker with exit 0: the run in flight past the grace
// period is recorded interrupted with its lease released, due again for
// the next worker.
func TestWorkerSIGTERMReleases(t *testing.T) {
	db := testDB(t)
	createDB(t, db)
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	sides := enqueueCrashy(t, db, dir, "crashy", []string{"x"}, "steps=2", "block="+release, "block-at=1")
	w := startChild(t, nil, nil, "--db", db, "worker", "--poll", "50ms", "--grace", "100ms")
	w.WaitFor("the run started", func() bool { return readSide(t, sides["x"]).ran["step/1"] == 1 })
	stopWorkers(t, w)
	if !strings.Contains(w.Stdout(), "worker: stopped") {
		t.Errorf("worker output lacks its stop line:\n%s", w.Output())
	}
	s := readRun(t, db, jobs.RunID("crashy", "x"))
	if s.info.Run.Status != checkpoint.RunInterrupted || s.info.Run.LeaseOwner != "" || !s.info.Run.LeaseUntil.IsZero() {
		t.Fatalf("after SIGTERM: %s, leased to %q until %s; want interrupted, no lease", s.info.Run.Status, s.info.Run.LeaseOwner, s.info.Run.LeaseUntil)
	}
	touch(t, release)
	next := startChild(t, nil, nil, workerArgs(db, "10s")...)
	st := openStore(t, db)
	waitStatus(t, st, "crashy", []string{"x"}, checkpoint.RunSucceeded)
	stopWorkers(t, next)
}

// A job's concurrency limit holds across processes and paths: three
// workers driving three runs at a time each, and runs started directly
// with run --wait, never have more than two runs of the limited job going
// at once, as the job code's recorded start and end times show; a run
// started without --wait while the limit is full exits 4 naming it.
func TestWorkerLimitAcrossProcesses(t *testing.T) {
	db := testDB(t)
	createDB(t, db)
	dir := t.TempDir()
	hold := filepath.Join(dir, "hold")
	// Two runs hold the limit until released.
	held := enqueueCrashy(t, db, dir, "limited", []string{"h1", "h2"}, "steps=1", "block="+hold, "block-at=1")
	var ws []*crashtest.Child
	for range 3 {
		ws = append(ws, startChild(t, nil, nil, workerArgs(db, "10s", "--concurrency", "3")...))
	}
	ws[0].WaitFor("both holders started", func() bool {
		return readSide(t, held["h1"]).ran["step/1"] == 1 && readSide(t, held["h2"]).ran["step/1"] == 1
	})
	c, exit := runChild(t, nil, "--db", db, "run", "limited", "-p", "key=d0", "-p", "side="+filepath.Join(dir, "d0.log"))
	if exit.Code != ExitHeld || !strings.Contains(c.Stderr(), `limit "job:limited" allows 2 at once`) || !strings.Contains(c.Stderr(), "--wait") {
		t.Fatalf("run while the limit is full: %s; want exit 4 naming the limit and --wait\n%s", exit, c.Output())
	}
	var keys []string
	for i := range 8 {
		keys = append(keys, fmt.Sprintf("q%d", i))
	}
	enqueueCrashy(t, db, dir, "limited", keys, "steps=2", "pace=30ms")
	var direct []*crashtest.Child
	for i := range 2 {
		k := fmt.Sprintf("w%d", i)
		direct = append(direct, startChild(t, nil, nil, "--db", db, "run", "--wait", "limited", "-p", "key="+k,
			"-p", "side="+filepath.Join(dir, k+".log"), "-p", "steps=2", "-p", "pace=30ms"))
		keys = append(keys, k)
	}
	touch(t, hold)
	for _, d := range direct {
		if exit := d.Wait(); exit.Code != ExitOK {
			t.Errorf("run --wait: %s\n%s", exit, d.Output())
		}
	}
	st := openStore(t, db)
	keys = append(keys, "h1", "h2")
	waitStatus(t, st, "limited", keys, checkpoint.RunSucceeded)
	stopWorkers(t, ws...)
	// The job code's own start and end times, on this host's clock: the
	// attempts' recorded start is read before the claim waits for the
	// database's lock (SQLite's writer, the limit's advisory lock), so
	// under load it can precede the moment the run really started.
	type event struct {
		at    int64
		delta int
	}
	var events []event
	for _, k := range keys {
		info := readRunIn(t, st, jobs.RunID("limited", k)).info
		b, err := os.ReadFile(filepath.Join(dir, k+".log.times"))
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		starts := 0
		for line := range strings.Lines(string(b)) {
			kind, nanos, _ := strings.Cut(strings.TrimSpace(line), " ")
			n, err := strconv.ParseInt(nanos, 10, 64)
			if err != nil {
				t.Fatalf("%s: bad line %q", k, line)
			}
			delta := -1
			if kind == "start" {
				delta, starts = 1, starts+1
			}
			events = append(events, event{n, delta})
		}
		if starts != len(info.Attempts) {
			t.Errorf("%s: the job function ran %d times in %d attempts", k, starts, len(info.Attempts))
		}
	}
	slices.SortFunc(events, func(a, b event) int {
		if a.at != b.at {
			return cmp.Compare(a.at, b.at)
		}
		return a.delta - b.delta // an end at the same instant as a start comes first
	})
	most, now := 0, 0
	for _, e := range events {
		now += e.delta
		most = max(most, now)
	}
	if most != 2 {
		t.Errorf("at most %d runs of the limited job were going at once; want 2 (the limit, reached)", most)
	}
}

// A worker on PostgreSQL warns at start when autovacuum is disabled for
// the queue's tables, naming them and the fix; on SQLite it has nothing
// to say of it. It works either way.
func TestWorkerWarnsWithoutAutovacuum(t *testing.T) {
	db := testDB(t)
	createDB(t, db)
	st := openStore(t, db)
	if onPostgres(t) {
		pg, ok := st.(*postgres.Store)
		if !ok {
			t.Fatalf("store on PostgreSQL is %T", st)
		}
		if _, err := pg.Pool().Exec(context.Background(), "ALTER TABLE runs SET (autovacuum_enabled = false)"); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	enqueueCrashy(t, db, dir, "crashy", []string{"a"}, "steps=1")
	w := startChild(t, nil, nil, workerArgs(db, "10s")...)
	waitStatus(t, st, "crashy", []string{"a"}, checkpoint.RunSucceeded)
	stopWorkers(t, w)
	warned := strings.Contains(w.Stderr(), "autovacuum is disabled for the tables runs") &&
		strings.Contains(w.Stderr(), "RESET (autovacuum_enabled)")
	if onPostgres(t) != warned {
		t.Fatalf("on PostgreSQL %t: worker warned of runs' autovacuum %t; want %t\n%s", onPostgres(t), warned, onPostgres(t), w.Output())
	}
}
