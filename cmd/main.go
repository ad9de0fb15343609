package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kong"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
)

// Main runs the stepwise command line with the jobs in reg and exits with
// its exit code. SIGINT or SIGTERM interrupts the run resumably (exit 3); a
// second signal ends the process at once, which is still safe.
func Main(reg *jobs.Registry) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // restore default handling: a second signal ends the process
	}()
	code := Execute(ctx, reg, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// exitRequest carries kong's request to exit (after --help) out of parsing.
type exitRequest struct{ code int }

// Execute runs the command line args (without the program name) and returns
// the exit code. Tests and embedding programs call it directly.
func Execute(ctx context.Context, reg *jobs.Registry, args []string, stdout, stderr io.Writer) (code int) {
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
	parser, err := kong.New(&cli,
		kong.Name("stepwise"),
		kong.Description("Stepwise runs batch jobs in resumable, checkpointed steps: rerun a crashed or failed run "+
			"from the top and every completed step is skipped, every effect applied once.\n\n"+exitCodesHelp),
		kong.Writers(stdout, stderr),
		kong.Exit(func(c int) { panic(exitRequest{c}) }),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
	)
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
	env := &Env{Ctx: ctx, Registry: reg, Stdout: stdout, Stderr: stderr, Globals: &cli.Globals}
	defer env.close()
	if err := kctx.Run(env); err != nil {
		code := ExitCode(err)
		if code != ExitOK {
			fmt.Fprintf(stderr, "stepwise: %v\n", err)
		} else {
			fmt.Fprintln(stdout, err)
		}
		return code
	}
	return ExitOK
}

// Env is what every command's Run method receives.
type Env struct {
	Ctx      context.Context
	Registry *jobs.Registry
	Stdout   io.Writer
	Stderr   io.Writer
	Globals  *Globals
	store    *checkpoint.SQLite
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

func (e *Env) close() {
	if e.store != nil {
		e.store.Close()
	}
}
