package cmd

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/alecthomas/kong"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
)

// targetFlags are the outside resources (databases, files) the operator
// configures by name for the runs a process executes: serve (its API's
// requests may name only these) and worker resolve the "target:NAME"
// parameters of the runs they execute from them, and run, resume and
// rerun (and backfill) resolve those of a run the API started.
type targetFlags struct {
	Target  []string `sep:"none" placeholder:"NAME=LOCATION" help:"A target a run may name: NAME=postgres://USER@HOST:PORT/DATABASE or NAME=PATH (made absolute); repeat for several. A start over the HTTP API gives a parameter naming a file or a database (settle's ledger) as one of these names, never a path or URL; the run stores target:NAME and every process executing it (serve, worker, resume) resolves NAME from its own --target and --targets. No password here (ps shows it to every user): put targets with credentials in --targets."`
	Targets string   `type:"path" env:"STEPWISE_TARGETS" placeholder:"FILE" help:"File of targets, one NAME=LOCATION a line (# comments), as --target; it may hold passwords in its URLs, so it must be readable by its owner only (chmod 600). Relative paths are against the file's directory. In serve and worker, target databases take their password only from here, never from PGPASSWORD or ~/.pgpass."`
}

// errTargets is wrapped by every error of --target and --targets.
var errTargets = errors.New("bad targets")

// targets builds the configured targets; nil when none are.
func (f targetFlags) targets() (*jobs.Targets, error) {
	if len(f.Target) == 0 && f.Targets == "" {
		return nil, nil
	}
	m := map[string]string{}
	for _, t := range f.Target {
		name, loc, err := parseTarget(t, "")
		if err != nil {
			return nil, fmt.Errorf("%w: --target %s: %w", errTargets, redactTarget(t), err)
		}
		if checkpoint.IsPostgresURL(loc) {
			if u, err := url.Parse(loc); err == nil && checkpoint.HasSecret(u) {
				return nil, fmt.Errorf("%w: --target %s holds a password, which every user of this host can read in the process list; "+
					"put the line %s=... in a --targets file readable by its owner only (chmod 600)", errTargets, redactTarget(t), name)
			}
		}
		if err := addTarget(m, name, loc); err != nil {
			return nil, fmt.Errorf("%w: --target %s: %w", errTargets, redactTarget(t), err)
		}
	}
	if f.Targets != "" {
		if err := readTargetsFile(f.Targets, m); err != nil {
			return nil, fmt.Errorf("%w: --targets %s: %w", errTargets, f.Targets, err)
		}
	}
	return jobs.NewTargets(m)
}

func addTarget(m map[string]string, name, loc string) error {
	if _, dup := m[name]; dup {
		return fmt.Errorf("target %s is configured twice; keep one", name)
	}
	m[name] = loc
	return nil
}

// readTargetsFile adds the targets of the file at path to m. The file must
// be readable by its owner only: it may hold passwords.
func readTargetsFile(path string, m map[string]string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if runtime.GOOS != "windows" && st.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("the file is readable or writable by others (mode %04o) and may hold passwords; make it the owner's only: chmod 600 %s",
			st.Mode().Perm(), path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, loc, err := parseTarget(line, filepath.Dir(path))
		if err == nil {
			err = addTarget(m, name, loc)
		}
		if err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
	}
	return sc.Err()
}

// parseTarget splits NAME=LOCATION; a location that is not a URL is a
// path, made absolute against dir ("" for the working directory).
func parseTarget(s, dir string) (name, loc string, err error) {
	name, loc, ok := strings.Cut(s, "=")
	name, loc = strings.TrimSpace(name), strings.TrimSpace(loc)
	if !ok || name == "" || loc == "" {
		return "", "", errors.New("write NAME=LOCATION, e.g. ledger=postgres://app@db.internal:5432/ledger or ledger=/srv/ledger.db")
	}
	if !jobs.ValidTargetName(name) {
		return "", "", fmt.Errorf("target name %q: use lower-case letters, digits, - or _", name)
	}
	if !strings.Contains(loc, "://") {
		if dir != "" && !filepath.IsAbs(loc) && !strings.HasPrefix(loc, "~") {
			loc = filepath.Join(dir, loc)
		}
		loc = kong.ExpandPath(loc)
	}
	return name, loc, nil
}

// redactTarget is a --target value fit for a message.
func redactTarget(s string) string {
	name, loc, _ := strings.Cut(s, "=")
	return name + "=" + checkpoint.RedactLocation(loc)
}
