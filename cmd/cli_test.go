package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// These tests hold the command line's conventions, through Execute (and
// Main, for the program's name): --version, help CMD, help layout, flag
// checks, the program's own name in hints, and --json results.

// cliRun runs args through Execute with opsRegistry and the options.
func cliRun(t *testing.T, args []string, opts ...Option) opsOut {
	t.Helper()
	var out, errb syncBuffer
	code := Execute(context.Background(), opsRegistry(), args, &out, &errb, opts...)
	return opsOut{args: args, code: code, stdout: out.String(), stderr: errb.String()}
}

// oneLine joins text's words with single spaces, undoing help's wrapping.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func TestVersionFlag(t *testing.T) {
	t.Parallel()
	o := cliRun(t, []string{"--version"})
	if o.code != ExitOK {
		t.Fatalf("exit %d\n%s", o.code, o)
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	if want := versionText("stepwise", bi) + "\n"; o.stdout != want {
		t.Errorf("--version printed %q, want %q", o.stdout, want)
	}
	// go test builds carry no VCS information: the fallback says so.
	hasRev := bi != nil && slices.ContainsFunc(bi.Settings, func(s debug.BuildSetting) bool { return s.Key == "vcs.revision" })
	if !hasRev && !strings.Contains(o.stdout, "revision  unknown (built without VCS information") {
		t.Errorf("--version of a binary without VCS information does not say so:\n%s", o.stdout)
	}
	if !strings.HasPrefix(o.stdout, "stepwise ") {
		t.Errorf("--version does not start with the program's name:\n%s", o.stdout)
	}
	// Any command takes it.
	if o2 := cliRun(t, []string{"runs", "--version"}); o2.code != ExitOK || o2.stdout != o.stdout {
		t.Errorf("runs --version: exit %d, %q; want exit 0 and %q", o2.code, o2.stdout, o.stdout)
	}
}

func TestVersionText(t *testing.T) {
	t.Parallel()
	vcs := []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
		{Key: "vcs.time", Value: "2026-11-28T02:00:00Z"}, {Key: "vcs.modified", Value: "true"}}
	cases := []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"stock binary from a tagged commit", &debug.BuildInfo{GoVersion: "go1.26.8",
			Main: debug.Module{Path: modulePath, Version: "v0.4.0"}, Settings: vcs[:3]},
			"stepwise v0.4.0\n  module    github.com/stepwise-run/stepwise\n" +
				"  revision  0123456789abcdef0123456789abcdef01234567 (git, committed 2026-11-28T02:00:00Z)\n  go        go1.26.8"},
		{"modified work tree", &debug.BuildInfo{GoVersion: "go1.26.8",
			Main: debug.Module{Path: modulePath, Version: "v0.4.1-0.20261128020000-0123456789ab+dirty"}, Settings: vcs},
			"stepwise v0.4.1-0.20261128020000-0123456789ab+dirty\n  module    github.com/stepwise-run/stepwise\n" +
				"  revision  0123456789abcdef0123456789abcdef01234567 (git, committed 2026-11-28T02:00:00Z, with uncommitted changes)\n  go        go1.26.8"},
		{"another module's program names Stepwise's version", &debug.BuildInfo{GoVersion: "go1.26.8",
			Main: debug.Module{Path: "example.com/mytool", Version: "(devel)"},
			Deps: []*debug.Module{{Path: "github.com/rs/zerolog", Version: "v1.35.1"},
				{Path: modulePath, Version: "v0.4.0", Replace: &debug.Module{Path: "../stepwise"}}}},
			"mytool (devel)\n  module    example.com/mytool\n  stepwise  v0.4.0 => ../stepwise\n" +
				"  revision  unknown (built without VCS information: by go test, with -buildvcs=false, or outside a repository)\n  go        go1.26.8"},
		{"no build information", nil, "mytool (version unknown: the binary carries no build information)"},
	}
	for _, c := range cases {
		name := "stepwise"
		if c.bi == nil || c.bi.Main.Path != modulePath {
			name = "mytool"
		}
		if got := versionText(name, c.bi); got != c.want {
			t.Errorf("%s: versionText =\n%s\nwant\n%s", c.name, got, c.want)
		}
	}
}

func TestHelpCommandIsHelpFlag(t *testing.T) {
	t.Parallel()
	// A nested command a program adds, as the stock binary's ledger seed.
	type seed struct {
		Accounts int `default:"10" help:"Accounts."`
	}
	type ledger struct {
		Seed seed `cmd:"" help:"Seed a ledger."`
	}
	opt := Command("ledger", "The ledger.", &ledger{})
	for _, cmdline := range [][]string{{"run"}, {"backfill"}, {"prune"}, {"ledger", "seed"}, {}} {
		viaHelp := cliRun(t, append([]string{"help"}, cmdline...), opt)
		viaFlag := cliRun(t, append(slices.Clone(cmdline), "--help"), opt)
		if viaHelp.code != ExitOK || viaFlag.code != ExitOK {
			t.Fatalf("help %v: exit %d and %d\n%s\n%s", cmdline, viaHelp.code, viaFlag.code, viaHelp, viaFlag)
		}
		if viaHelp.stdout != viaFlag.stdout || !strings.HasPrefix(viaHelp.stdout, "Usage: stepwise") {
			t.Errorf("help %v printed\n%s\nbut --help printed\n%s", cmdline, viaHelp.stdout, viaFlag.stdout)
		}
	}
	o := cliRun(t, []string{"help", "nosuch"})
	if o.code != ExitUsage || !strings.Contains(o.stderr, "nosuch") || !strings.Contains(o.stderr, "`stepwise --help`") {
		t.Errorf("help nosuch: exit %d, want 2 and an error naming it and pointing to --help\n%s", o.code, o)
	}
	if top := cliRun(t, []string{"--help"}); !strings.Contains(oneLine(top.stdout), "help Show a command's help: 'stepwise help run' is 'stepwise run --help'.") {
		t.Errorf("--help does not list the help command:\n%s", top.stdout)
	}
}

func TestHelpOwnFlagsBeforeGlobal(t *testing.T) {
	t.Parallel()
	// A program's own global flag (the stock binary's --tz) is global too.
	tz := &struct {
		TZ string `name:"tz" default:"UTC" help:"Time zone."`
	}{}
	opt := func(o *[]kong.Option) { *o = append(*o, kong.Embed(tz)) }
	for _, c := range []struct {
		args []string
		own  []string
	}{
		{[]string{"run", "--help"}, []string{"--wait", "--lease=30s", "--params=NAME=VALUE", "--dry-run", "--json"}},
		{[]string{"backfill", "--help"}, []string{"--from=STRING", "--max-parallel=1", "--json"}},
		{[]string{"runs", "--help"}, []string{"--job=STRING", "--limit=100"}},
	} {
		out := cliRun(t, c.args, opt).stdout
		global := strings.Index(out, "\nGlobal flags:\n")
		if global < 0 {
			t.Fatalf("%v has no Global flags section:\n%s", c.args, out)
		}
		if h := strings.Index(out, "--help"); h < 0 || h > global {
			t.Errorf("%v: --help is not among the command's flags:\n%s", c.args, out)
		}
		for _, f := range c.own {
			if i := strings.Index(out, f); i < 0 || i > global {
				t.Errorf("%v: own flag %s is not listed before the global flags:\n%s", c.args, f, out)
			}
		}
		for _, f := range []string{"--db=", "--synchronous=", "--busy-timeout=", "--log-level=", "--log-format=", "--version", "--tz="} {
			if i := strings.Index(out, f); i < global {
				t.Errorf("%v: global flag %s is not under Global flags:\n%s", c.args, f, out)
			}
		}
	}
}

func TestHelpListsEnumValues(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--help"}, "--progress=\"auto\" Batch progress: a live bar on a terminal and a log line every few seconds otherwise (auto), or forced. One of: auto, bar, log, none."},
		{[]string{"--help"}, "One of: auto, console, json."},
		{[]string{"--help"}, "Log level ($STEPWISE_LOG_LEVEL). One of: debug, info, warn, error."},
		{[]string{"--help"}, "One of: full, normal."},
		{[]string{"resolve", "--help"}, "One of: done, retry."},
		{[]string{"runs", "--help"}, "--status=STATUS Only runs with this status: queued (waiting for a worker), running, stale (left running by a runner that is gone), succeeded, failed, interrupted or abandoned"},
		{[]string{"backfill", "--help"}, "One of: none, failed, all."},
	} {
		if out := oneLine(cliRun(t, c.args).stdout); !strings.Contains(out, c.want) {
			t.Errorf("%v does not list the values: want %q in\n%s", c.args, c.want, out)
		}
	}
}

func TestNumberFlagsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := filepath.Join(dir, "never.db") // SQLite: a refused command creates no file
	crashy := []string{"crashy", "-p", "key=k", "-p", "side=" + filepath.Join(dir, "side")}
	backfill := []string{"backfill", "opsdaily", "--from", "2026-01-01", "--to", "2026-01-02", "-p", "side=" + filepath.Join(dir, "side")}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append([]string{"run", "--lease", "-5s"}, crashy...), "--lease: -5s is negative; use a positive duration such as 30s"},
		{append([]string{"run", "--lease=-5s"}, crashy...), "--lease: -5s is negative; use a positive duration such as 30s"},
		{append([]string{"run", "--lease", "0s"}, crashy...), "--lease: 0s is not allowed; use a positive duration such as 30s"},
		{append([]string{"run", "--lease", "5"}, crashy...), `--lease: "5" is not a duration; use one such as 30s`},
		{[]string{"resume", "crashy/k", "--lease", "0s"}, "--lease: 0s is not allowed; use a positive duration"},
		{[]string{"rerun", "crashy/k", "--lease", "-1m"}, "--lease: -1m is negative; use a positive duration"},
		{[]string{"dispatch", "--to", "stdout", "--every", "0s"}, "--every: 0s is not allowed; use a positive duration such as 30s"},
		{[]string{"dispatch", "--to", "stdout", "--every", "-30s"}, "--every: -30s is negative; use a positive duration such as 30s"},
		{[]string{"dispatch", "--to", "stdout", "--max-tries", "0"}, "--max-tries: 0 is not allowed; use a whole number of at least 1"},
		{[]string{"dispatch", "--to", "stdout", "--visibility", "0s"}, "--visibility: 0s is not allowed; use a positive duration"},
		{[]string{"outbox", "--limit", "0"}, "--limit: 0 is not allowed; use a whole number of at least 1"},
		{append(slices.Clone(backfill), "--max-parallel", "-2"), "--max-parallel: -2 is negative; use a whole number of at least 1"},
		{append(slices.Clone(backfill), "--max-parallel", "0"), "--max-parallel: 0 is not allowed; use a whole number of at least 1"},
		{append(slices.Clone(backfill), "--lease", "0s"), "--lease: 0s is not allowed; use a positive duration such as 30s"},
		{[]string{"runs", "--limit", "-5"}, "--limit: -5 is negative; use a whole number of at least 1"},
		{[]string{"runs", "--limit", "0"}, "--limit: 0 is not allowed; use a whole number of at least 1"},
		{[]string{"--busy-timeout", "-1s", "runs"}, "--busy-timeout: -1s is negative; use a positive duration such as 5s"},
		// 0s used to be taken silently as the 5s default.
		{[]string{"--busy-timeout", "0s", "runs"}, "--busy-timeout: 0s is not allowed; use a positive duration such as 5s"},
		{[]string{"prune", "--older-than", "-1h"}, `--older-than: "-1h": want a duration such as 90d or 720h`},
	} {
		o := cliRun(t, append([]string{"--db", db}, c.args...))
		if o.code != ExitUsage || !strings.Contains(o.stderr, c.want) || strings.Contains(o.stderr, "short flag") {
			t.Errorf("exit %d, want 2 with %q (and no kong \"short flag\")\n%s", o.code, c.want, o)
		}
		if !strings.Contains(o.stderr, "--help` for usage") {
			t.Errorf("the error does not point to the command's help\n%s", o)
		}
	}
	if _, err := os.Stat(db); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused command touched the database: %v", err)
	}
}

func TestInt64FlagTakesNegativeNumbers(t *testing.T) {
	t.Parallel()
	// int64 flags are money: "-500" is a value, not a short flag.
	c := &struct {
		Balance int64 `help:"Opening balance, minor units."`
		Delta   int64 `nonzero:"" help:"Change, minor units."`
	}{}
	parser, err := kong.New(c, cliConventions()...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parser.Parse([]string{"--balance", "-500", "--delta", "-1"}); err != nil || c.Balance != -500 || c.Delta != -1 {
		t.Errorf("--balance -500 --delta -1: err %v, balance %d, delta %d", err, c.Balance, c.Delta)
	}
	if _, err := parser.Parse([]string{"--delta", "0"}); err == nil || !strings.Contains(err.Error(), "--delta: 0 is not allowed; use a whole number other than 0") {
		t.Errorf("--delta 0: err %v, want it refused", err)
	}
}

func TestProgramNameInHints(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	mytool := []Option{Name("mytool")}
	run := func(args ...string) opsOut {
		t.Helper()
		return cliRun(t, append([]string{"--db", c.db}, args...), mytool...)
	}
	o := run("runs")
	if want := "no runs yet; start one with `mytool run JOB -p NAME=VALUE`"; !strings.Contains(o.stdout, want) {
		t.Errorf("runs on an empty database: want %q\n%s", want, o)
	}
	if o = run(crashyArgs(c.db, "k", c.side)[2:]...); o.code != ExitOK {
		t.Fatalf("run: exit %d\n%s", o.code, o)
	}
	o = run("reset", "crashy/k", "--step", "step/2", "--reason", "test")
	if want := "it runs again on `mytool resume crashy/k`"; o.code != ExitOK || !strings.Contains(o.stdout, want) {
		t.Errorf("reset: want exit 0 and %q\n%s", want, o)
	}
	o = run("run", "crashy", "--lease", "0s")
	if !strings.HasPrefix(o.stderr, "mytool: --lease: ") || !strings.Contains(o.stderr, "run `mytool run --help` for usage") {
		t.Errorf("a usage error does not use the program's name\n%s", o)
	}
	o = run("run", "--help")
	if !strings.HasPrefix(o.stdout, "Usage: mytool run <job>") || !strings.Contains(o.stdout, "(see 'mytool jobs')") || strings.Contains(o.stdout, "'stepwise") {
		t.Errorf("run --help does not use the program's name\n%s", o)
	}
	o = run("runs", "--job", "nosuch")
	if !strings.Contains(o.stderr, "`mytool jobs` lists the jobs") {
		t.Errorf("runs --job nosuch does not use the program's name\n%s", o)
	}
	// An interrupted run's hint (the runner's result, as report gets it).
	var out bytes.Buffer
	report(&Env{Stdout: &out, Name: "mytool"}, runner.Result{RunID: "crashy/k", Status: "interrupted", Attempt: 2}, runner.ErrInterrupted)
	if want := "resume it with: mytool resume crashy/k\n"; !strings.HasSuffix(out.String(), want) {
		t.Errorf("report of an interrupted run = %q, want it to end %q", out.String(), want)
	}
	// The last Name wins, and Execute without one says stepwise.
	if o := cliRun(t, []string{"run", "--help"}, Name("first"), Name("second")); !strings.HasPrefix(o.stdout, "Usage: second run") {
		t.Errorf("with Name(first), Name(second): %q", o.stdout)
	}
}

func TestArgv0Name(t *testing.T) {
	t.Parallel()
	for arg0, want := range map[string]string{
		"/usr/local/bin/mytool": "mytool", "./mytool": "mytool", "mytool": "mytool", "mytool.exe": "mytool",
		"": "stepwise", "/": "stepwise",
	} {
		if got := argv0Name(arg0); got != want {
			t.Errorf("argv0Name(%q) = %q, want %q", arg0, got, want)
		}
	}
}

// namedChildEnv makes the test binary act as a program built on cmd.Main
// with no Name option, so that it names itself after its os.Args[0].
const namedChildEnv = "STEPWISE_TEST_NAMED_CHILD"

func init() {
	if os.Getenv(namedChildEnv) != "1" {
		return
	}
	os.Args = append([]string{os.Args[0]}, crashtest.ChildArgs()...)
	Main(testRegistry())
}

func TestMainNamesItselfAfterArgv0(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	createDB(t, db) // runs only reads: the database must exist
	c, got := crashtest.Run(t, crashtest.Spec{Args: []string{"--db", db, "runs"}, Env: []string{namedChildEnv + "=1"},
		Argv0: "/opt/bin/mytool"}) // what the shell passes as argv[0]
	c.WantExit(got, crashtest.Code(0))
	if want := "start one with `mytool run JOB"; !strings.Contains(c.Stdout(), want) {
		t.Errorf("a program run as mytool printed %q, want %q", c.Stdout(), want)
	}
}

// decodeOne decodes stdout as exactly one JSON document into v.
func decodeOne(t *testing.T, o opsOut, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(o.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("stdout is not the JSON expected: %v\n%s", err, o)
	}
	if dec.More() {
		t.Fatalf("stdout holds more than one JSON document\n%s", o)
	}
}

func TestJobsJSONAndAligned(t *testing.T) {
	t.Parallel()
	o := cliRun(t, []string{"jobs", "--json"})
	var got []struct {
		Name   string `json:"name"`
		Help   string `json:"help"`
		Params []struct {
			Name     string `json:"name"`
			Type     string `json:"type"`
			Format   string `json:"format"`
			Key      bool   `json:"key"`
			Required bool   `json:"required"`
			Default  string `json:"default"`
			Help     string `json:"help"`
		} `json:"params"`
	}
	decodeOne(t, o, &got)
	var names []string
	for _, j := range got {
		names = append(names, j.Name)
	}
	if !slices.Equal(names, []string{"crashy", "opsbatch", "opsdaily", "opsledger", "opsreject", "opsstop"}) {
		t.Fatalf("jobs --json names %v", names)
	}
	daily := got[2]
	if daily.Help != "test job: one step per business date" || len(daily.Params) != 4 {
		t.Fatalf("opsdaily = %+v", daily)
	}
	if p := daily.Params[0]; p.Name != "date" || p.Type != "string" || p.Format != "date" || !p.Key || !p.Required {
		t.Errorf("opsdaily's date param = %+v; want a required string key of format date", p)
	}
	if p := daily.Params[3]; p.Name != "hold" || p.Type != "int" || p.Default != "0" || p.Key || p.Required {
		t.Errorf("opsdaily's hold param = %+v; want an optional int defaulting to 0", p)
	}

	// The text: every description starts in one column.
	text := cliRun(t, []string{"jobs"}).stdout
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	col := -1
	n := 0
	for _, j := range got {
		descs := []string{j.Help}
		for _, p := range j.Params {
			descs = append(descs, p.Help)
		}
		for _, d := range descs {
			if n >= len(lines) {
				t.Fatalf("jobs printed %d lines, fewer than its jobs and params:\n%s", len(lines), text)
			}
			i := strings.Index(lines[n], d)
			if col < 0 {
				col = i
			}
			if i < 0 || i != col {
				t.Errorf("line %d %q: description at column %d, want %d:\n%s", n+1, lines[n], i, col, text)
			}
			n++
		}
	}
	if !strings.Contains(text, "  -p date=DATE ") {
		t.Errorf("a date parameter's value is not shown as DATE:\n%s", text)
	}
}

func TestRunsUnknownJob(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	o := c.exec("runs", "--job", "nosuch")
	if o.code != ExitUsage || o.stdout != "" {
		t.Fatalf("runs --job nosuch: exit %d, want 2 and nothing on stdout\n%s", o.code, o)
	}
	for _, want := range []string{`--job "nosuch": no such job`, "crashy, opsbatch, opsdaily, opsledger", c.db + " has no runs of it"} {
		if !strings.Contains(o.stderr, want) {
			t.Errorf("runs --job nosuch does not say %q\n%s", want, o)
		}
	}
	// A job this program no longer registers, whose runs are recorded, is
	// listed with a note (here: opsledger, absent from testRegistry).
	c.want(ExitOK, nil, "run", "opsledger", "-p", "key=a", "-p", "side="+c.side)
	var out, errb bytes.Buffer
	code := Execute(context.Background(), testRegistry(), []string{"--db", c.db, "runs", "--job", "opsledger", "--status", "succeeded"}, &out, &errb)
	if code != ExitOK || !strings.Contains(out.String(), "opsledger/a") || !strings.Contains(errb.String(), `job "opsledger" is not registered`) {
		t.Errorf("runs --job of a retired job: exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	code = Execute(context.Background(), testRegistry(), []string{"--db", c.db, "runs", "--job", "opsledger", "--status", "failed"}, &out, &errb)
	if code != ExitOK {
		t.Errorf("runs --job of a retired job, filtered to none: exit %d, want 0 (its runs exist)\n%s", code, errb.String())
	}
}

func TestRunsSaysWhichRunsThereAreNoneOf(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	c.want(ExitOK, nil, "run", "opsledger", "-p", "key=a", "-p", "side="+c.side)
	for args, want := range map[string]string{
		"--status failed":                    "no failed runs; `stepwise runs` lists every run",
		"--job crashy":                       "no runs of job crashy; `stepwise runs` lists every run",
		"--job opsledger --status abandoned": "no abandoned runs of job opsledger;",
	} {
		o := c.exec(append([]string{"runs"}, strings.Fields(args)...)...)
		if o.code != ExitOK || !strings.Contains(o.stdout, want) || strings.Contains(o.stdout, "yet") {
			t.Errorf("runs %s on a store with one succeeded run: exit %d, want 0 and %q\n%s", args, o.code, want, o)
		}
	}
}

// runJSON is the JSON of run, resume and each backfill date's result.
type runJSON struct {
	RunID        string `json:"run_id"`
	Status       string `json:"status"`
	Attempt      int    `json:"attempt"`
	Executed     int    `json:"executed"`
	Skipped      int    `json:"skipped"`
	Failed       int    `json:"failed"`
	Effects      int    `json:"effects"`
	Conflicts    int    `json:"conflicts"`
	Replans      int    `json:"replans"`
	TookOverFrom string `json:"took_over_from"`
	ExitCode     int    `json:"exit_code"`
	Error        string `json:"error"`
	Note         string `json:"note"`
	Resume       string `json:"resume"`
}

func TestRunJSON(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	args := []string{"run", "opsledger", "-p", "key=a", "-p", "side=" + c.side, "--json"}

	// The dry run: the full plan, nothing applied.
	o := c.want(ExitOK, nil, append(slices.Clone(args), "--dry-run")...)
	var dry struct {
		RunID  string `json:"run_id"`
		DryRun bool   `json:"dry_run"`
		Plans  []struct {
			Step   string `json:"step"`
			Target string `json:"target"`
			Writes []struct {
				Key        string `json:"key"`
				OldVersion int64  `json:"old_version"`
				OldValue   int64  `json:"old_value"`
				NewValue   int64  `json:"new_value"`
				Insert     bool   `json:"insert"`
			} `json:"writes"`
			Rejected []string `json:"rejected"`
			Items    int      `json:"items"`
		} `json:"plans"`
		WouldRun     int    `json:"would_run"`
		Checkpointed int    `json:"checkpointed"`
		Error        string `json:"error"`
	}
	decodeOne(t, o, &dry)
	if dry.RunID != "opsledger/a" || !dry.DryRun || dry.WouldRun != 3 || dry.Checkpointed != 0 || len(dry.Plans) != 1 {
		t.Fatalf("dry run JSON = %+v", dry)
	}
	if p := dry.Plans[0]; p.Step != "credit" || len(p.Writes) != 1 || p.Writes[0].Key != "acct:a" ||
		p.Writes[0].OldValue != 0 || p.Writes[0].NewValue != opsLedgerCredit {
		t.Errorf("dry run plan = %+v; want credit adding %d to acct:a", p, opsLedgerCredit)
	}
	if runs := c.exec("runs", "--json"); runs.stdout != "[]\n" {
		t.Errorf("the dry run left a run: %s", runs.stdout)
	}

	var res runJSON
	decodeOne(t, c.want(ExitOK, nil, args...), &res)
	if want := (runJSON{RunID: "opsledger/a", Status: "succeeded", Attempt: 1, Executed: 3, Effects: 1}); res != want {
		t.Errorf("run --json = %+v, want %+v", res, want)
	}
	// Already succeeded: still one JSON document, the note in it, exit 0.
	res = runJSON{}
	decodeOne(t, c.want(ExitOK, nil, args...), &res)
	if res.RunID != "opsledger/a" || res.Status != "succeeded" || res.ExitCode != 0 || !strings.Contains(res.Note, "already succeeded") {
		t.Errorf("run --json of a succeeded run = %+v", res)
	}
	res = runJSON{}
	decodeOne(t, c.want(ExitOK, nil, "resume", "opsledger/a", "--force", "--json"), &res)
	if res.RunID != "opsledger/a" || res.Status != "succeeded" || res.Attempt != 2 || res.Skipped != 3 || res.Executed != 0 {
		t.Errorf("resume --force --json = %+v; want attempt 2 skipping all 3 steps", res)
	}

	// A failed run: the JSON on stdout says why, the error on stderr, exit 1.
	bad := filepath.Join(t.TempDir(), "missing", "side")
	o = c.exec("run", "crashy", "-p", "key=f", "-p", "side="+bad, "--json")
	res = runJSON{}
	decodeOne(t, o, &res)
	if o.code != ExitFailed || res.Status != "failed" || res.ExitCode != ExitFailed || res.Error == "" || !strings.Contains(o.stderr, "stepwise: ") {
		t.Errorf("a failing run --json: exit %d, %+v\n%s", o.code, res, o)
	}
	// Refused before a run exists: no JSON, the usual usage error.
	if o = c.exec("run", "nosuch", "--json"); o.code != ExitUsage || o.stdout != "" {
		t.Errorf("run nosuch --json: exit %d\n%s", o.code, o)
	}
}

func TestBackfillJSON(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	fail := t.TempDir()
	if err := os.WriteFile(filepath.Join(fail, "2026-01-02"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"backfill", "opsdaily", "--from", "2026-01-01", "--to", "2026-01-03", "-p", "side=" + c.side, "-p", "fail=" + fail, "--json"}
	type dateJSON struct {
		Date     string   `json:"date"`
		RunID    string   `json:"run_id"`
		Existing string   `json:"existing"`
		Action   string   `json:"action"`
		Reason   string   `json:"reason"`
		Result   *runJSON `json:"result"`
	}
	type backfillJSON struct {
		Job       string     `json:"job"`
		From      string     `json:"from"`
		To        string     `json:"to"`
		Reprocess string     `json:"reprocess"`
		DryRun    bool       `json:"dry_run"`
		Dates     []dateJSON `json:"dates"`
	}
	var dry backfillJSON
	decodeOne(t, c.want(ExitOK, nil, append(slices.Clone(args), "--dry-run")...), &dry)
	if dry.Job != "opsdaily" || !dry.DryRun || len(dry.Dates) != 3 || dry.Dates[1] != (dateJSON{Date: "2026-01-02", RunID: "opsdaily/2026-01-02", Action: "start"}) {
		t.Fatalf("backfill --dry-run --json = %+v", dry)
	}

	o := c.exec(args...)
	var got backfillJSON
	decodeOne(t, o, &got)
	if o.code != ExitFailed || !strings.Contains(o.stderr, "1 of 3 runs did not succeed") {
		t.Errorf("backfill with a failing date: exit %d\n%s", o.code, o)
	}
	for i, want := range []string{"succeeded", "failed", "succeeded"} {
		d := got.Dates[i]
		if d.Action != "start" || d.Result == nil || d.Result.Status != want || d.Result.RunID != d.RunID {
			t.Errorf("date %d = %+v, result %+v; want started and %s", i, d, d.Result, want)
		}
	}
	if r := got.Dates[1].Result; r == nil || !strings.Contains(r.Error, "no data for 2026-01-02") || r.ExitCode != ExitFailed {
		t.Errorf("the failed date's result = %+v; want its error and exit code 1", r)
	}

	// Again: the succeeded dates are skipped, the failed one is not resumed
	// under --reprocess none, and says how.
	got = backfillJSON{}
	decodeOne(t, c.want(ExitOK, nil, args...), &got)
	want := []dateJSON{
		{Date: "2026-01-01", RunID: "opsdaily/2026-01-01", Existing: "succeeded", Action: "skip", Reason: "succeeded"},
		{Date: "2026-01-02", RunID: "opsdaily/2026-01-02", Existing: "failed", Action: "skip", Reason: "failed; --reprocess failed resumes it"},
		{Date: "2026-01-03", RunID: "opsdaily/2026-01-03", Existing: "succeeded", Action: "skip", Reason: "succeeded"},
	}
	if !slices.Equal(got.Dates, want) {
		t.Errorf("backfill again = %+v, want %+v", got.Dates, want)
	}
}

func TestPruneJSON(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	c.runCrashy("a")
	type pruneJSON struct {
		DryRun    bool     `json:"dry_run"`
		OlderThan string   `json:"older_than"`
		Cutoff    string   `json:"cutoff"`
		Runs      []string `json:"runs"`
		Steps     int64    `json:"steps"`
		Items     int64    `json:"items"`
		Bytes     int64    `json:"bytes"`
		Keys      int64    `json:"idempotency_keys"`
	}
	c.idempotencyKey("k-1", "crashy/a")
	var got pruneJSON
	decodeOne(t, c.want(ExitOK, nil, "prune", "--older-than", "0s", "--dry-run", "--json"), &got)
	if !got.DryRun || got.OlderThan != "0s" || got.Cutoff == "" || !slices.Equal(got.Runs, []string{"crashy/a"}) || got.Steps != 3 || got.Bytes <= 0 || got.Keys != 1 {
		t.Errorf("prune --dry-run --json = %+v; want crashy/a, its 3 steps, some bytes and its 1 idempotency key", got)
	}
	got = pruneJSON{}
	decodeOne(t, c.want(ExitOK, nil, "prune", "--older-than", "0s", "--json"), &got)
	if got.DryRun || !slices.Equal(got.Runs, []string{"crashy/a"}) || got.Steps != 3 || got.Keys != 1 {
		t.Errorf("prune --json = %+v; want crashy/a, its 3 steps and its 1 idempotency key", got)
	}
	got = pruneJSON{}
	decodeOne(t, c.want(ExitOK, nil, "prune", "--older-than", "0s", "--json"), &got)
	if got.Runs == nil || len(got.Runs) != 0 || got.Steps != 0 || got.Keys != 0 {
		t.Errorf("prune --json with nothing to prune = %+v; want an empty runs list", got)
	}
}

func TestDispatchJSON(t *testing.T) {
	t.Parallel()
	db, _ := testFiles(t)
	run := testRegistryCLI(t, db)
	if o := run("run", "outbox", "-p", "key=k"); o.code != ExitOK {
		t.Fatalf("run outbox: exit %d\n%s", o.code, o)
	}
	to := "file:" + filepath.Join(t.TempDir(), "delivered.jsonl")
	for _, want := range []string{`{"sent":1,"failed":0}` + "\n", `{"sent":0,"failed":0}` + "\n"} {
		o := run("dispatch", "--to", to, "--json")
		if o.code != ExitOK || o.stdout != want {
			t.Errorf("dispatch --json: exit %d, stdout %q, want %q\n%s", o.code, o.stdout, want, o)
		}
		if strings.Contains(o.stderr, "dispatched:") {
			t.Errorf("dispatch --json still printed its text result\n%s", o)
		}
	}
	o := run("dispatch", "--to", "stdout", "--json")
	if o.code != ExitUsage || !strings.Contains(o.stderr, "--to stdout") || o.stdout != "" {
		t.Errorf("dispatch --to stdout --json: exit %d, want 2 naming the clash\n%s", o.code, o)
	}
}

func TestJobsNoneRegistered(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	if code := Execute(context.Background(), &jobs.Registry{}, []string{"jobs", "--json"}, &out, &errb); code != ExitOK || out.String() != "[]\n" {
		t.Errorf("jobs --json with none: exit %d, %q", code, out.String())
	}
}

// run and enqueue take --params-file the same way: a file's parameters
// name the run as -p would, and a file that cannot be read is exit 2
// naming the flag, with nothing recorded.
func TestParamsFileOnRunAndEnqueue(t *testing.T) {
	t.Parallel()
	c := newOpsCLI(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "params.json")
	if err := os.WriteFile(good, []byte(`{"key":"fromfile","side":"`+c.side+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.json")
	for _, cmd := range []string{"run", "enqueue"} {
		o := c.want(ExitUsage, []string{"--params-file", "missing.json"}, cmd, "opsledger", "--params-file", missing)
		if o.stdout != "" {
			t.Errorf("%s with a missing params file printed %q on stdout; want nothing", cmd, o.stdout)
		}
	}
	c.want(ExitOK, nil, "run", "opsledger", "--params-file", good)
	o := c.want(ExitOK, nil, "enqueue", "opsledger", "--params-file", good, "--json")
	var v struct {
		RunID    string `json:"run_id"`
		Created  bool   `json:"created"`
		Status   string `json:"status"`
		Priority int    `json:"priority"`
	}
	decodeOne(t, o, &v)
	if v.RunID != "opsledger/fromfile" || v.Created || v.Status != "succeeded" {
		t.Errorf("enqueue of the file's run key answered %+v; want opsledger/fromfile, existing (run made it)", v)
	}
}
