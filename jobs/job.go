package jobs

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/steps"
)

// Job is a registered job as the runner and the CLI see it. Define builds
// one from a typed function.
type Job interface {
	// Name is the job's registered name, the first part of its run IDs.
	Name() string
	// Help is one line saying what the job does.
	Help() string
	// Params describes the job's parameters in declaration order.
	Params() []Param
	// Decode decodes and validates parameters from name=value pairs (which
	// win) and a JSON params file (may be nil).
	Decode(values map[string]string, file []byte) (Decoded, error)
	// Execute decodes canonical parameters, resolves their target
	// references ("target:NAME") from the Targets ctx carries
	// (WithTargets), and runs the job function. A name ctx's Targets do
	// not configure is an *UnknownTargetError, before the job runs.
	Execute(ctx context.Context, run *steps.Run, params []byte) error
	// Settings are the job's run-wide options.
	Settings() Settings
}

// Settings are a job's run-wide options, set with Option values.
type Settings struct {
	// Retry is the retry policy of the job's steps that set none.
	Retry steps.RetryPolicy
	// Deadline bounds a whole attempt; 0 means none. A run past its
	// deadline fails (resumable by a rerun).
	Deadline time.Duration
	// Limit is how many of the job's runs (LimitBy: sharing one key) may
	// run at once; 0 means no limit. Decoded.Limit is the limit of one
	// run.
	Limit int
}

// Option configures a job definition.
type Option func(*options)

type options struct {
	help     string
	settings Settings
	limitBy  any // func(P) string, checked by Define
}

// Help sets the one-line description shown by `stepwise jobs`.
func Help(text string) Option { return func(o *options) { o.help = text } }

// Retry sets the retry policy of the job's steps that set none.
func Retry(p steps.RetryPolicy) Option { return func(o *options) { o.settings.Retry = p } }

// Deadline bounds each attempt of the job's runs.
func Deadline(d time.Duration) Option { return func(o *options) { o.settings.Deadline = d } }

// Limit lets at most n runs of the job run at once, counted on every
// path that starts a run (run, resume, backfill, serve, worker) and on
// every host using the store: a run over it waits queued (worker), or is
// refused with a *checkpoint.LimitReachedError (run). Its key is
// "job:NAME".
func Limit(n int) Option {
	return func(o *options) { o.settings.Limit, o.limitBy = n, nil }
}

// LimitBy lets at most n runs of the job that share a key run at once, as
// Limit does for all of them: key names the resource a run uses from its
// parameters (a ledger, an account). Its type must be func(P) string for
// the job's parameter type P (Define panics otherwise); runs whose key is
// "" count against the job's key. The limit's key is "NAME:" + key(p).
func LimitBy[P any](n int, key func(P) string) Option {
	return func(o *options) { o.settings.Limit, o.limitBy = n, key }
}

// Definition is a job with parameters of type P. Create it with Define.
type Definition[P any] struct {
	name   string
	fn     func(context.Context, *steps.Run, P) error
	params []Param
	opts   options
	// limitKey is LimitBy's function, nil for Limit or no limit.
	limitKey func(P) string
}

var _ Job = (*Definition[struct{}])(nil)

// Define makes a job named name that runs fn with parameters of struct type
// P (see Param for the field tags). It panics on a malformed parameter type,
// like regexp.MustCompile: that is a programming error found at start-up.
func Define[P any](name string, fn func(ctx context.Context, run *steps.Run, p P) error, opts ...Option) *Definition[P] {
	if err := steps.ValidateID(name); err != nil || strings.Contains(name, "/") {
		panic(fmt.Sprintf("jobs: job name %q must be a single step-ID part (letters, digits, . _ - : @ = +)", name))
	}
	if fn == nil {
		panic(fmt.Sprintf("jobs: job %s has a nil function", name))
	}
	ps, err := paramsOf(reflect.TypeFor[P]())
	if err != nil {
		panic(fmt.Sprintf("jobs: job %s: %v", name, err))
	}
	d := &Definition[P]{name: name, fn: fn, params: ps}
	for _, o := range opts {
		o(&d.opts)
	}
	if err := d.opts.settings.Retry.Validate(); err != nil {
		panic(fmt.Sprintf("jobs: job %s: %v", name, err))
	}
	if d.opts.settings.Limit < 0 {
		panic(fmt.Sprintf("jobs: job %s: negative limit %d", name, d.opts.settings.Limit))
	}
	if d.opts.limitBy != nil {
		key, ok := d.opts.limitBy.(func(P) string)
		if !ok {
			panic(fmt.Sprintf("jobs: job %s: LimitBy's function is %T; it must take the job's parameters (func(%s) string)",
				name, d.opts.limitBy, reflect.TypeFor[P]()))
		}
		d.limitKey = key
	}
	if d.opts.settings.Deadline < 0 {
		panic(fmt.Sprintf("jobs: job %s: negative deadline %s", name, d.opts.settings.Deadline))
	}
	return d
}

// Settings implements Job.
func (d *Definition[P]) Settings() Settings { return d.opts.settings }

// Name implements Job.
func (d *Definition[P]) Name() string { return d.name }

// Help implements Job.
func (d *Definition[P]) Help() string { return d.opts.help }

// Params implements Job.
func (d *Definition[P]) Params() []Param { return slices.Clone(d.params) }

// Decode implements Job.
func (d *Definition[P]) Decode(values map[string]string, file []byte) (Decoded, error) {
	v, err := decodeParams(d.name, reflect.TypeFor[P](), d.params, values, file)
	if err != nil {
		return Decoded{}, err
	}
	return d.decoded(v.Interface().(P))
}

// Encode returns the canonical parameters for p, as Decode would.
func (d *Definition[P]) Encode(p P) (Decoded, error) {
	return d.decoded(p)
}

// decoded is the Decoded of validated parameters p, with their limit.
func (d *Definition[P]) decoded(p P) (Decoded, error) {
	dec, err := canonical(d.params, reflect.ValueOf(p))
	if err != nil {
		return Decoded{}, err
	}
	if n := d.opts.settings.Limit; n > 0 {
		dec.Limit = checkpoint.Limit{Key: "job:" + d.name, Max: n}
		if d.limitKey != nil {
			if k := d.limitKey(p); k != "" {
				dec.Limit.Key = d.name + ":" + k
			}
		}
	}
	return dec, nil
}

// Execute implements Job.
func (d *Definition[P]) Execute(ctx context.Context, run *steps.Run, params []byte) error {
	v, err := decodeParams(d.name, reflect.TypeFor[P](), d.params, nil, params)
	if err != nil {
		return err
	}
	res, err := resolveTargets(v, d.params, targetsFrom(ctx))
	if err != nil {
		return err
	}
	return res.wrap(d.fn(ctx, run, v.Interface().(P)))
}

// RunID returns the run ID for a run key: job name, "/", key.
func RunID(job, runKey string) string { return job + "/" + runKey }

// Registry holds the jobs a program can run. The zero value is empty and
// ready to use; it is safe for concurrent use.
type Registry struct {
	mu   sync.RWMutex
	jobs map[string]Job
}

// MustRegister adds jobs to the registry. It panics if a name is already
// registered, like sql.Register: two jobs with one name is a programming
// error.
func (r *Registry) MustRegister(jobs ...Job) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.jobs == nil {
		r.jobs = make(map[string]Job)
	}
	for _, j := range jobs {
		if _, dup := r.jobs[j.Name()]; dup {
			panic(fmt.Sprintf("jobs: job %q registered twice", j.Name()))
		}
		r.jobs[j.Name()] = j
	}
}

// Lookup returns the job named name, or an error listing the known jobs.
func (r *Registry) Lookup(name string) (Job, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if j, ok := r.jobs[name]; ok {
		return j, nil
	}
	names := make([]string, 0, len(r.jobs))
	for n := range r.jobs {
		names = append(names, n)
	}
	slices.Sort(names)
	return nil, fmt.Errorf("%w: %q (registered: %v)", ErrUnknownJob, name, names)
}

// Jobs returns the registered jobs sorted by name.
func (r *Registry) Jobs() []Job {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]Job, 0, len(r.jobs))
	for _, j := range r.jobs {
		out = append(out, j)
	}
	slices.SortFunc(out, func(a, b Job) int {
		if a.Name() < b.Name() {
			return -1
		}
		if a.Name() > b.Name() {
			return 1
		}
		return 0
	})
	return out
}
