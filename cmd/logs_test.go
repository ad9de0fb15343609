package cmd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// The operators' log tests run the CLI in-process where they can and in
// real processes (re-executed as in the crash tests, see TestMain) for
// signals and serve. logsChildEnv makes the child the CLI with logJobs
// and logSchedules; init, not TestMain, catches it, as for serve.
const logsChildEnv = "STEPWISE_TEST_LOGS"

func init() {
	if os.Getenv(logsChildEnv) != "1" {
		return
	}
	os.Args = append([]string{os.Args[0]}, crashtest.ChildArgs()...)
	Main(logRegistry(), Schedules(logSchedules()...), Name("stepwise"))
}

func logRegistry() *jobs.Registry {
	reg := testRegistry()
	reg.MustRegister(batchyJob, batchDayJob, panickyJob)
	return reg
}

// batchyParams are the parameters of the batchy job: one batch step "post"
// over Items items, Chunk per chunk; item BlockAt notes "blocked" in Side
// and waits for the run to be interrupted.
type batchyParams struct {
	Key     string `param:"key,key" help:"run key"`
	Items   int    `param:"items" default:"3" help:"items of the post step"`
	Chunk   int    `param:"chunk" default:"1" help:"items per chunk"`
	Side    string `param:"side" help:"file the blocking item notes itself in"`
	BlockAt int    `param:"block-at" default:"0" help:"item that waits for the interruption (0: none)"`
}

var batchyJob = jobs.Define("batchy", func(ctx context.Context, run *steps.Run, p batchyParams) error {
	return postItems(ctx, run, p)
}, jobs.Help("test job: one batch step, optionally waiting inside an item"))

// batchDayParams identify a batchy run by business date, for backfill.
type batchDayParams struct {
	Date  string `param:"date,key" format:"date" help:"business date"`
	Items int    `param:"items" default:"3" help:"items of the post step"`
}

var batchDayJob = jobs.Define("batchday", func(ctx context.Context, run *steps.Run, p batchDayParams) error {
	return postItems(ctx, run, batchyParams{Items: p.Items, Chunk: 1})
}, jobs.Help("test job: one batch step per business date"))

func postItems(ctx context.Context, run *steps.Run, p batchyParams) error {
	items := make([]int, p.Items)
	for i := range items {
		items[i] = i + 1
	}
	_, err := steps.ForEach(ctx, run, "post", steps.Slice(items, func(i int) string { return fmt.Sprintf("%03d", i) }),
		func(ctx context.Context, i int, _ *steps.Effects) (int, error) {
			if i == p.BlockAt {
				if err := appendLine(p.Side, "blocked"); err != nil {
					return 0, err
				}
				<-ctx.Done()
				return 0, ctx.Err()
			}
			return i, nil
		}, steps.ChunkSize(p.Chunk))
	return err
}

type panickyParams struct {
	Key string `param:"key,key" help:"run key"`
}

// panickyJob panics in the second item of its batch step.
var panickyJob = jobs.Define("panicky", func(ctx context.Context, run *steps.Run, p panickyParams) error {
	_, err := steps.ForEach(ctx, run, "post", steps.Slice([]int{1, 2, 3}, func(i int) string { return fmt.Sprint(i) }),
		panickyItem, steps.ChunkSize(1))
	return err
}, jobs.Help("test job: panics inside a batch item"))

func panickyItem(_ context.Context, i int, _ *steps.Effects) (int, error) {
	if i == 2 {
		panic(fmt.Sprintf("item %d has no price", i))
	}
	return i, nil
}

// logSchedules fire a batchy run and a panicky run every second.
func logSchedules() []runner.Schedule {
	key := func(f time.Time) map[string]string { return map[string]string{"key": f.UTC().Format(secondKey)} }
	return []runner.Schedule{
		{Name: "batchy-every-second", Job: "batchy", Spec: "* * * * * *", Location: time.UTC, Key: key},
		{Name: "panicky-every-second", Job: "panicky", Spec: "* * * * * *", Location: time.UTC, Key: key},
	}
}

// logLine is the part of a JSON log line the tests read; Raw keeps all of
// it.
type logLine struct {
	Level   string `json:"level"`
	Message string `json:"message"`
	Time    string `json:"time"`
	Job     string `json:"job"`
	RunID   string `json:"run_id"`
	Attempt int    `json:"attempt"`
	Step    string `json:"step_id"`
	Done    int64  `json:"done"`
	Total   int64  `json:"total"`
	Stack   string `json:"stack"`
	Error   string `json:"error"`
	Cause   string `json:"cause"`
	Raw     map[string]any
}

// jsonLines returns the JSON log lines of out (other lines, such as a
// progress bar's, are skipped).
func jsonLines(t *testing.T, out string) []logLine {
	t.Helper()
	var lines []logLine
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		text := sc.Text()
		i := strings.Index(text, `{"level":`)
		if i < 0 {
			continue
		}
		var l logLine
		if err := json.Unmarshal([]byte(text[i:]), &l); err != nil {
			t.Fatalf("log line %q: %v", text, err)
		}
		if err := json.Unmarshal([]byte(text[i:]), &l.Raw); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	return lines
}

var msTime = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(Z|[+-]\d\d:\d\d)$`)

// checkLogUnits fails unless every line's time has milliseconds and no
// field is a unit-less duration.
func checkLogUnits(t *testing.T, lines []logLine) {
	t.Helper()
	for _, l := range lines {
		if !msTime.MatchString(l.Time) {
			t.Errorf("line %q has time %q; want RFC 3339 with milliseconds", l.Message, l.Time)
		}
		for _, f := range []string{"took", "eta", "retry_in", "timeout", "lag", "grace", "deadline", "rate"} {
			if _, ok := l.Raw[f]; ok {
				t.Errorf("line %q has a unit-less duration field %q: %v", l.Message, f, l.Raw)
			}
		}
	}
}

// checkProgress fails unless lines hold progress lines of the runs, each
// with job, run_id and attempt.
func checkProgress(t *testing.T, lines []logLine, job string, runIDs ...string) {
	t.Helper()
	seen := map[string]bool{}
	for _, l := range lines {
		if l.Message != "progress" {
			continue
		}
		if l.Job == "" || l.Attempt < 1 || l.Step != "post" || !strings.HasPrefix(l.RunID, l.Job+"/") {
			t.Errorf("progress line without its run: %v", l.Raw)
		}
		if l.Job == job {
			seen[l.RunID] = true
		}
	}
	for _, id := range runIDs {
		if !seen[id] {
			t.Errorf("no progress line of %s in:\n%v", id, lines)
		}
	}
}

// A panic in an item fails the run (exit 1) with one error line; show
// prints the stack in full, naming the panicking function.
func TestPanicShownByShow(t *testing.T) {
	db, _ := testFiles(t)
	ctx := context.Background()
	var out, errb bytes.Buffer
	code := Execute(ctx, logRegistry(), []string{"--db", db, "--log-format", "json", "run", "panicky", "-p", "key=a"}, &out, &errb)
	if code != ExitFailed {
		t.Fatalf("panicking run: exit %d; want %d\nstdout:\n%s\nstderr:\n%s", code, ExitFailed, out.String(), errb.String())
	}
	if want := "stepwise: run panicky/a failed: panic in job code: item 2 has no price\n"; !strings.Contains(errb.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, errb.String())
	}
	var failed []logLine
	for _, l := range jsonLines(t, errb.String()) {
		if l.Level == "error" {
			failed = append(failed, l)
		}
	}
	if len(failed) != 1 || !strings.Contains(failed[0].Stack, "cmd.panickyItem") || failed[0].RunID != "panicky/a" {
		t.Errorf("error log lines %v; want one for panicky/a with the stack naming panickyItem", failed)
	}

	out.Reset()
	errb.Reset()
	if code := Execute(ctx, logRegistry(), []string{"--db", db, "show", "panicky/a"}, &out, &errb); code != ExitOK {
		t.Fatalf("show: exit %d\n%s", code, errb.String())
	}
	show := out.String()
	_, full, ok := strings.Cut(show, "\nattempt 1 error:\npanic in job code: item 2 has no price\n\ngoroutine ")
	if !ok || !strings.Contains(full, "cmd.panickyItem(") || !strings.Contains(full, "logs_test.go:") {
		t.Fatalf("show does not print attempt 1's panic stack in full:\n%s", show)
	}
	if !strings.Contains(show, "  error: panic in job code: item 2 has no price\n") {
		t.Errorf("show's run header lacks the panic's one-line error:\n%s", show)
	}
	if n := strings.Count(show, "cmd.panickyItem("); n != 1 {
		t.Errorf("show prints the stack %d times; want once:\n%s", n, show)
	}
	if !strings.Contains(show, "  panic in job code: item 2 has no price\n") {
		t.Errorf("the attempts table does not show the panic's first line alone:\n%s", show)
	}
}

// Backfill's runs log their progress with run_id, job and attempt, in
// seconds and with millisecond timestamps.
func TestBackfillLogsProgress(t *testing.T) {
	db, _ := testFiles(t)
	var out, errb bytes.Buffer
	code := Execute(context.Background(), logRegistry(), []string{"--db", db, "--log-format", "json",
		"backfill", "batchday", "--from", "2026-11-01", "--to", "2026-11-02", "--max-parallel", "2"}, &out, &errb)
	if code != ExitOK {
		t.Fatalf("backfill: exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	lines := jsonLines(t, errb.String())
	checkProgress(t, lines, "batchday", "batchday/2026-11-01", "batchday/2026-11-02")
	checkLogUnits(t, lines)
	var took int
	for _, l := range lines {
		if l.Message == "batch step completed" {
			if _, ok := l.Raw["took_seconds"].(float64); ok {
				took++
			}
		}
	}
	if took != 2 {
		t.Errorf("%d batch step completions with took_seconds; want 2:\n%s", took, errb.String())
	}
}

// Serve keeps firing when a run panics: the panicking runs fail with their
// stacks recorded, the other schedule's runs succeed, and their progress
// lines carry run_id, job and attempt.
func TestServeSurvivesPanicsAndLogsProgress(t *testing.T) {
	t.Parallel()
	db, _ := testFiles(t)
	c := startChild(t, []string{logsChildEnv + "=1"}, nil, "--db", db, "--log-format", "json", "serve", "--grace", "5s")
	st := openStore(t, db)
	count := func(job, status string) int {
		runs, err := st.Runs(context.Background(), checkpoint.RunFilter{Job: job, Status: status, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		return len(runs)
	}
	var polled time.Time
	c.WaitFor("two panicked runs and two batch runs after them", func() bool {
		if time.Since(polled) < 50*time.Millisecond {
			return false
		}
		polled = time.Now()
		return count("panicky", checkpoint.RunFailed) >= 2 && count("batchy", checkpoint.RunSucceeded) >= 3
	})
	if err := c.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.WantExit(c.Wait(), exited0)
	if !strings.Contains(c.Stdout(), "stepwise serve: stopped") {
		t.Errorf("serve did not stop cleanly:\n%s", c.Stdout())
	}
	panicked, err := st.Runs(context.Background(), checkpoint.RunFilter{Job: "panicky", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range panicked {
		info, err := st.Run(context.Background(), r.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != checkpoint.RunFailed || len(info.Attempts) != 1 || !strings.Contains(info.Attempts[0].Error, "cmd.panickyItem(") {
			t.Errorf("run %s: %s, attempts %+v; want failed once with the panic's stack", r.ID, r.Status, info.Attempts)
		}
	}
	lines := jsonLines(t, c.Stderr())
	var ids []string
	runs, err := st.Runs(context.Background(), checkpoint.RunFilter{Job: "batchy", Status: checkpoint.RunSucceeded, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		ids = append(ids, r.ID)
	}
	checkProgress(t, lines, "batchy", ids...)
	checkLogUnits(t, lines)
}

// On SIGINT the interruption is one WARN line naming the signal, the
// outcome is printed once (on stdout, not again as an error), and the
// progress bar is cleared before the line, with nothing of it after.
func TestSIGINTIsOneLine(t *testing.T) {
	db, side := testFiles(t)
	c := startChild(t, []string{logsChildEnv + "=1"}, nil, "--db", db, "--log-format", "json",
		"run", "batchy", "-p", "key=k", "-p", "items=4", "-p", "block-at=3", "-p", "side="+side, "--progress", "bar")
	c.WaitFor("item 3 blocked", func() bool {
		b, _ := os.ReadFile(side)
		return strings.Contains(string(b), "blocked\n")
	})
	if err := c.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	c.WantExit(c.Wait(), crashtest.Code(ExitInterrupted))
	stdout, stderr := c.Stdout(), c.Stderr()
	if n := strings.Count(stdout, "run batchy/k interrupted (attempt 1): 0 steps executed"); n != 1 {
		t.Errorf("the outcome is printed %d times on stdout; want once:\n%s", n, stdout)
	}
	if n := strings.Count(stdout, "resume it with: stepwise resume batchy/k\n"); n != 1 {
		t.Errorf("the resume hint is printed %d times; want once:\n%s", n, stdout)
	}
	if strings.Contains(stderr, "stepwise: ") {
		t.Errorf("stderr repeats the outcome as an error:\n%q", stderr)
	}
	var interrupted []logLine
	for _, l := range jsonLines(t, stderr) {
		if l.Level == "error" {
			t.Errorf("an ERROR line on an interruption: %v", l.Raw)
		}
		if strings.Contains(l.Message, "interrupted") {
			interrupted = append(interrupted, l)
		}
	}
	if len(interrupted) != 1 {
		t.Fatalf("%d lines about the interruption; want 1:\n%s", len(interrupted), stderr)
	}
	if l := interrupted[0]; l.Level != "warn" || l.Cause != "interrupt signal received" || l.RunID != "batchy/k" ||
		strings.Contains(l.Message, "context canceled") || l.Error != "" {
		t.Errorf("interruption line %v; want warn, cause \"interrupt signal received\", run_id, no internal error", l.Raw)
	}
	// The bar was drawn, cleared before the line, and not drawn again.
	at := strings.Index(stderr, `{"level":"warn"`)
	for at >= 0 && !strings.HasPrefix(stderr[at:], `{"level":"warn","job":"batchy","run_id":"batchy/k","attempt":1,"cause"`) {
		next := strings.Index(stderr[at+1:], `{"level":"warn"`)
		if next < 0 {
			t.Fatalf("no interruption line found in %q", stderr)
		}
		at += 1 + next
	}
	if at < 0 {
		t.Fatalf("no interruption line found in %q", stderr)
	}
	before, after := stderr[:at], stderr[at:]
	if !strings.Contains(before, "post") || !strings.Contains(before, "/4") {
		t.Errorf("no progress bar was drawn before the interruption:\n%q", before)
	}
	if !strings.HasSuffix(before, "\r") && !strings.HasSuffix(before, "\n") {
		t.Errorf("the interruption line starts on the bar's line: %q", before[max(0, len(before)-80):])
	}
	if strings.ContainsAny(after, "\r|█") || strings.Contains(after, "items/s") {
		t.Errorf("bar residue after the interruption line: %q", after)
	}
}

// The same for a plain step stopped by SIGINT: its failed try is not a
// second warning (the step runs again on resume).
func TestSIGINTInAStepIsOneLine(t *testing.T) {
	db, side := testFiles(t)
	release := filepath.Join(filepath.Dir(side), "release") // never created
	c := startChild(t, nil, nil, crashyArgs(db, "k", side, "steps=3", "block="+release, "block-at=2")...)
	c.WaitFor("step/2 started", func() bool { return readSide(t, side).ran["step/2"] == 1 })
	if err := c.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	c.WantExit(c.Wait(), crashtest.Code(ExitInterrupted))
	var loud []string
	for _, l := range jsonLines(t, c.Stderr()) {
		if l.Level != "info" && l.Level != "debug" {
			loud = append(loud, l.Level+": "+l.Message)
		}
	}
	if len(loud) != 1 || !strings.HasPrefix(loud[0], "warn: run interrupted") {
		t.Errorf("lines above info: %q; want only the run's interruption warning\nstderr:\n%s", loud, c.Stderr())
	}
	if strings.Contains(c.Stderr(), "stepwise: ") {
		t.Errorf("stderr repeats the outcome as an error:\n%s", c.Stderr())
	}
}
