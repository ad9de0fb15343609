package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
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
func Main(reg *jobs.Registry, opts ...Option) {
	grace := 30 * time.Second
	if v := os.Getenv(GraceEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			fmt.Fprintf(os.Stderr, "stepwise: %s=%q is not a positive duration such as 30s\n", GraceEnv, v)
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
			fmt.Fprintf(os.Stderr, "stepwise: the current step did not finish within the %s grace period; exiting (resumable)\n", grace)
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

// exitRequest carries kong's request to exit (after --help) out of parsing.
type exitRequest struct{ code int }

// Execute runs the command line args (without the program name) and returns
// the exit code. Tests and embedding programs call it directly.
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
	kopts := []kong.Option{
		kong.Name("stepwise"),
		kong.Description("Stepwise runs batch jobs in resumable, checkpointed steps: rerun a crashed or failed run " +
			"from the top and every completed step is skipped, every effect applied once.\n\n" + exitCodesHelp),
		kong.Writers(stdout, stderr),
		kong.Exit(func(c int) { panic(exitRequest{c}) }),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
	}
	for _, o := range opts {
		o(&kopts)
	}
	parser, err := kong.New(&cli, kopts...)
	if err != nil {
		fmt.Fprintf(stderr, "stepwise: %v\n", err)
		return ExitUsage
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		fmt.Fprintf(stderr, "stepwise: %v\n", err)
		var pe *kong.ParseError
		if errors.As(err, &pe) {
			fmt.Fprintln(stderr, "run `stepwise --help` for usage")
		}
		return ExitUsage
	}
	// Backfill runs jobs in parallel, all logging to stderr: a writer other
	// than a file (whose every write is one system call) gets a lock.
	if _, ok := stderr.(*os.File); !ok {
		stderr = &lockedWriter{w: stderr}
	}
	env := &Env{Ctx: ctx, Registry: reg, Stdout: stdout, Stderr: stderr, Globals: &cli.Globals}
	defer env.close()
	if err := kctx.Run(env); err != nil {
		code := ExitCode(err)
		if code != ExitOK {
			fmt.Fprintf(stderr, "stepwise: %s\n", errorText(err))
		} else {
			fmt.Fprintln(stdout, err)
		}
		return code
	}
	return ExitOK
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
	// Now is the clock of manual operations and listings. Defaults to
	// time.Now.
	Now   func() time.Time
	store *checkpoint.SQLite
}

func (e *Env) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// Store opens the checkpoint database named by --db (once per command).
func (e *Env) Store() (*checkpoint.SQLite, error) {
	if e.store != nil {
		return e.store, nil
	}
	st, err := checkpoint.Open(e.Ctx, checkpoint.Config{
		Path: e.Globals.DB, Synchronous: e.Globals.Synchronous, BusyTimeout: e.Globals.BusyTimeout,
	})
	if err != nil {
		return nil, err
	}
	e.store = st
	return st, nil
}

// Logger returns the logger the global flags ask for, writing to stderr.
func (e *Env) Logger() zerolog.Logger { return e.Globals.logger(e.Stderr) }

// RunJob runs a job as the run command does (progress display, the
// one-line outcome on stdout) and returns its result.
func (e *Env) RunJob(req runner.Request, lease time.Duration) (runner.Result, error) {
	f := runFlags{Lease: lease, Progress: "auto", Force: req.Force, RetrySkipped: req.RetrySkipped}
	r, prog, err := f.runner(e)
	if err != nil {
		return runner.Result{}, err
	}
	res, err := r.Run(e.Ctx, req)
	prog.close()
	report(e, res, err)
	return res, err
}

func (e *Env) close() {
	if e.store != nil {
		e.store.Close()
	}
}
