package jobs

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

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
	// Execute decodes canonical parameters and runs the job function.
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
}

// Option configures a job definition.
type Option func(*options)

type options struct {
	help     string
	settings Settings
}

// Help sets the one-line description shown by `stepwise jobs`.
func Help(text string) Option { return func(o *options) { o.help = text } }

// Retry sets the retry policy of the job's steps that set none.
func Retry(p steps.RetryPolicy) Option { return func(o *options) { o.settings.Retry = p } }

// Deadline bounds each attempt of the job's runs.
func Deadline(d time.Duration) Option { return func(o *options) { o.settings.Deadline = d } }

// Definition is a job with parameters of type P. Create it with Define.
type Definition[P any] struct {
	name   string
	fn     func(context.Context, *steps.Run, P) error
	params []Param
	opts   options
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
	return canonical(d.params, v)
}

// Encode returns the canonical parameters for p, as Decode would.
func (d *Definition[P]) Encode(p P) (Decoded, error) {
	return canonical(d.params, reflect.ValueOf(p))
}

// Execute implements Job.
func (d *Definition[P]) Execute(ctx context.Context, run *steps.Run, params []byte) error {
	v, err := decodeParams(d.name, reflect.TypeFor[P](), d.params, nil, params)
	if err != nil {
		return err
	}
	return d.fn(ctx, run, v.Interface().(P))
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
