package jobs

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// ErrBadParams is wrapped by every parameter decoding or validation error;
// the message names the parameter and what to do.
var ErrBadParams = errors.New("jobs: bad parameters")

// ParamError is a parameter decoding or validation error, about the
// parameter Param ("" when about the parameters as a whole: not a JSON
// object, or the job's own Validate). It wraps ErrBadParams; its message
// names the parameter and what to do.
type ParamError struct {
	Param string
	err   error
}

func (e *ParamError) Error() string { return e.err.Error() }

// Unwrap returns the error, which wraps ErrBadParams.
func (e *ParamError) Unwrap() error { return e.err }

func badParam(name string, err error) error { return &ParamError{Param: name, err: err} }

// Param describes one parameter of a job, from its struct field's tags:
//
//	param:"name[,key][,required]"  the parameter's name; key marks it as
//	                               identifying the run (implies required)
//	help:"..."                     one line for `stepwise jobs`
//	default:"..."                  value used when none is given
//	format:"date"                  value must be a YYYY-MM-DD date
//	format:"path"                  a file path, made absolute (against the
//	                               working directory; ~/ is the home
//	                               directory) when the parameters are
//	                               decoded, so the run stores and shows the
//	                               absolute path and a resume from another
//	                               directory opens the same file
//	format:"existingfile"          a path as above that must name an
//	                               existing file when decoded, so a typo is
//	                               refused before the run is created
//	format:"database"              a database: a postgres:// or postgresql://
//	                               URL, kept as given (it must not hold a
//	                               password: parameters are stored and
//	                               shown, so the password belongs in
//	                               PGPASSWORD or ~/.pgpass), or else a path
//	                               to an existing SQLite file, as
//	                               existingfile
//
// A path parameter given empty stays empty (not given). A value of a path,
// existingfile or database parameter that is "target:NAME" (TargetPrefix)
// is the name of a target the operator configured: it is stored as given
// and resolved to the target's location when the job executes (Targets).
// Over the HTTP API these parameters take target names only
// (RequestValues).
type Param struct {
	Name     string
	Type     string // string, int, bool, duration, ...
	Help     string
	Key      bool
	Required bool
	Default  string
	Format   string
	field    int
}

// Decoded is a job's parameters after decoding and validation.
type Decoded struct {
	// JSON is the canonical encoding: every parameter, in declaration
	// order. Equal parameters always give equal bytes.
	JSON []byte
	// Hash is the hex SHA-256 of JSON.
	Hash string
	// RunKey is the identifying parameters' values joined with "/".
	RunKey string
	// Limit is the concurrency limit the run counts against (the job's
	// Limit or LimitBy option); the zero Limit when it has none.
	Limit checkpoint.Limit
}

const dateLayout = "2006-01-02"

// Path formats of Param.Format.
const (
	// FormatPath marks a string parameter holding a file path: decoding
	// makes it absolute.
	FormatPath = "path"
	// FormatExistingFile is FormatPath for a file that must exist.
	FormatExistingFile = "existingfile"
	// FormatDatabase marks a string parameter naming a database: a
	// password-free postgres:// URL, kept as given, or an existing file,
	// as FormatExistingFile.
	FormatDatabase = "database"
)

// databaseParam checks the FormatDatabase parameter p's value s: a URL
// without a password is kept; anything else is an existing file's path.
func databaseParam(p Param, s string) (string, error) {
	if !checkpoint.IsPostgresURL(s) {
		return absPath(Param{Name: p.Name, Format: FormatExistingFile}, s)
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("parameter %q is not a valid database URL: %w; give postgres://USER@HOST:PORT/DATABASE", p.Name, redactParseError(err))
	}
	if checkpoint.HasSecret(u) {
		return "", fmt.Errorf("parameter %q (%s) holds a password, which would be stored with the run and shown by every listing; "+
			"remove it from the URL and set PGPASSWORD or a ~/.pgpass entry instead", p.Name, checkpoint.RedactLocation(s))
	}
	// A host in the authority, or in a host= parameter (a Unix socket:
	// postgres:///ledger?host=/var/run/postgresql).
	if (u.Host == "" && u.Query().Get("host") == "") || strings.Trim(u.Path, "/") == "" {
		return "", fmt.Errorf("parameter %q is %s; a database URL names a host and a database: postgres://USER@HOST:PORT/DATABASE", p.Name, checkpoint.RedactLocation(s))
	}
	return s, nil
}

// redactParseError drops the URL (which may hold a password) from a
// url.Parse error.
func redactParseError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// absPath makes the path parameter p's value s absolute and, for
// FormatExistingFile, checks the file exists. Errors name the absolute
// path.
func absPath(p Param, s string) (string, error) {
	if s == "~" || strings.HasPrefix(s, "~/") {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("parameter %q is %q: find the home directory: %w", p.Name, s, err)
		}
		s = filepath.Join(home, s[1:])
	}
	abs, err := filepath.Abs(s)
	if err != nil {
		return "", fmt.Errorf("parameter %q is %q: make it absolute: %w", p.Name, s, err)
	}
	if p.Format != FormatExistingFile {
		return abs, nil
	}
	st, err := os.Stat(abs)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("parameter %q names %s, which does not exist; give the path of an existing file", p.Name, abs)
	case err != nil:
		return "", fmt.Errorf("parameter %q names %s: %w", p.Name, abs, err)
	case st.IsDir():
		return "", fmt.Errorf("parameter %q names %s, which is a directory; give the path of a file", p.Name, abs)
	}
	return abs, nil
}

var durationType = reflect.TypeFor[time.Duration]()

// paramsOf reads the parameter descriptions of struct type t.
func paramsOf(t reflect.Type) ([]Param, error) {
	if t.Kind() != reflect.Struct {
		return nil, fmt.Errorf("parameter type %s is not a struct", t)
	}
	var ps []Param
	for i := range t.NumField() {
		f := t.Field(i)
		tag, ok := f.Tag.Lookup("param")
		if !ok || !f.IsExported() {
			continue
		}
		name, flags, _ := strings.Cut(tag, ",")
		p := Param{Name: name, Help: f.Tag.Get("help"), Default: f.Tag.Get("default"), Format: f.Tag.Get("format"), field: i}
		for fl := range strings.SplitSeq(flags, ",") {
			switch fl {
			case "":
			case "key":
				p.Key, p.Required = true, true
			case "required":
				p.Required = true
			default:
				return nil, fmt.Errorf("field %s: unknown param flag %q (use key or required)", f.Name, fl)
			}
		}
		if !validParamName(name) {
			return nil, fmt.Errorf("field %s: param name %q must be lower-case letters, digits, - or _", f.Name, name)
		}
		switch {
		case f.Type == durationType:
			p.Type = "duration"
		case f.Type.Kind() == reflect.String:
			p.Type = "string"
		case f.Type.Kind() == reflect.Bool:
			p.Type = "bool"
		case f.Type.Kind() >= reflect.Int && f.Type.Kind() <= reflect.Int64:
			p.Type = "int"
		case f.Type.Kind() >= reflect.Uint && f.Type.Kind() <= reflect.Uint64:
			p.Type = "uint"
		default:
			return nil, fmt.Errorf("field %s: type %s is not supported for parameters (string, integers, bool, time.Duration; money is int64 minor units)", f.Name, f.Type)
		}
		if p.Key && p.Type != "string" && p.Type != "int" && p.Type != "uint" {
			return nil, fmt.Errorf("field %s: a key parameter must be a string or an integer", f.Name)
		}
		switch p.Format {
		case "", "date":
		case FormatPath, FormatExistingFile, FormatDatabase:
			if p.Type != "string" {
				return nil, fmt.Errorf("field %s: format %q needs a string field", f.Name, p.Format)
			}
		default:
			return nil, fmt.Errorf("field %s: unknown format %q (use date, %s, %s or %s)", f.Name, p.Format, FormatPath, FormatExistingFile, FormatDatabase)
		}
		if slices.ContainsFunc(ps, func(q Param) bool { return q.Name == name }) {
			return nil, fmt.Errorf("field %s: parameter name %q used twice", f.Name, name)
		}
		ps = append(ps, p)
	}
	if !slices.ContainsFunc(ps, func(p Param) bool { return p.Key }) {
		return nil, fmt.Errorf("parameter type %s has no identifying parameter; mark one with `param:\"name,key\"` "+
			"(the run key, e.g. a business date, is what makes a rerun find the same run)", t)
	}
	return ps, nil
}

func validParamName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// decodeParams fills a new value of type t from a JSON params file (may be
// nil) and name=value pairs (which override the file), applies defaults and
// validates. job names the job in errors.
func decodeParams(job string, t reflect.Type, ps []Param, values map[string]string, file []byte) (reflect.Value, error) {
	v := reflect.New(t).Elem()
	given := map[string]bool{}
	if err := fillFromFile(job, v, ps, file, given); err != nil {
		return v, err
	}
	if err := fillFromValues(job, v, ps, values, given); err != nil {
		return v, err
	}
	if err := fillDefaults(job, v, ps, given); err != nil {
		return v, err
	}
	if err := checkParams(job, v, ps); err != nil {
		return v, err
	}
	if val, ok := v.Addr().Interface().(interface{ Validate() error }); ok {
		if err := val.Validate(); err != nil {
			return v, badParam("", fmt.Errorf("%w: job %s: %w", ErrBadParams, job, err))
		}
	}
	return v, nil
}

// fillFromFile sets the parameters a JSON params file gives (a null is
// not given), marking them in given.
func fillFromFile(job string, v reflect.Value, ps []Param, file []byte, given map[string]bool) error {
	if len(bytes.TrimSpace(file)) == 0 {
		return nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(file, &raw); err != nil {
		return badParam("", fmt.Errorf("%w: params file for job %s is not a JSON object: %v", ErrBadParams, job, err))
	}
	for name, msg := range raw {
		if string(bytes.TrimSpace(msg)) == "null" {
			continue // null means not given
		}
		p, ok := findParam(ps, name)
		if !ok {
			return badParam(name, fmt.Errorf("%w: params file sets unknown parameter %q for job %s (known: %s)",
				ErrBadParams, name, job, paramNames(ps)))
		}
		if err := json.Unmarshal(msg, v.Field(p.field).Addr().Interface()); err != nil {
			var s string
			if p.Type == "duration" && json.Unmarshal(msg, &s) == nil {
				if err := setString(v.Field(p.field), p, s); err != nil {
					return badParam(name, fmt.Errorf("%w: params file: %s: %v", ErrBadParams, name, err))
				}
			} else {
				return badParam(name, fmt.Errorf("%w: params file: parameter %q of job %s wants a %s: %v", ErrBadParams, name, job, p.Type, err))
			}
		}
		given[name] = true
	}
	return nil
}

// fillFromValues sets the parameters name=value pairs give, in name
// order, marking them in given.
func fillFromValues(job string, v reflect.Value, ps []Param, values map[string]string, given map[string]bool) error {
	names := make([]string, 0, len(values))
	for name := range values {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		p, ok := findParam(ps, name)
		if !ok {
			return badParam(name, fmt.Errorf("%w: unknown parameter %q for job %s (known: %s)", ErrBadParams, name, job, paramNames(ps)))
		}
		if err := setString(v.Field(p.field), p, values[name]); err != nil {
			return badParam(name, fmt.Errorf("%w: -p %s=%s: %v", ErrBadParams, name, values[name], err))
		}
		given[name] = true
	}
	return nil
}

// fillDefaults sets the defaults of the parameters not given, and refuses
// a required one not given.
func fillDefaults(job string, v reflect.Value, ps []Param, given map[string]bool) error {
	for _, p := range ps {
		if given[p.Name] {
			continue
		}
		if p.Default != "" {
			if err := setString(v.Field(p.field), p, p.Default); err != nil {
				return badParam(p.Name, fmt.Errorf("%w: default of %s: %v", ErrBadParams, p.Name, err))
			}
			continue
		}
		if p.Required {
			return badParam(p.Name, fmt.Errorf("%w: job %s needs parameter %q (%s); give it with -p %s=VALUE",
				ErrBadParams, job, p.Name, p.Help, p.Name))
		}
	}
	return nil
}

// checkParams checks the filled parameters by their formats (a required
// string not empty, dates, paths and databases, which it makes absolute,
// and key parameters fit for a run ID).
func checkParams(job string, v reflect.Value, ps []Param) error {
	for _, p := range ps {
		f := v.Field(p.field)
		if p.Required && p.Type == "string" && f.String() == "" {
			return badParam(p.Name, fmt.Errorf("%w: job %s needs parameter %q (%s); it was given empty", ErrBadParams, job, p.Name, p.Help))
		}
		if p.Format == "date" && f.String() != "" {
			if _, err := time.Parse(dateLayout, f.String()); err != nil {
				return badParam(p.Name, fmt.Errorf("%w: parameter %q is %q; want a date as YYYY-MM-DD", ErrBadParams, p.Name, f.String()))
			}
		}
		if name, ok := targetRef(f.String()); ok && IsResourceFormat(p.Format) {
			// A target's name, resolved when the job is executed.
			if !ValidTargetName(name) {
				return badParam(p.Name, fmt.Errorf("%w: parameter %q is %q, which is not a target name (lower-case letters, digits, - or _)",
					ErrBadParams, p.Name, f.String()))
			}
			continue
		}
		if (p.Format == FormatPath || p.Format == FormatExistingFile) && f.String() != "" {
			abs, err := absPath(p, f.String())
			if err != nil {
				return badParam(p.Name, fmt.Errorf("%w: %w", ErrBadParams, err))
			}
			f.SetString(abs)
		}
		if p.Format == FormatDatabase && f.String() != "" {
			loc, err := databaseParam(p, f.String())
			if err != nil {
				return badParam(p.Name, fmt.Errorf("%w: %w", ErrBadParams, err))
			}
			f.SetString(loc)
		}
		if p.Key {
			s := fmt.Sprint(f.Interface())
			if s == "" || strings.ContainsAny(s, "/ \t\n") || len(s) > 100 {
				return badParam(p.Name, fmt.Errorf("%w: key parameter %q is %q; it must be non-empty, at most 100 bytes, without / or spaces",
					ErrBadParams, p.Name, s))
			}
		}
	}
	return nil
}

func setString(f reflect.Value, p Param, s string) error {
	switch p.Type {
	case "string":
		f.SetString(s)
	case "bool":
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("parameter %q wants true or false", p.Name)
		}
		f.SetBool(b)
	case "duration":
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("parameter %q wants a duration such as 90s or 2m", p.Name)
		}
		f.SetInt(int64(d))
	case "int":
		n, err := strconv.ParseInt(s, 10, f.Type().Bits())
		if err != nil {
			return fmt.Errorf("parameter %q wants a whole number (%d-bit)", p.Name, f.Type().Bits())
		}
		f.SetInt(n)
	case "uint":
		n, err := strconv.ParseUint(s, 10, f.Type().Bits())
		if err != nil {
			return fmt.Errorf("parameter %q wants a non-negative whole number", p.Name)
		}
		f.SetUint(n)
	}
	return nil
}

// canonical encodes the parameters as a JSON object in declaration order and
// builds the run key.
func canonical(ps []Param, v reflect.Value) (Decoded, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	var key []string
	for i, p := range ps {
		if i > 0 {
			buf.WriteByte(',')
		}
		name, _ := json.Marshal(p.Name)
		buf.Write(name)
		buf.WriteByte(':')
		f := v.Field(p.field)
		var val any = f.Interface()
		if p.Type == "duration" {
			val = time.Duration(f.Int()).String()
		}
		b, err := json.Marshal(val)
		if err != nil {
			return Decoded{}, err
		}
		buf.Write(b)
		if p.Key {
			key = append(key, fmt.Sprint(f.Interface()))
		}
	}
	buf.WriteByte('}')
	sum := sha256.Sum256(buf.Bytes())
	return Decoded{JSON: buf.Bytes(), Hash: hex.EncodeToString(sum[:]), RunKey: strings.Join(key, "/")}, nil
}

func findParam(ps []Param, name string) (Param, bool) {
	for _, p := range ps {
		if p.Name == name {
			return p, true
		}
	}
	return Param{}, false
}

func paramNames(ps []Param) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}

// ErrUnknownJob is returned by Registry.Lookup for a name nobody registered.
var ErrUnknownJob = errors.New("jobs: unknown job")
