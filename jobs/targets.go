package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// TargetPrefix marks a resource parameter's value (format path,
// existingfile or database) as the name of a target the operator
// configured: "target:ledger". Parameters store the reference, never
// what it resolves to, so a run's stored and shown parameters hold no
// server path and no credentials; each process that executes the run
// resolves the name from its own Targets when the job function is
// called.
const TargetPrefix = "target:"

// ErrUnknownTarget is wrapped by every *UnknownTargetError.
var ErrUnknownTarget = errors.New("jobs: unknown target")

// UnknownTargetError is a target name that the Targets in use do not
// configure: refused when a request gives it (the API's 400) and when a
// process executes a run naming it (the run fails with this message).
type UnknownTargetError struct {
	// Param is the parameter that names the target.
	Param string
	// Name is the name given.
	Name string
	// Known are the configured names, sorted.
	Known []string
}

func (e *UnknownTargetError) Error() string {
	known := "none are configured"
	if len(e.Known) > 0 {
		known = "configured: " + strings.Join(e.Known, ", ")
	}
	return fmt.Sprintf("parameter %q names target %q, which this process does not configure (%s); "+
		"the operator adds it with --target %s=LOCATION or a line %s=LOCATION in the --targets file", e.Param, e.Name, known, e.Name, e.Name)
}

// Unwrap returns ErrUnknownTarget.
func (e *UnknownTargetError) Unwrap() error { return ErrUnknownTarget }

// Targets are the outside resources (databases, files) the operator of a
// process configured by name (serve and worker's --target and
// --targets): the only ones a request over the API may name, and what
// the "target:NAME" parameters of the runs this process executes resolve
// to. A nil *Targets configures none. It is immutable once built.
type Targets struct {
	loc map[string]string
}

// NewTargets builds Targets from names and locations: a postgres:// or
// postgresql:// URL naming a host and a database (it may hold the
// password: Targets never show it), or an absolute file path.
func NewTargets(m map[string]string) (*Targets, error) {
	t := &Targets{loc: make(map[string]string, len(m))}
	for name, loc := range m {
		if !ValidTargetName(name) {
			return nil, fmt.Errorf("target name %q: use lower-case letters, digits, - or _ (at most 63, starting with a letter or digit)", name)
		}
		if err := checkTargetLocation(loc); err != nil {
			return nil, fmt.Errorf("target %s: %w", name, err)
		}
		t.loc[name] = loc
	}
	return t, nil
}

func checkTargetLocation(loc string) error {
	if checkpoint.IsPostgresURL(loc) {
		u, err := url.Parse(loc)
		if err != nil {
			return fmt.Errorf("%s does not parse as a URL: %w", checkpoint.RedactLocation(loc), redactParseError(err))
		}
		if (u.Host == "" && u.Query().Get("host") == "") || strings.Trim(u.Path, "/") == "" {
			return fmt.Errorf("%s: a database URL names a host and a database: postgres://USER@HOST:PORT/DATABASE", checkpoint.RedactLocation(loc))
		}
		return nil
	}
	if strings.Contains(loc, "://") {
		return fmt.Errorf("%s: give a postgres:// URL or an absolute file path", checkpoint.RedactLocation(loc))
	}
	if !filepath.IsAbs(loc) {
		return fmt.Errorf("%q is not an absolute path", loc)
	}
	return nil
}

// ValidTargetName reports whether s may name a target: 1 to 63
// lower-case letters, digits, - or _, starting with a letter or digit
// (never a path: no dot, no slash).
func ValidTargetName(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[0] == '_' {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Names are the configured names, sorted.
func (t *Targets) Names() []string {
	if t == nil {
		return nil
	}
	names := make([]string, 0, len(t.loc))
	for n := range t.loc {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Len is how many targets are configured.
func (t *Targets) Len() int {
	if t == nil {
		return 0
	}
	return len(t.loc)
}

// Location is where the target name points, and whether it is
// configured.
func (t *Targets) Location(name string) (string, bool) {
	if t == nil {
		return "", false
	}
	loc, ok := t.loc[name]
	return loc, ok
}

// IsResourceFormat reports whether a Param.Format names an outside
// resource (FormatPath, FormatExistingFile, FormatDatabase): over the API
// such a parameter is a target name.
func IsResourceFormat(format string) bool {
	return format == FormatPath || format == FormatExistingFile || format == FormatDatabase
}

// RequestValues checks the name=value parameters of a request from
// outside the operator's shell (the HTTP API, the dashboard) for job:
// every resource parameter (IsResourceFormat) must be the name of a
// target t configures, given bare ("ledger") or as "target:ledger", and
// is returned as "target:ledger"; an empty value stays empty (not given).
// A path, a URL, a connection string or an unknown name is refused with
// a *ParamError naming the parameter and the configured names, before
// anything is opened, resolved or dialled. Other parameters are returned
// as they are. Resource parameters are strings, so a request that gives
// one as another JSON value is refused by Decode.
func RequestValues(job Job, values map[string]string, t *Targets) (map[string]string, error) {
	out := make(map[string]string, len(values))
	for name, v := range values {
		out[name] = v
	}
	for _, p := range job.Params() {
		v, ok := values[p.Name]
		if !ok || v == "" || !IsResourceFormat(p.Format) {
			continue
		}
		ref, err := requestTarget(p, v, t)
		if err != nil {
			return nil, badParam(p.Name, fmt.Errorf("%w: %w", ErrBadParams, err))
		}
		out[p.Name] = ref
	}
	return out, nil
}

// requestTarget checks one resource parameter's value from a request.
func requestTarget(p Param, v string, t *Targets) (string, error) {
	name := strings.TrimPrefix(v, TargetPrefix)
	if !ValidTargetName(name) {
		what := "is not a target name"
		switch {
		case strings.Contains(name, "://"):
			what = "is a URL"
		case filepath.IsAbs(name) || strings.HasPrefix(name, "/"):
			what = "is an absolute path"
		case slices.Contains(strings.FieldsFunc(name, func(c rune) bool { return c == '/' || c == '\\' }), ".."):
			what = "is a path with .."
		case strings.Contains(name, "="):
			what = "is a connection string"
		}
		known := "this server configures no targets (serve --target NAME=LOCATION or --targets FILE)"
		if names := t.Names(); len(names) > 0 {
			known = "give one of: " + strings.Join(names, ", ")
		}
		return "", fmt.Errorf("parameter %q %s; over the API a parameter naming a file or a database is the name of a target the server's operator configured: %s",
			p.Name, what, known)
	}
	if _, ok := t.Location(name); !ok {
		return "", &UnknownTargetError{Param: p.Name, Name: name, Known: t.Names()}
	}
	return TargetPrefix + name, nil
}

// targetRef returns the name a resource parameter's stored value refers
// to, if it is a target reference.
func targetRef(v string) (string, bool) {
	name, ok := strings.CutPrefix(v, TargetPrefix)
	return name, ok
}

type targetsKey struct{}

// WithTargets returns ctx carrying t: Execute resolves the job's target
// references from the Targets its context carries (the runner passes its
// Config.Targets so).
func WithTargets(ctx context.Context, t *Targets) context.Context {
	return context.WithValue(ctx, targetsKey{}, t)
}

func targetsFrom(ctx context.Context) *Targets {
	t, _ := ctx.Value(targetsKey{}).(*Targets)
	return t
}

// resolved is what resolveTargets replaced, to name targets by name in
// errors.
type resolved struct {
	names []string // the configured names, in order
	locs  []string // their locations
}

// TargetFailedError is a job's error when it ran with resolved targets:
// its message names each target by its configured name where the error
// showed its location (a server path, a URL), so a run's recorded error
// shows no server path or credentials. It unwraps to the job's error.
type TargetFailedError struct {
	// Targets are the configured names the run used.
	Targets []string
	err     error
	repl    *strings.Replacer
}

func (e *TargetFailedError) Error() string { return e.repl.Replace(e.err.Error()) }

// Unwrap returns the job's error.
func (e *TargetFailedError) Unwrap() error { return e.err }

// wrap names r's targets in err.
func (r resolved) wrap(err error) error {
	if err == nil || len(r.locs) == 0 {
		return err
	}
	var pairs []string
	for i, loc := range r.locs {
		named := fmt.Sprintf("target %q", r.names[i])
		pairs = append(pairs, loc, named)
		if red := checkpoint.RedactLocation(loc); red != loc {
			pairs = append(pairs, red, named)
		}
		pairs = append(pairs, serverParts(loc, named)...)
	}
	return &TargetFailedError{Targets: r.names, err: err, repl: strings.NewReplacer(pairs...)}
}

// serverParts are the replacements, for a PostgreSQL location, of how the
// store and the driver name its server in their errors (the store's
// "server HOST:PORT, database DB", the driver's "user=U database=DB" and
// "HOST:PORT (IP)"): the target's name instead, so a run's error shows no
// host, port, user or database of a target.
func serverParts(loc, named string) []string {
	if !checkpoint.IsPostgresURL(loc) {
		return nil
	}
	u, err := url.Parse(loc)
	if err != nil || u.Hostname() == "" {
		return nil
	}
	host, port := u.Hostname(), cmp.Or(u.Port(), "5432")
	hostPort := net.JoinHostPort(host, port)
	db := strings.TrimPrefix(u.Path, "/")
	server := "the server of " + named
	return []string{
		"server " + hostPort + ", database " + db, server,
		"`user=" + u.User.Username() + " database=" + db + "`", named,
		hostPort + " (" + host + ")", server,
		hostPort, server,
	}
}

// resolveTargets replaces each target reference among v's resource
// parameters with the location t configures for it.
func resolveTargets(v reflect.Value, ps []Param, t *Targets) (resolved, error) {
	var r resolved
	for _, p := range ps {
		f := v.Field(p.field)
		if !IsResourceFormat(p.Format) {
			continue
		}
		name, ok := targetRef(f.String())
		if !ok {
			continue
		}
		loc, ok := t.Location(name)
		if !ok {
			return r, &UnknownTargetError{Param: p.Name, Name: name, Known: t.Names()}
		}
		f.SetString(loc)
		r.names = append(r.names, name)
		r.locs = append(r.locs, loc)
	}
	return r, nil
}
