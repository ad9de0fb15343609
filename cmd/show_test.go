package cmd

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// opsStops holds, per side file, the cancel of the command whose opsstop
// run item 3 interrupts.
var opsStops sync.Map

// opsStopJob is a batch step like opsbatch's, whose item 3 interrupts the
// run (cancels the command's context, as a signal would) when a cancel is
// registered for its side file.
var opsStopJob = jobs.Define("opsstop", func(ctx context.Context, run *steps.Run, p opsLedgerParams) error {
	items := []string{"1", "2", "3", "4"}
	_, err := steps.ForEach(ctx, run, "pay", steps.Slice(items, func(it string) string { return it }),
		func(ctx context.Context, it string, e *steps.Effects) (string, error) {
			if it == "3" {
				if cancel, ok := opsStops.LoadAndDelete(p.Side); ok {
					cancel.(context.CancelFunc)()
					return "", ctx.Err()
				}
			}
			e.Add("acct:"+p.Key, 1)
			return it, appendLine(p.Side, sideRan+" pay/"+it)
		}, steps.ChunkSize(1), steps.WithTarget(steps.State))
	return err
}, jobs.Help("test job: a batch step that a signal interrupts at item 3"))

// opsRejectJob's one effect step would overdraw acct:KEY: it is rejected.
var opsRejectJob = jobs.Define("opsreject", func(ctx context.Context, run *steps.Run, p opsLedgerParams) error {
	_, err := steps.Apply(ctx, run, "debit", steps.State, func(ctx context.Context, e *steps.Effects) (string, error) {
		e.Add("acct:"+p.Key, -5, steps.NotBelow(0))
		return "debited", nil
	})
	var rej *steps.RejectedError
	if errors.As(err, &rej) {
		return nil // a pinned business outcome; the run succeeds
	}
	return err
}, jobs.Help("test job: an effect step rejected by its guard"))

// execCtx is exec with the command's context.
func (c *opsCLI) execCtx(ctx context.Context, args ...string) opsOut {
	c.t.Helper()
	args = append([]string{"--db", c.db}, args...)
	var out, errb syncBuffer
	code := Execute(ctx, opsRegistry(), args, &out, &errb)
	return opsOut{args: args, code: code, stdout: out.String(), stderr: errb.String()}
}

// opsShownStep is a step of `show --json` with the fields these tests read.
type opsShownStep struct {
	ID             string             `json:"id"`
	Status         string             `json:"status"`
	RecordedStatus string             `json:"recorded_status"`
	Output         steps.BatchSummary `json:"output"`
	StartedAt      time.Time          `json:"started_at"`
	FinishedAt     *time.Time         `json:"finished_at"`
}

func (c *opsCLI) shownSteps(runID string) map[string]opsShownStep {
	c.t.Helper()
	o := c.want(ExitOK, nil, "show", runID, "--json")
	var v struct {
		Steps []json.RawMessage `json:"steps"`
	}
	if err := json.Unmarshal([]byte(o.stdout), &v); err != nil {
		c.t.Fatalf("show --json: %v\n%s", err, o)
	}
	m := map[string]opsShownStep{}
	for _, raw := range v.Steps {
		var s opsShownStep
		_ = json.Unmarshal(raw, &s) // an output that is no BatchSummary leaves it zero
		if s.ID == "" {
			c.t.Fatalf("show --json step without an id: %s", raw)
		}
		m[s.ID] = s
	}
	return m
}

// TestShowStoppedBatchStep checks show reports a batch step whose run
// failed, was interrupted or whose runner vanished with the attempt's end
// and the items done, not as running with 0 completed.
func TestShowStoppedBatchStep(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, c *opsCLI, runID, status string, completed int64) {
		t.Helper()
		s := c.shownSteps(runID)["pay"]
		if s.Status != status || s.RecordedStatus != checkpoint.StepRunning || s.Output.Completed != completed ||
			s.Output.Total != 4 || s.FinishedAt != nil {
			t.Errorf("show --json step pay = %+v; want status %s (recorded running), %d of 4 completed, no finish time", s, status, completed)
		}
		o := c.want(ExitOK, nil, "show", runID)
		line := lineWith(o.stdout, "pay  ")
		if !strings.Contains(line, " "+status+" ") || strings.Contains(line, "running") ||
			!strings.Contains(line, `"completed":`+itoa(completed)) || !strings.Contains(line, " - ") {
			t.Errorf("show's line for pay = %q; want %s, no took, %d completed\n%s", line, status, completed, o)
		}
	}
	t.Run("failed", func(t *testing.T) {
		c := newOpsCLI(t)
		fail := filepath.Join(filepath.Dir(c.side), "fail")
		touch(t, fail)
		c.want(ExitFailed, []string{"payee unknown"}, "run", "opsbatch", "-p", "key=f", "-p", "side="+c.side, "-p", "fail="+fail)
		check(t, c, "opsbatch/f", checkpoint.RunFailed, 2)
	})
	t.Run("interrupted", func(t *testing.T) {
		c := newOpsCLI(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		opsStops.Store(c.side, context.CancelFunc(cancel))
		if o := c.execCtx(ctx, "run", "opsstop", "-p", "key=i", "-p", "side="+c.side); o.code != ExitInterrupted {
			t.Fatalf("exit %d; want %d\n%s", o.code, ExitInterrupted, o)
		}
		check(t, c, "opsstop/i", checkpoint.RunInterrupted, 2)
		// Resumed, it runs again and finishes: then it is completed.
		c.want(ExitOK, nil, "resume", "opsstop/i")
		if s := c.shownSteps("opsstop/i")["pay"]; s.Status != checkpoint.StepCompleted || s.RecordedStatus != "" || s.Output.Completed != 4 {
			t.Errorf("after the resume, show --json step pay = %+v; want completed, 4 completed", s)
		}
	})
	t.Run("runner gone", func(t *testing.T) {
		c := newOpsCLI(t)
		l := c.claimJob(opsBatchJob, map[string]string{"key": "g", "side": c.side}, time.Now().Add(-time.Hour), time.Minute)
		at := time.Now().Add(-time.Hour)
		err := c.store().InTx(context.Background(), l, func(tx checkpoint.Tx) error {
			if err := tx.PutStep(checkpoint.Step{ID: "pay", Status: checkpoint.StepRunning, Output: []byte(`{"total":4,"target":"stepwise_state"}`),
				Tries: 1, StartedAt: at, FinishedAt: at}); err != nil {
				return err
			}
			return tx.PutItems([]checkpoint.Item{{Step: "pay", Key: "1", Status: checkpoint.StepCompleted, Output: []byte(`"1"`)}})
		})
		if err != nil {
			t.Fatal(err)
		}
		check(t, c, "opsbatch/g", "stale", 1)
	})
}

// lineWith returns the first line of out containing s.
func lineWith(out, s string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// TestShowRejectedApplyStep checks a step rejected by its guard has a
// finish time and a duration, not the zero time and -2562047h.
func TestShowRejectedApplyStep(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	c.want(ExitOK, nil, "run", "opsreject", "-p", "key=r", "-p", "side="+c.side)
	s := c.shownSteps("opsreject/r")["debit"]
	if s.Status != checkpoint.StepRejected || s.FinishedAt == nil || s.FinishedAt.Before(s.StartedAt) {
		t.Errorf("show --json step debit = %+v; want rejected, finished at or after it started", s)
	}
	o := c.want(ExitOK, nil, "show", "opsreject/r")
	line := lineWith(o.stdout, "debit")
	if f := strings.Fields(line); len(f) < 5 || f[1] != "rejected" || strings.HasPrefix(f[4], "-") {
		t.Errorf("show's line for debit = %q; want rejected with a duration that is not negative\n%s", line, o)
	}
	if strings.Contains(o.stdout, "0001-01-01") {
		t.Errorf("show prints a zero time\n%s", o)
	}
}

// TestExitCodesOfRefusals checks each case the help lists for 4 and 5:
// recover, abandon and reset on a live run give 4; resolve of a step
// awaiting nothing gives 5 like the other refusals.
func TestExitCodesOfRefusals(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	l := c.liveCrashy("l")
	err := c.store().InTx(context.Background(), l, func(tx checkpoint.Tx) error {
		return tx.PutStep(checkpoint.Step{ID: "step/1", Status: checkpoint.StepCalling, Tries: 1, StartedAt: time.Now()})
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"recover", "crashy/l"},
		{"abandon", "crashy/l", "--reason", "x"},
		// --force: clearing an outside call of unknown outcome is refused
		// (5) before the store is asked, which refuses the live run.
		{"reset", "crashy/l", "--step", "step/1", "--reason", "x", "--force"},
		{"resolve", "crashy/l", "--step", "step/1", "--as", "done", "--reason", "x"},
	} {
		c.want(ExitHeld, []string{"held by " + opsForeign}, args...)
	}
	c.wantAudits("crashy/l")

	c.want(ExitOK, nil, "run", "opsledger", "-p", "key=d", "-p", "side="+c.side)
	o := c.want(ExitOperator, []string{"step credit of opsledger/d is completed", "nothing to resolve"},
		"resolve", "opsledger/d", "--step", "credit", "--as", "retry", "--reason", "x")
	if o.stdout != "" {
		t.Errorf("refused resolve printed on stdout: %q", o.stdout)
	}
	if s := c.run("opsledger/d"); s.steps["credit"].Status != checkpoint.StepCompleted {
		t.Errorf("refused resolve changed credit to %q", s.steps["credit"].Status)
	}
	c.wantAudits("opsledger/d")
	// The other refusals give the same code.
	c.want(ExitOperator, []string{"--force"}, "reset", "opsledger/d", "--step", "credit", "--reason", "x")
	c.want(ExitOperator, []string{"--force"}, "rerun", "opsledger/d")
	c.want(ExitOperator, []string{"not running"}, "recover", "opsledger/d")
	// Help lists every case.
	o = c.want(ExitOK, nil, "--help")
	for _, s := range []string{"4  another process holds it", "recover, abandon, reset and resolve on a live run",
		"database is locked", "5  refused", "resolve of a step awaiting no decision"} {
		if !strings.Contains(strings.Join(strings.Fields(o.stdout), " "), strings.Join(strings.Fields(s), " ")) {
			t.Errorf("--help does not say %q\n%s", s, o.stdout)
		}
	}
}

// holdWriteLock takes SQLite's write lock on db from another connection
// (BEGIN IMMEDIATE, as a paused runner mid-transaction holds it) and
// returns its release.
func holdWriteLock(t *testing.T, db string) (release func()) {
	t.Helper()
	dsn, err := sqlite.DSN(sqlite.Config{Path: db})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.BeginTx(context.Background(), nil) // BEGIN IMMEDIATE through _txlock
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			tx.Rollback()
			conn.Close()
		})
	}
	t.Cleanup(release)
	return release
}

// TestLockedDatabase checks a runner facing a database another process
// holds locked exits 4 naming the file, and with --wait waits for the lock
// and then runs.
func TestLockedDatabase(t *testing.T) {
	t.Parallel()
	c := newSQLiteOpsCLI(t) // about SQLite's write lock
	release := holdWriteLock(t, c.db)

	o := c.want(ExitHeld, []string{"database is locked", c.db, "--wait", "--busy-timeout"},
		"--busy-timeout", "100ms", "run", "crashy", "-p", "key=w", "-p", "side="+c.side)
	if o.stdout != "" {
		t.Errorf("locked run printed on stdout: %q", o.stdout)
	}

	done := make(chan opsOut, 1)
	go func() {
		done <- c.exec("--busy-timeout", "100ms", "run", "crashy", "-p", "key=w", "-p", "side="+c.side, "--wait")
	}()
	// It keeps waiting well past its busy timeout...
	select {
	case o := <-done:
		t.Fatalf("--wait gave up on the locked database:\n%s", o)
	case <-time.After(time.Second):
	}
	// ...and runs once the lock is released.
	release()
	select {
	case o := <-done:
		if o.code != ExitOK || !strings.Contains(o.stdout, "run crashy/w succeeded (attempt 1)") ||
			!strings.Contains(o.stderr, "database locked by another process; waiting") {
			t.Errorf("exit %d; want 0, the run succeeded after logging its wait\n%s", o.code, o)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("--wait run did not finish 30s after the lock was released")
	}
	c.wantRan(map[string]int{"step/1": 1, "step/2": 1, "step/3": 1})
}
