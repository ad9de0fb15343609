package cmd

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// opsDailyParams are the parameters of the opsdaily test job: a daily job
// whose run key is its business date, as backfill needs.
type opsDailyParams struct {
	Date string `param:"date,key" format:"date" help:"business date"`
	Side string `param:"side,required" help:"side-effect log file"`
	// Fail names a directory: the run of a date fails while a file named
	// for the date exists in it.
	Fail string `param:"fail" help:"directory of dates that fail"`
	// Hold makes each run wait (up to opsHoldMax) until this many runs
	// have been going at once, so a test sees runs overlap without
	// sleeping for a guess.
	Hold int `param:"hold" default:"0" help:"runs to wait for"`
}

// opsHoldMax bounds a held run's wait: a backfill that never runs Hold at
// once is slow, and fails on the gauge's maximum.
const opsHoldMax = 10 * time.Second

// opsGauge counts the opsdaily runs going at once, per side file.
type opsGauge struct {
	mu           sync.Mutex
	now, highest int
}

var opsGauges sync.Map // side file -> *opsGauge

func opsGaugeOf(side string) *opsGauge {
	g, _ := opsGauges.LoadOrStore(side, &opsGauge{})
	return g.(*opsGauge)
}

func (g *opsGauge) enter() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.now++
	g.highest = max(g.highest, g.now)
}

func (g *opsGauge) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.now--
}

func (g *opsGauge) max() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.highest
}

var opsDailyJob = jobs.Define("opsdaily", func(ctx context.Context, run *steps.Run, p opsDailyParams) error {
	_, err := steps.Do(ctx, run, steps.ID("build", p.Date), func(ctx context.Context) (string, error) {
		g := opsGaugeOf(p.Side)
		g.enter()
		defer g.leave()
		if err := appendLine(p.Side, sideRan+" "+steps.ID("build", p.Date)); err != nil {
			return "", err
		}
		for deadline := time.Now().Add(opsHoldMax); g.max() < p.Hold && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		if p.Fail != "" {
			if _, err := os.Stat(filepath.Join(p.Fail, p.Date)); err == nil {
				return "", errors.New("no data for " + p.Date)
			}
		}
		return "report of " + p.Date, nil
	})
	return err
}, jobs.Help("test job: one step per business date"))

func TestBackfillCommand(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	fail := t.TempDir()
	side := "side=" + c.side
	failP := "fail=" + fail
	backfill := func(from, to string, more ...string) []string {
		return append([]string{"backfill", "opsdaily", "--from", from, "--to", to, "-p", side, "-p", failP, "--operator", "alice"}, more...)
	}
	runs := func() []checkpoint.Run {
		t.Helper()
		rs, err := c.store().Runs(context.Background(), checkpoint.RunFilter{})
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	status := func(date string) string {
		t.Helper()
		s := c.run("opsdaily/" + date)
		if !s.found {
			return "-"
		}
		return s.info.Run.Status
	}

	// A dry run lists each date and what it would do, and starts nothing.
	o := c.want(ExitOK, []string{"DATE", "ACTION", "dry run: nothing started"}, backfill("2026-01-01", "2026-01-03", "--dry-run")...)
	for _, d := range []string{"2026-01-01", "2026-01-02", "2026-01-03"} {
		if !opsLineHas(o.stdout, d, "opsdaily/"+d, "start") {
			t.Errorf("dry run does not list %s to start\n%s", d, o)
		}
	}
	if rs := runs(); len(rs) != 0 {
		t.Errorf("dry run started %d runs", len(rs))
	}
	c.wantRan(nil)

	// One run per date.
	c.want(ExitOK, []string{"run opsdaily/2026-01-01 succeeded", "run opsdaily/2026-01-03 succeeded"}, backfill("2026-01-01", "2026-01-03")...)
	for _, d := range []string{"2026-01-01", "2026-01-02", "2026-01-03"} {
		if got := status(d); got != checkpoint.RunSucceeded {
			t.Errorf("%s: %s; want succeeded", d, got)
		}
	}
	c.wantRan(map[string]int{"build/2026-01-01": 1, "build/2026-01-02": 1, "build/2026-01-03": 1})

	// Succeeded dates are skipped; a new date in the range starts.
	o = c.want(ExitOK, []string{"run opsdaily/2026-01-04 succeeded"}, backfill("2026-01-02", "2026-01-04")...)
	if !opsLineHas(o.stdout, "2026-01-02", "succeeded", "skip (succeeded)") || strings.Contains(o.stdout, "run opsdaily/2026-01-02") {
		t.Errorf("backfill over a succeeded date did not skip it\n%s", o)
	}
	c.wantRan(map[string]int{"build/2026-01-01": 1, "build/2026-01-02": 1, "build/2026-01-03": 1, "build/2026-01-04": 1})

	// --reprocess all reruns succeeded dates, forced and audited; their
	// checkpointed steps are still skipped.
	o = c.want(ExitOK, []string{"rerun (forced)", "run opsdaily/2026-01-01 succeeded (attempt 2): 0 steps executed, 1 skipped"},
		backfill("2026-01-01", "2026-01-02", "--reprocess", "all")...)
	for _, d := range []string{"2026-01-01", "2026-01-02"} {
		if as := c.wantAudits("opsdaily/"+d, "backfill --reprocess all"); len(as) == 1 && (as[0].Operator != "alice" || as[0].Reason != "backfill 2026-01-01..2026-01-02") {
			t.Errorf("audit = %+v", as[0])
		}
		if s := c.run("opsdaily/" + d); len(s.info.Attempts) != 2 {
			t.Errorf("%s has %d attempts; want 2", d, len(s.info.Attempts))
		}
	}
	c.wantAudits("opsdaily/2026-01-03")
	c.wantRan(map[string]int{"build/2026-01-01": 1, "build/2026-01-02": 1, "build/2026-01-03": 1, "build/2026-01-04": 1})

	// A failing date fails the backfill (exit 1) and not the others.
	touch(t, filepath.Join(fail, "2026-01-06"))
	o = c.want(ExitFailed, []string{"run opsdaily/2026-01-05 succeeded", "run opsdaily/2026-01-06 failed", "1 of 2 runs did not succeed"},
		backfill("2026-01-05", "2026-01-06")...)
	if got := status("2026-01-06"); got != checkpoint.RunFailed {
		t.Fatalf("2026-01-06: %s; want failed", got)
	}
	if err := os.Remove(filepath.Join(fail, "2026-01-06")); err != nil {
		t.Fatal(err)
	}
	// Without --reprocess failed, the failed date is skipped...
	o = c.want(ExitOK, []string{"skip (failed; --reprocess failed resumes it)"}, backfill("2026-01-05", "2026-01-06")...)
	if got := status("2026-01-06"); got != checkpoint.RunFailed {
		t.Errorf("2026-01-06 after a plain backfill: %s; want still failed", got)
	}
	// ...with it, resumed; the succeeded date is still skipped.
	o = c.want(ExitOK, []string{"run opsdaily/2026-01-06 succeeded (attempt 2): 1 step executed"},
		backfill("2026-01-05", "2026-01-06", "--reprocess", "failed")...)
	if !opsLineHas(o.stdout, "2026-01-06", "failed", "resume") || !opsLineHas(o.stdout, "2026-01-05", "skip (succeeded)") {
		t.Errorf("--reprocess failed plan\n%s", o)
	}
	c.wantRan(map[string]int{"build/2026-01-01": 1, "build/2026-01-02": 1, "build/2026-01-03": 1, "build/2026-01-04": 1,
		"build/2026-01-05": 1, "build/2026-01-06": 2})

	// Mistakes in what was typed start nothing.
	before := len(runs())
	for _, tc := range []struct {
		args []string
		says string
	}{
		{backfill("2026-02-05", "2026-02-01"), "from <= to"},
		{backfill("2026-02-30", "2026-03-01"), "YYYY-MM-DD"},
		{backfill("yesterday", "2026-03-01"), "YYYY-MM-DD"},
		{backfill("2000-01-01", "2026-01-01"), "at most ten years"},
		{backfill("2026-02-01", "2026-02-02", "--max-parallel", "0"), "--max-parallel"},
		{backfill("2026-02-01", "2026-02-02", "--reprocess", "some"), "--reprocess"},
		{[]string{"backfill", "crashy", "--from", "2026-02-01", "--to", "2026-02-02", "-p", side}, "no identifying date parameter"},
		{[]string{"backfill", "nosuchjob", "--from", "2026-02-01", "--to", "2026-02-02"}, "nosuchjob"},
		{[]string{"backfill", "opsdaily", "--to", "2026-02-02"}, "--from"},
	} {
		c.want(ExitUsage, []string{tc.says}, tc.args...)
	}
	if n := len(runs()); n != before {
		t.Errorf("refused backfills started %d runs", n-before)
	}
}

func TestBackfillMaxParallel(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	c.want(ExitOK, []string{"run opsdaily/2026-03-04 succeeded"},
		"backfill", "opsdaily", "--from", "2026-03-01", "--to", "2026-03-04", "-p", "side="+c.side, "-p", "hold=2", "--max-parallel", "2")
	if got := opsGaugeOf(c.side).max(); got != 2 {
		t.Errorf("at most %d runs went at once; want 2", got)
	}
	c.wantRan(map[string]int{"build/2026-03-01": 1, "build/2026-03-02": 1, "build/2026-03-03": 1, "build/2026-03-04": 1})
	for _, d := range []string{"2026-03-01", "2026-03-02", "2026-03-03", "2026-03-04"} {
		if s := c.run("opsdaily/" + d); s.info.Run.Status != checkpoint.RunSucceeded {
			t.Errorf("%s: %s; want succeeded", d, s.info.Run.Status)
		}
	}
}

// TestBackfillParallelOnPlainWriters runs parallel backfill runs with
// Execute writing to plain bytes.Buffers, as an embedding program or test
// may: the runs' logs must not race on the writer (-race finds it).
//
// Not parallel: a race it finds is blamed on every test running with it.
func TestBackfillParallelOnPlainWriters(t *testing.T) {
	db, side := testFiles(t)
	var stdout, stderr bytes.Buffer
	code := Execute(context.Background(), opsRegistry(), []string{"--db", db, "backfill", "opsdaily",
		"--from", "2026-04-01", "--to", "2026-04-08", "-p", "side=" + side, "-p", "hold=8", "--max-parallel", "8"}, &stdout, &stderr)
	if code != ExitOK {
		t.Fatalf("backfill: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
}

// opsLineHas reports whether one line of out contains every one of texts.
func opsLineHas(out string, texts ...string) bool {
	for line := range strings.Lines(out) {
		all := true
		for _, s := range texts {
			all = all && strings.Contains(line, s)
		}
		if all {
			return true
		}
	}
	return false
}
