package cmd

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
)

// CLI is the stepwise command line, parsed by kong.
type CLI struct {
	Globals

	Jobs     JobsCmd     `cmd:"" help:"List the registered jobs and their parameters."`
	Run      RunCmd      `cmd:"" help:"Start a run of JOB, or resume it if its run key exists."`
	Resume   ResumeCmd   `cmd:"" help:"Resume a run by ID with its stored parameters."`
	Runs     RunsCmd     `cmd:"" help:"List runs, newest first; stale runs (dead runner, lease expired) are marked."`
	Show     ShowCmd     `cmd:"" help:"Show one run: its attempts and steps with status, timings and output."`
	Enqueue  EnqueueCmd  `cmd:"" group:"Workers" help:"Queue a run of JOB for a pool of workers; an existing run key is left as it is."`
	Worker   WorkerCmd   `cmd:"" group:"Workers" help:"Take queued runs (and runs whose worker died) and drive them, --concurrency at a time, until SIGTERM."`
	Dispatch DispatchCmd `cmd:"" help:"Deliver queued notifications (at least once, with stable keys), once or --every interval; several may run at once."`
	Outbox   OutboxCmd   `cmd:"" help:"List notifications: queued, sent or dead (failed --max-tries times), oldest first; 'outbox requeue' sends dead ones again."`

	Recover  RecoverCmd  `cmd:"" group:"Operating runs" help:"Mark a stale run (its runner died) failed, so it is resumable."`
	Rerun    RerunCmd    `cmd:"" group:"Operating runs" help:"Run a run again: from the top (--force for a succeeded run) or --from-step STEP."`
	Reset    ResetCmd    `cmd:"" group:"Operating runs" help:"Clear one step's checkpoint so it runs again (a changed step, exit 5)."`
	Abandon  AbandonCmd  `cmd:"" group:"Operating runs" help:"Give up on a run: run and resume refuse it unless --force."`
	Resolve  ResolveCmd  `cmd:"" group:"Operating runs" help:"Settle an outside call of unknown outcome (exit 5) as done or retry, or correct an unused resolution (--replace)."`
	Prune    PruneCmd    `cmd:"" group:"Operating runs" help:"Delete old finished runs' step payloads; their keys stay as tombstones."`
	Backfill BackfillCmd `cmd:"" group:"Operating runs" help:"Start one run per business date of a job whose key is a date."`

	Help       HelpCmd       `cmd:"" help:"Show a command's help: '${name} help run' is '${name} run --help'."`
	Version    VersionCmd    `cmd:"" help:"Print the program's version (module version, VCS revision), as --version does."`
	Completion CompletionCmd `cmd:"" help:"Print the shell code completing this program's commands and flags: eval \"$(${name} completion bash)\" (or zsh) in your shell's rc file."`
}

// VersionCmd prints the program's version.
type VersionCmd struct{}

// Run implements the version command.
func (VersionCmd) Run(env *Env) error {
	fmt.Fprintln(env.Stdout, versionText(env.Name, readBuildInfo()))
	return nil
}

// commonCommands are what the short usage of a bare invocation lists, in
// the order a newcomer meets them, each with its most common form.
var commonCommands = [][2]string{
	{"demo", "seed a demo ledger and settle a day on it"},
	{"jobs", "list the jobs and their parameters"},
	{"run JOB -p NAME=VALUE", "start a run, or resume it if its run key exists"},
	{"runs", "list runs, newest first (stale ones marked)"},
	{"show RUN_ID", "a run's attempts, steps and outputs"},
	{"resume RUN_ID", "resume a run with its stored parameters"},
	{"serve", "the scheduler, the dashboard and the API"},
	{"worker", "take queued runs for a pool"},
}

// shortUsage is what a bare invocation prints: the common commands that
// this program has, and where the rest is.
func shortUsage(name string, parser *kong.Kong) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: %s COMMAND [FLAGS]\n\nCommon commands:\n", name)
	have := map[string]bool{}
	for _, n := range parser.Model.Children {
		have[n.Name] = true
	}
	width := 0
	for _, c := range commonCommands {
		width = max(width, len(c[0]))
	}
	for _, c := range commonCommands {
		if cmd, _, _ := strings.Cut(c[0], " "); have[cmd] {
			fmt.Fprintf(&b, "  %s %-*s  %s\n", name, width, c[0], c[1])
		}
	}
	fmt.Fprintf(&b, "\nEvery command and flag: %s --help; one command's: %s help COMMAND.\n", name, name)
	return b.String()
}

// Globals are the flags every command takes.
type Globals struct {
	DB          string           `name:"db" env:"STEPWISE_DB" default:"stepwise.db" help:"Checkpoint database: a SQLite file (its directory must exist) or a postgres:// URL (the database must exist; Stepwise creates its tables; put the password in PGPASSWORD or ~/.pgpass, not in the URL)." type:"database"`
	Synchronous string           `env:"STEPWISE_SYNCHRONOUS" default:"full" enum:"full,normal" help:"SQLite durability: full (default) survives power loss after every step; normal is faster but a power loss can lose the last commits (a process crash cannot)."`
	BusyTimeout time.Duration    `env:"STEPWISE_BUSY_TIMEOUT" default:"5s" nonzero:"" help:"How long to wait for another process's write lock before failing (a positive duration)."`
	LogLevel    string           `env:"STEPWISE_LOG_LEVEL" default:"info" enum:"debug,info,warn,error" help:"Log level."`
	LogFormat   string           `env:"STEPWISE_LOG_FORMAT" default:"auto" enum:"auto,console,json" help:"Log format: console on a terminal and JSON otherwise (auto), or forced."`
	Version     kong.VersionFlag `help:"Print the program's version (module version, VCS revision) and exit."`
}

// HelpCmd prints a command's help, as the command's --help does.
type HelpCmd struct {
	Command []string `arg:"" optional:"" placeholder:"COMMAND" help:"The command, e.g. run or ledger seed; none for the program's help."`
}

// Run implements the help command: it parses the command line COMMAND
// --help, whose help hook prints the help and exits.
func (c *HelpCmd) Run(env *Env) error {
	_, err := env.parser.Parse(append(slices.Clone(c.Command), "--help"))
	if err != nil {
		return usageError{fmt.Errorf("help %s: %w; the commands are listed by `%s --help`", strings.Join(c.Command, " "), err, env.Name)}
	}
	return nil
}

// logger builds the logger the flags ask for, writing to w.
func (g *Globals) logger(w io.Writer) zerolog.Logger { return g.loggerThrough(w, w) }

// loggerThrough builds the logger the flags ask for, choosing the format by
// w (console on a terminal) and writing through via (a progress display
// that clears its bar before each line) to it.
func (g *Globals) loggerThrough(w, via io.Writer) zerolog.Logger {
	level, err := zerolog.ParseLevel(g.LogLevel)
	if err != nil {
		level = zerolog.InfoLevel
	}
	format := g.LogFormat
	if format == "auto" {
		format = "json"
		if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			format = "console"
		}
	}
	out := via
	if format == "console" {
		out = zerolog.ConsoleWriter{Out: via, TimeFormat: "15:04:05.000"}
	}
	return zerolog.New(out).Level(level).Hook(msTimestamp{})
}

// logTimeLayout is the time of every log line: RFC 3339 with milliseconds
// (zerolog's default has whole seconds, which the console showed as .000).
const logTimeLayout = "2006-01-02T15:04:05.000Z07:00"

// msTimestamp adds the line's time with millisecond resolution. A hook,
// not zerolog's global TimeFieldFormat, so a program embedding the CLI
// keeps its own zerolog settings; it runs where Timestamp's hook would, so
// the field order is the same.
type msTimestamp struct{}

func (msTimestamp) Run(e *zerolog.Event, _ zerolog.Level, _ string) {
	e.Str(zerolog.TimestampFieldName, time.Now().Format(logTimeLayout))
}
