package pgtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Main runs a test binary's tests and, when STEPWISE_TEST_PG is not set,
// says that the PostgreSQL pass was not run where `go test ./...` shows
// it for a passing package too. Call it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
// `go test` in package-list mode keeps a passing package's output to
// itself unless -v, so the note goes to the go command's own standard
// error (its /proc entry, on Linux: a terminal, a pipe or a file opened for
// appending) and, failing that or with -v, to the test's standard output,
// which -v and a failure show. So that a cached result cannot hide it, a run
// without STEPWISE_TEST_PG is never cached: URL, skipping the first test,
// changes into the binary's own build directory and back; the go command
// removes that directory when it ends, and its test cache checks the
// directories a test changed into.
func Main(m *testing.M) int {
	if os.Getenv(EnvURL) != "" {
		return m.Run()
	}
	code := m.Run()
	note := "pgtest: " + SkipMessage
	if !testing.Verbose() && noteToGo(note) {
		return code
	}
	fmt.Println(note)
	return code
}

// noteToGo writes note to the go command's standard error, on Linux, where
// that is safe: a terminal or a pipe, or a file the go command appends to.
// A file written at its own offset would overwrite our line, so then it
// writes nothing and reports false.
func noteToGo(note string) bool {
	// Only into the go command's own stream: a test binary run by another
	// tool (a debugger, an IDE's runner parsing stderr) is left alone.
	exe, err := os.Readlink("/proc/" + strconv.Itoa(os.Getppid()) + "/exe")
	if err != nil || (filepath.Base(exe) != "go" && filepath.Base(exe) != "go.exe") {
		return false
	}
	fd := "/proc/" + strconv.Itoa(os.Getppid()) + "/fd/2"
	info, err := os.Stat(fd)
	if err != nil {
		return false
	}
	if info.Mode().IsRegular() {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(os.Getppid()) + "/fdinfo/2")
		if err != nil {
			return false
		}
		appends := false
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
				appends = err == nil && flags&0o2000 != 0 // O_APPEND
			}
		}
		if !appends {
			return false
		}
	}
	f, err := os.OpenFile(fd, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	_, err = fmt.Fprintln(f, note)
	return err == nil
}

var uncacheOnce sync.Once

// uncache changes into the test binary's directory and back, so that the
// go command's test cache, which records the directories a test changed
// into, finds the run's inputs gone next time and runs it again.
func uncache() { uncacheOnce.Do(chdirBinary) }

func chdirBinary() {
	exe, err := os.Executable()
	if err != nil {
		return
	}
	wd, err := os.Getwd()
	if err != nil {
		return
	}
	if os.Chdir(filepath.Dir(exe)) == nil {
		os.Chdir(wd)
	}
}
