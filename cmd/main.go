package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/rs/zerolog"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// GraceEnv names the environment variable holding how long, after SIGINT
// or SIGTERM, the current step or chunk may take to finish before the
// process exits anyway (a Go duration; default 30s).
const GraceEnv = "STEPWISE_GRACE"

// Main runs the stepwise command line with the jobs in reg and exits with
// its exit code. SIGINT or SIGTERM stops the run from starting new steps;
// the current step or chunk finishes (or rolls back) within the grace
// period, the attempt is recorded as interrupted, and the process exits 3.
// A second signal, or the end of the grace period, ends the process at
// once, which is still safe: nothing is ever half-written.
//
// The program calls itself by the base name of os.Args[0] in usage, errors
// and hints (`mytool resume RUN_ID`), unless an option names it (Name).
func Main(reg *jobs.Registry, opts ...Option) {
	opts = append([]Option{Name(argv0Name(os.Args[0]))}, opts...)
	name := programName(opts)
	grace := 30 * time.Second
	if v := os.Getenv(GraceEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			fmt.Fprintf(os.Stderr, "%s: %s=%q is not a positive duration such as 30s\n", name, GraceEnv, v)
			os.Exit(ExitUsage)
		}
		grace = d
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		s := <-sigs
		cancel(fmt.Errorf("%v signal received", s))
		select {
		case s = <-sigs: // a second signal: die of it, as without a handler
			signal.Reset(os.Interrupt, syscall.SIGTERM)
			syscall.Kill(os.Getpid(), s.(syscall.Signal))
		case <-time.After(grace):
			fmt.Fprintf(os.Stderr, "%s: the current step did not finish within the %s grace period; exiting (resumable)\n", name, grace)
			os.Exit(ExitInterrupted)
		}
	}()
	code := Execute(ctx, reg, os.Args[1:], os.Stdout, os.Stderr, opts...)
	signal.Stop(sigs)
	os.Exit(code)
}

// Option adds to the command line.
type Option func(*[]kong.Option)

// Command adds a program's own command (a kong command struct whose Run
// method takes *Env) beside the stock ones, e.g. the example ledger's
// `ledger seed` and `ledger check`.
func Command(name, help string, c any) Option {
	return func(o *[]kong.Option) { *o = append(*o, kong.DynamicCommand(name, help, "", c)) }
}

// defaultName is what Execute calls the program when no Name option is
// given.
const defaultName = "stepwise"

// Name sets the program's name as usage, errors and hints print it
// (`mytool resume RUN_ID`). Main defaults it to the base name of
// os.Args[0], Execute to "stepwise"; the last Name option wins. Help texts
// may say ${name} for it.
func Name(name string) Option {
	return func(o *[]kong.Option) { *o = append(*o, nameOption(name)) }
}

// nameOption carries Name through the kong options; Execute reads it back
// before building the parser, and it sets kong's name as well.
type nameOption string

func (n nameOption) Apply(k *kong.Kong) error { return kong.Name(string(n)).Apply(k) }

// programName is the name the options give the program: the last Name.
func programName(opts []Option) string {
	var kopts []kong.Option
	for _, o := range opts {
		o(&kopts)
	}
	return nameIn(kopts)
}

func nameIn(kopts []kong.Option) string {
	name := defaultName
	for _, o := range kopts {
		if n, ok := o.(nameOption); ok && n != "" {
			name = string(n)
		}
	}
	return name
}

// argv0Name is the program name os.Args[0] gives: its base name, without a
// Windows .exe suffix; "stepwise" if that leaves nothing.
func argv0Name(arg0 string) string {
	n := strings.TrimSuffix(filepath.Base(arg0), ".exe")
	if n == "" || n == "." || n == string(filepath.Separator) {
		return defaultName
	}
	return n
}

// exitRequest carries kong's request to exit (after --help) out of parsing.
type exitRequest struct{ code int }

// Execute runs the command line args (without the program name) and returns
// the exit code. Tests and embedding programs call it directly. It calls
// the program "stepwise" unless a Name option says otherwise.
func Execute(ctx context.Context, reg *jobs.Registry, args []string, stdout, stderr io.Writer, opts ...Option) (code int) {
	var cli CLI
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(exitRequest); ok {
				code = e.code
				return
			}
			panic(r)
		}
	}()
	var own []kong.Option
	for _, o := range opts {
		o(&own)
	}
	name := nameIn(own)
	kopts := append([]kong.Option{
		kong.Name(name),
		kong.Description("Stepwise runs batch jobs in resumable, checkpointed steps: rerun a crashed or failed run " +
			"from the top and every completed step is skipped, every effect applied once.\n\n" + exitCodesHelp + "\n\n" + tracingHelp),
		kong.Writers(stdout, stderr),
		kong.Exit(func(c int) { panic(exitRequest{c}) }),
		kong.Vars{"name": name, "version": versionText(name, readBuildInfo())},
	}, cliConventions()...)
	kopts = append(kopts, own...)
	kopts = append(kopts, scheduling(own)...)
	parser, err := kong.New(&cli, kopts...)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return ExitUsage
	}
	groupGlobals(parser)
	completing(parser)
	if len(args) == 0 {
		fmt.Fprint(stderr, shortUsage(name, parser))
		return ExitUsage
	}
	if err := checkArgs(parser.Model.Node, args); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return ExitUsage
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		var pe *kong.ParseError
		if errors.As(err, &pe) {
			fmt.Fprintf(stderr, "run `%s --help` for usage\n", helpPath(name, pe.Context))
		}
		return ExitUsage
	}
	// Backfill runs jobs in parallel, all logging to stderr: a writer other
	// than a file (whose every write is one system call) gets a lock.
	if _, ok := stderr.(*os.File); !ok {
		stderr = &lockedWriter{w: stderr}
	}
	env := &Env{Ctx: ctx, Registry: reg, Stdout: stdout, Stderr: stderr, Globals: &cli.Globals, Name: name, parser: parser}
	defer env.close()
	if err := kctx.Run(env); err != nil {
		code := ExitCode(err)
		wait := waitFlagOf(kctx)
		var told reported
		if errors.As(err, &told) {
			return code // the command's output already said it
		}
		if code != ExitOK {
			fmt.Fprintf(stderr, "%s: %s\n", name, errorText(err, name))
			if h := hint(err, name, wait); h != "" {
				fmt.Fprintf(stderr, "%s: %s\n", name, h)
			}
		} else {
			fmt.Fprintln(stdout, err)
			if h := hint(err, name, wait); h != "" {
				fmt.Fprintln(stdout, h)
			}
		}
		return code
	}
	return ExitOK
}

// waitFlagOf says whether the selected command takes --wait and whether
// it was given.
func waitFlagOf(kctx *kong.Context) waitFlag {
	n := kctx.Selected()
	if n == nil {
		return noWaitFlag
	}
	for _, f := range n.Flags {
		if f.Name != "wait" {
			continue
		}
		if on, _ := kctx.FlagValue(f).(bool); on {
			return waitGiven
		}
		return waitNotGiven
	}
	return noWaitFlag
}

// lockedWriter makes a writer safe for concurrent use.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Env is what every command's Run method receives.
type Env struct {
	Ctx      context.Context
	Registry *jobs.Registry
	Stdout   io.Writer
	Stderr   io.Writer
	Globals  *Globals
	// Name is the program's name as the user invokes it (see Name), for
	// the commands it prints in hints: "resume it with: NAME resume ID".
	Name string
	// Now is the clock of manual operations and listings. Defaults to
	// time.Now.
	Now    func() time.Time
	store  checkpoint.Backend
	parser *kong.Kong
	// tracer is the OTLP tracer provider once tracing set it up (nil when
	// the environment asks for none); traceInit says it was tried.
	tracer    *sdktrace.TracerProvider
	traceInit bool
	// maxConns, if set, is the PostgreSQL store's pool size (a worker
	// driving many runs at once needs more than the default).
	maxConns int32
	// ownTargetCredentials opens target databases with their own URL's
	// password only (stores.Settings.OwnTargetCredentials): serve and
	// worker.
	ownTargetCredentials bool
	// lease, if set, is the command's --lease: a PostgreSQL store's
	// session timeouts follow it.
	lease time.Duration
}

func (e *Env) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// Store opens the checkpoint database named by --db (once per command),
// creating it if it is missing.
func (e *Env) Store() (checkpoint.Backend, error) { return e.openStore(false) }

// ExistingStore is Store for commands that only read (listings, dry runs,
// resuming a recorded run): a missing database is not created but is a
// usage error naming its absolute path.
func (e *Env) ExistingStore() (checkpoint.Backend, error) { return e.openStore(true) }

// ReadStore is ExistingStore for commands that only read (runs, show,
// schedules, dry runs): a database whose schema is older than this
// binary's is refused, not migrated, so a look changes nothing.
func (e *Env) ReadStore() (checkpoint.Backend, error) { return e.openStoreFor(true, true) }

func (e *Env) openStore(mustExist bool) (checkpoint.Backend, error) {
	return e.openStoreFor(mustExist, false)
}

func (e *Env) openStoreFor(mustExist, noMigrate bool) (checkpoint.Backend, error) {
	if e.store != nil {
		return e.store, nil
	}
	st, err := openBackend(e, mustExist, noMigrate)
	if err != nil {
		return nil, err
	}
	e.store = st
	return st, nil
}

// DaemonStore is Store for the long-running commands (serve, worker): a
// store that does not answer yet (its server starting up, shutting down or
// restarting: checkpoint.ErrTransient) is tried again, with a backoff up to
// 10s, until it answers or the command is stopped, so a pool whose
// processes start while the server is down comes up by itself. Any other
// error (a bad URL, a refused password, a missing database) is returned at
// once.
func (e *Env) DaemonStore() (checkpoint.Backend, error) {
	delay := 250 * time.Millisecond
	for {
		st, err := e.Store()
		if err == nil || !errors.Is(err, checkpoint.ErrTransient) {
			return st, err
		}
		log := e.Logger()
		log.Warn().Err(err).Float64("retry_in_seconds", delay.Seconds()).Msg("the checkpoint store does not answer yet; trying again")
		select {
		case <-e.Ctx.Done():
			return nil, err
		case <-time.After(delay):
		}
		delay = min(2*delay, 10*time.Second)
	}
}

// Logger returns the logger the global flags ask for, writing to stderr.
func (e *Env) Logger() zerolog.Logger { return e.Globals.logger(e.Stderr) }

// RunOption changes how Env.RunJob runs a job.
type RunOption func(*runFlags)

// AfterEachChunk has Env.RunJob call fn after each chunk a batch step of
// the run commits, with the step's progress, before the next chunk
// starts (and once more at the step's end, Final set). fn runs on the
// step's goroutine, so a slow fn slows the step: the stock demo's --pace
// waits there. A partitioned step's chunks are not reported to it one by
// one (their sum is, every half second).
func AfterEachChunk(fn func(steps.Progress)) RunOption {
	return func(f *runFlags) { f.afterChunk = fn }
}

// RunJob runs a job as the run command does (progress display, the
// one-line outcome on stdout) and returns its result.
func (e *Env) RunJob(req runner.Request, lease time.Duration, opts ...RunOption) (runner.Result, error) {
	f := runFlags{Lease: lease, Progress: "auto", Force: req.Force, RetrySkipped: req.RetrySkipped}
	for _, o := range opts {
		o(&f)
	}
	r, prog, err := f.runner(e)
	if err != nil {
		return runner.Result{}, err
	}
	res, err := r.Run(e.Ctx, req)
	prog.close()
	return res, report(e, res, err)
}

func (e *Env) close() {
	e.closeTracing()
	if e.store != nil {
		e.store.Close()
	}
}
