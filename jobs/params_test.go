package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

func noop[P any](context.Context, *steps.Run, P) error { return nil }

// mustPanic runs f and returns the panic's message, failing if f returns.
func mustPanic(t *testing.T, what string, f func()) string {
	t.Helper()
	var msg string
	func() {
		defer func() {
			if r := recover(); r != nil {
				msg = fmt.Sprint(r)
			}
		}()
		f()
		t.Errorf("%s did not panic", what)
	}()
	return msg
}

type settleParams struct {
	Zone    string        `param:"zone,key" help:"settlement zone"`
	Date    string        `param:"date,key" format:"date" help:"business date"`
	Limit   int64         `param:"limit" default:"1000" help:"max transfers"`
	DryRun  bool          `param:"dry-run" help:"plan only"`
	Pause   time.Duration `param:"pause" default:"2s" help:"pause between chunks"`
	Batch   uint16        `param:"batch" default:"50"`
	Note    string        `param:"note,required" help:"operator note"`
	Ignored string        // no param tag: not a parameter
}

var errBadLimit = errors.New("limit must be positive")

func (p *settleParams) Validate() error {
	if p.Limit <= 0 {
		return fmt.Errorf("parameter \"limit\" is %d: %w", p.Limit, errBadLimit)
	}
	return nil
}

var settle = jobs.Define("settle", noop[settleParams], jobs.Help("settles the day"))

func TestDefineDescribesParams(t *testing.T) {
	if settle.Name() != "settle" || settle.Help() != "settles the day" {
		t.Errorf("job = %s %q", settle.Name(), settle.Help())
	}
	var got []string
	for _, p := range settle.Params() {
		got = append(got, fmt.Sprintf("%s:%s:key=%v:req=%v:def=%s:fmt=%s", p.Name, p.Type, p.Key, p.Required, p.Default, p.Format))
	}
	want := []string{
		"zone:string:key=true:req=true:def=:fmt=",
		"date:string:key=true:req=true:def=:fmt=date",
		"limit:int:key=false:req=false:def=1000:fmt=",
		"dry-run:bool:key=false:req=false:def=:fmt=",
		"pause:duration:key=false:req=false:def=2s:fmt=",
		"batch:uint:key=false:req=false:def=50:fmt=",
		"note:string:key=false:req=true:def=:fmt=",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Params() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Params returns a copy.
	ps := settle.Params()
	ps[0].Name = "changed"
	if settle.Params()[0].Name != "zone" {
		t.Errorf("Params() shares its slice with the definition")
	}
}

func TestDefinePanicsOnMalformedJobs(t *testing.T) {
	type noKey struct {
		Date string `param:"date"`
	}
	type floatParam struct {
		Date string  `param:"date,key"`
		Rate float64 `param:"rate"`
	}
	type badName struct {
		Date string `param:"Date,key"`
	}
	type badFlag struct {
		Date string `param:"date,kee"`
	}
	type boolKey struct {
		On bool `param:"on,key"`
	}
	type dupName struct {
		A string `param:"date,key"`
		B string `param:"date"`
	}
	type badFormat struct {
		Date string `param:"date,key" format:"time"`
	}
	type ok struct {
		Date string `param:"date,key"`
	}
	for _, tc := range []struct {
		what    string
		define  func()
		mention string
	}{
		{"no key field", func() { jobs.Define("j", noop[noKey]) }, "no identifying parameter"},
		{"float64 field", func() { jobs.Define("j", noop[floatParam]) }, "float64"},
		{"upper-case param name", func() { jobs.Define("j", noop[badName]) }, `"Date"`},
		{"unknown flag", func() { jobs.Define("j", noop[badFlag]) }, `"kee"`},
		{"bool key", func() { jobs.Define("j", noop[boolKey]) }, "key parameter"},
		{"duplicate param name", func() { jobs.Define("j", noop[dupName]) }, "used twice"},
		{"unknown format", func() { jobs.Define("j", noop[badFormat]) }, `"time"`},
		{"not a struct", func() { jobs.Define("j", noop[string]) }, "not a struct"},
		{"empty job name", func() { jobs.Define("", noop[ok]) }, `""`},
		{"job name with /", func() { jobs.Define("a/b", noop[ok]) }, `"a/b"`},
		{"job name with space", func() { jobs.Define("my job", noop[ok]) }, `"my job"`},
		{"job name with #", func() { jobs.Define("job#1", noop[ok]) }, `"job#1"`},
		{"nil function", func() { jobs.Define[ok]("j", nil) }, "nil function"},
	} {
		msg := mustPanic(t, "Define with "+tc.what, tc.define)
		if msg != "" && !strings.Contains(msg, tc.mention) {
			t.Errorf("Define with %s panicked with %q; want it to mention %s", tc.what, msg, tc.mention)
		}
	}
}

func TestRegistry(t *testing.T) {
	type p struct {
		Date string `param:"date,key"`
	}
	var reg jobs.Registry
	a, b := jobs.Define("b-job", noop[p]), jobs.Define("a-job", noop[p])
	reg.MustRegister(a, b)
	msg := mustPanic(t, "MustRegister of a duplicate", func() { reg.MustRegister(jobs.Define("a-job", noop[p])) })
	if !strings.Contains(msg, `"a-job"`) {
		t.Errorf("duplicate panic %q does not name the job", msg)
	}
	if j, err := reg.Lookup("a-job"); err != nil || j != b {
		t.Errorf("Lookup(a-job) = %v, %v; want the registered job", j, err)
	}
	_, err := reg.Lookup("c-job")
	if !errors.Is(err, jobs.ErrUnknownJob) || !strings.Contains(err.Error(), `"c-job"`) || !strings.Contains(err.Error(), "a-job b-job") {
		t.Errorf("Lookup(c-job) err = %v; want ErrUnknownJob naming it and the known jobs", err)
	}
	var names []string
	for _, j := range reg.Jobs() {
		names = append(names, j.Name())
	}
	if strings.Join(names, ",") != "a-job,b-job" {
		t.Errorf("Jobs() = %v; want sorted a-job, b-job", names)
	}
}

func decodeSettle(t *testing.T, values map[string]string, file string) jobs.Decoded {
	t.Helper()
	var f []byte
	if file != "" {
		f = []byte(file)
	}
	d, err := settle.Decode(values, f)
	if err != nil {
		t.Fatalf("Decode(%v, %s): %v", values, file, err)
	}
	return d
}

const wantCanonical = `{"zone":"eu","date":"2026-11-28","limit":1000,"dry-run":false,"pause":"2s","batch":50,"note":"x"}`

func TestDecodeValuesAndDefaults(t *testing.T) {
	d := decodeSettle(t, map[string]string{"zone": "eu", "date": "2026-11-28", "note": "x"}, "")
	if string(d.JSON) != wantCanonical {
		t.Errorf("canonical JSON = %s; want %s (defaults applied, declaration order)", d.JSON, wantCanonical)
	}
	// The run key follows the declaration order of the key parameters, not
	// their names' order.
	if d.RunKey != "eu/2026-11-28" {
		t.Errorf("run key = %q; want eu/2026-11-28", d.RunKey)
	}
	if len(d.Hash) != 64 {
		t.Errorf("hash = %q; want hex SHA-256", d.Hash)
	}
	if jobs.RunID(settle.Name(), d.RunKey) != "settle/eu/2026-11-28" {
		t.Errorf("RunID = %q", jobs.RunID(settle.Name(), d.RunKey))
	}

	all := decodeSettle(t, map[string]string{
		"zone": "us", "date": "2026-01-02", "note": "n", "limit": "7", "dry-run": "true", "pause": "1m30s", "batch": "7",
	}, "")
	want := `{"zone":"us","date":"2026-01-02","limit":7,"dry-run":true,"pause":"1m30s","batch":7,"note":"n"}`
	if string(all.JSON) != want || all.RunKey != "us/2026-01-02" {
		t.Errorf("every value given: %s key %s; want %s key us/2026-01-02", all.JSON, all.RunKey, want)
	}
}

func TestDecodeSameParamsSameBytes(t *testing.T) {
	fromValues := decodeSettle(t, map[string]string{"zone": "eu", "date": "2026-11-28", "note": "x", "pause": "2000ms"}, "")
	fromFile := decodeSettle(t, nil, `{"note":"x","date":"2026-11-28","zone":"eu","pause":"2s","limit":1000}`)
	fromNanos := decodeSettle(t, nil, `{"zone":"eu","date":"2026-11-28","note":"x","pause":2000000000}`)
	mixed := decodeSettle(t, map[string]string{"date": "2026-11-28"}, `{"zone":"eu","note":"x","batch":50}`)
	typed, err := settle.Encode(settleParams{Zone: "eu", Date: "2026-11-28", Limit: 1000, Pause: 2 * time.Second, Batch: 50, Note: "x", Ignored: "not a param"})
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]jobs.Decoded{"file": fromFile, "nanoseconds": fromNanos, "mixed": mixed, "Encode": typed} {
		if string(d.JSON) != string(fromValues.JSON) || d.Hash != fromValues.Hash || d.RunKey != fromValues.RunKey {
			t.Errorf("%s gave %s (key %s); -p values gave %s (key %s)", name, d.JSON, d.RunKey, fromValues.JSON, fromValues.RunKey)
		}
	}
	other := decodeSettle(t, map[string]string{"zone": "eu", "date": "2026-11-28", "note": "y"}, "")
	if other.Hash == fromValues.Hash || other.RunKey != fromValues.RunKey {
		t.Errorf("other note: hash %s, key %s; want another hash, same key", other.Hash, other.RunKey)
	}
}

func TestDecodeValuesOverrideFile(t *testing.T) {
	d := decodeSettle(t, map[string]string{"limit": "5", "zone": "us"}, `{"zone":"eu","date":"2026-11-28","note":"x","limit":9}`)
	want := `{"zone":"us","date":"2026-11-28","limit":5,"dry-run":false,"pause":"2s","batch":50,"note":"x"}`
	if string(d.JSON) != want || d.RunKey != "us/2026-11-28" {
		t.Errorf("Decode = %s key %s; want %s key us/2026-11-28", d.JSON, d.RunKey, want)
	}
}

func TestDecodeErrorsNameTheParameter(t *testing.T) {
	base := map[string]string{"zone": "eu", "date": "2026-11-28", "note": "x"}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range base {
			m[a] = b
		}
		if v == "\x00delete" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		name     string
		values   map[string]string
		file     string
		mentions []string
	}{
		{"unknown -p", with("colour", "red"), "", []string{`"colour"`, "zone, date, limit, dry-run, pause, batch, note"}},
		{"unknown in file", base, `{"colour":"red"}`, []string{`"colour"`, "zone, date, limit"}},
		{"missing key", with("zone", "\x00delete"), "", []string{`"zone"`, "-p zone="}},
		{"missing required", with("note", "\x00delete"), "", []string{`"note"`, "operator note"}},
		{"bad int", with("limit", "ten"), "", []string{"limit", "whole number"}},
		{"int overflow", with("batch", "70000"), "", []string{"batch"}},
		{"negative uint", with("batch", "-1"), "", []string{"batch"}},
		{"bad bool", with("dry-run", "yes please"), "", []string{"dry-run", "true or false"}},
		{"bad duration", with("pause", "2 seconds"), "", []string{"pause", "duration"}},
		{"bad date", with("date", "28/11/2026"), "", []string{`"date"`, "28/11/2026", "YYYY-MM-DD"}},
		{"impossible date", with("date", "2026-02-30"), "", []string{`"date"`}},
		{"key with slash", with("zone", "eu/west"), "", []string{`"zone"`, "eu/west"}},
		{"key with space", with("zone", "eu west"), "", []string{`"zone"`}},
		{"bad int in file", base, `{"limit":"ten"}`, []string{`"limit"`, "int"}},
		{"bad duration in file", base, `{"pause":"soon"}`, []string{"pause", "duration"}},
		{"file not an object", base, `[1,2]`, []string{"settle", "JSON object"}},
	} {
		var file []byte
		if tc.file != "" {
			file = []byte(tc.file)
		}
		_, err := settle.Decode(tc.values, file)
		if !errors.Is(err, jobs.ErrBadParams) {
			t.Errorf("%s: err = %v; want ErrBadParams", tc.name, err)
			continue
		}
		for _, m := range tc.mentions {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%s: error %q does not mention %s", tc.name, err, m)
			}
		}
	}
}

func TestDecodeRunsValidate(t *testing.T) {
	_, err := settle.Decode(map[string]string{"zone": "eu", "date": "2026-11-28", "note": "x", "limit": "0"}, nil)
	if !errors.Is(err, errBadLimit) || !errors.Is(err, jobs.ErrBadParams) {
		t.Fatalf("err = %v; want the Validate error wrapped in ErrBadParams", err)
	}
	if !strings.Contains(err.Error(), `"limit" is 0`) || !strings.Contains(err.Error(), "settle") {
		t.Errorf("error %q does not carry Validate's message and the job", err)
	}
}

type intKeyParams struct {
	Batch int    `param:"batch,key"`
	Mode  string `param:"mode" default:"fast"`
}

func (p intKeyParams) Validate() error { // value receiver works too
	if p.Mode != "fast" && p.Mode != "slow" {
		return fmt.Errorf("mode %q: use fast or slow", p.Mode)
	}
	return nil
}

func TestDecodeIntKeyAndValueValidate(t *testing.T) {
	j := jobs.Define("batch", noop[intKeyParams])
	d, err := j.Decode(map[string]string{"batch": "42"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.RunKey != "42" || string(d.JSON) != `{"batch":42,"mode":"fast"}` {
		t.Errorf("Decode = key %q JSON %s; want key 42, JSON {\"batch\":42,\"mode\":\"fast\"}", d.RunKey, d.JSON)
	}
	if _, err := j.Decode(map[string]string{"batch": "42", "mode": "warp"}, nil); err == nil || !strings.Contains(err.Error(), `"warp"`) {
		t.Errorf("value-receiver Validate not applied: err = %v", err)
	}
}

func TestExecuteDecodesCanonicalParams(t *testing.T) {
	var got settleParams
	j := jobs.Define("settle", func(_ context.Context, _ *steps.Run, p settleParams) error {
		got = p
		return errors.New("job ran")
	})
	d := decodeSettle(t, map[string]string{"zone": "eu", "date": "2026-11-28", "note": "x", "pause": "90s", "dry-run": "true"}, "")
	if err := j.Execute(context.Background(), nil, d.JSON); err == nil || err.Error() != "job ran" {
		t.Fatalf("Execute err = %v; want the job's error", err)
	}
	want := settleParams{Zone: "eu", Date: "2026-11-28", Limit: 1000, DryRun: true, Pause: 90 * time.Second, Batch: 50, Note: "x"}
	if got != want {
		t.Errorf("job got %+v; want %+v", got, want)
	}
}

type pathParams struct {
	Date   string `param:"date,key"`
	Out    string `param:"out" format:"path" help:"report file"`
	Ledger string `param:"ledger" format:"existingfile" help:"ledger file"`
}

// TestDecodePathParams runs from two working directories (t.Chdir: not in
// parallel): a path parameter is stored absolute, resolved against the
// directory the run was created in; decoding the stored parameters again
// elsewhere keeps them; the same relative path typed elsewhere is another
// file, so other parameters.
func TestDecodePathParams(t *testing.T) {
	j := jobs.Define("report", noop[pathParams])
	for _, p := range j.Params() {
		if p.Name == "out" && p.Format != jobs.FormatPath || p.Name == "ledger" && p.Format != jobs.FormatExistingFile {
			t.Errorf("param %s has format %q", p.Name, p.Format)
		}
	}
	one, two := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(one, "ledger.db"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(one)
	values := map[string]string{"date": "2026-11-28", "out": "reports/out.csv", "ledger": "ledger.db"}
	d, err := j.Decode(values, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`{"date":"2026-11-28","out":%q,"ledger":%q}`, filepath.Join(one, "reports", "out.csv"), filepath.Join(one, "ledger.db"))
	if string(d.JSON) != want {
		t.Errorf("Decode in %s = %s; want %s", one, d.JSON, want)
	}
	if _, err := os.Stat(filepath.Join(one, "reports")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("decoding a path parameter created something: %v", err)
	}
	// Not given, or given empty: stays empty.
	if d, err := j.Decode(map[string]string{"date": "2026-11-28", "out": ""}, nil); err != nil || string(d.JSON) != `{"date":"2026-11-28","out":"","ledger":""}` {
		t.Errorf("Decode without paths = %s, %v", d.JSON, err)
	}

	t.Chdir(two)
	again, err := j.Decode(nil, d.JSON)
	if err != nil {
		t.Fatalf("stored parameters do not decode in another directory: %v", err)
	}
	if again.Hash != d.Hash || string(again.JSON) != string(d.JSON) {
		t.Errorf("stored parameters decoded in %s changed: %s, was %s", two, again.JSON, d.JSON)
	}
	var got pathParams
	jx := jobs.Define("report", func(_ context.Context, _ *steps.Run, p pathParams) error { got = p; return nil })
	if err := jx.Execute(context.Background(), nil, d.JSON); err != nil || got.Ledger != filepath.Join(one, "ledger.db") {
		t.Errorf("Execute in %s gave the job ledger %q (%v); want %s", two, got.Ledger, err, filepath.Join(one, "ledger.db"))
	}

	// The same relative values typed in the other directory: the ledger
	// is missing there, refused naming its absolute path; without it, out
	// is another file, so the parameters (and their hash) differ.
	_, err = j.Decode(values, nil)
	if !errors.Is(err, jobs.ErrBadParams) || !strings.Contains(err.Error(), filepath.Join(two, "ledger.db")) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing existingfile: err = %v; want ErrBadParams naming %s", err, filepath.Join(two, "ledger.db"))
	}
	if _, err := os.Stat(filepath.Join(two, "ledger.db")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("decoding a missing existingfile created it: %v", err)
	}
	other, err := j.Decode(map[string]string{"date": "2026-11-28", "out": "reports/out.csv"}, nil)
	if err != nil || !strings.Contains(string(other.JSON), filepath.Join(two, "reports", "out.csv")) {
		t.Errorf("Decode in %s = %s, %v; want out under %s", two, other.JSON, err, two)
	}
	if err := os.Mkdir(filepath.Join(two, "dir.db"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Decode(map[string]string{"date": "2026-11-28", "ledger": "dir.db"}, nil); !errors.Is(err, jobs.ErrBadParams) || !strings.Contains(err.Error(), "directory") {
		t.Errorf("existingfile naming a directory: err = %v", err)
	}
	home, err := os.UserHomeDir()
	if err == nil {
		d, err := j.Decode(map[string]string{"date": "2026-11-28", "out": "~/x.csv"}, nil)
		if err != nil || !strings.Contains(string(d.JSON), filepath.Join(home, "x.csv")) {
			t.Errorf("~/x.csv decoded to %s, %v; want it under %s", d.JSON, err, home)
		}
	}
}

func TestPathFormatNeedsAString(t *testing.T) {
	type intPath struct {
		Date string `param:"date,key"`
		N    int    `param:"n" format:"path"`
	}
	msg := mustPanic(t, "Define with an int path", func() { jobs.Define("j", noop[intPath]) })
	if !strings.Contains(msg, "string") {
		t.Errorf("panic %q does not say a path needs a string field", msg)
	}
}

type databaseParams struct {
	Date   string `param:"date,key"`
	Ledger string `param:"ledger" format:"database" help:"ledger database"`
}

// TestDecodeDatabaseParam: a URL without a password is kept as given; one
// with a password is refused without echoing it; a path must be an
// existing file and is made absolute.
func TestDecodeDatabaseParam(t *testing.T) {
	j := jobs.Define("report", noop[databaseParams])
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ledger.db"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	for _, tc := range []struct {
		in, want, refused string
	}{
		{in: "postgres://app@db.internal:5432/ledger?sslmode=require", want: "postgres://app@db.internal:5432/ledger?sslmode=require"},
		{in: "postgresql://app@db/ledger", want: "postgresql://app@db/ledger"},
		{in: "ledger.db", want: filepath.Join(dir, "ledger.db")},
		{in: "postgres://app:s3cret@db/ledger", refused: "holds a password"},
		{in: "postgres://app@db", refused: "names a host and a database"},
		{in: "missing.db", refused: "does not exist"},
	} {
		d, err := j.Decode(map[string]string{"date": "2026-11-28", "ledger": tc.in}, nil)
		if tc.refused != "" {
			if !errors.Is(err, jobs.ErrBadParams) || !strings.Contains(err.Error(), tc.refused) || strings.Contains(err.Error(), "s3cret") {
				t.Errorf("ledger=%s: err = %v; want ErrBadParams saying %q, without the password", tc.in, err, tc.refused)
			}
			continue
		}
		if err != nil {
			t.Errorf("ledger=%s: %v", tc.in, err)
			continue
		}
		if want := fmt.Sprintf(`{"date":"2026-11-28","ledger":%q}`, tc.want); string(d.JSON) != want {
			t.Errorf("ledger=%s: decoded %s; want %s", tc.in, d.JSON, want)
		}
	}
}

// TestDecodeDatabaseParamSecretsAndSockets: a password in a query
// parameter is refused like one in the user information; a Unix-socket
// URL (host= parameter) is a database URL.
func TestDecodeDatabaseParamSecretsAndSockets(t *testing.T) {
	j := jobs.Define("report", noop[databaseParams])
	for _, in := range []string{"postgres://app@db/ledger?password=s3cret", "postgres://app@db/ledger?sslpassword=s3cret"} {
		_, err := j.Decode(map[string]string{"date": "2026-11-28", "ledger": in}, nil)
		if !errors.Is(err, jobs.ErrBadParams) || !strings.Contains(err.Error(), "holds a password") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ledger=%s: err = %v; want refused for holding a password, without showing it", in, err)
		}
	}
	const socket = "postgres:///ledger?host=/var/run/postgresql"
	d, err := j.Decode(map[string]string{"date": "2026-11-28", "ledger": socket}, nil)
	if err != nil || !strings.Contains(string(d.JSON), socket) {
		t.Errorf("ledger=%s: %s, %v; want it kept as given", socket, d.JSON, err)
	}
}
