// Package checkpointtest opens real checkpoint stores for tests: a SQLite
// file in the test's temporary directory, closed when the test ends.
package checkpointtest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
)

// Open returns a fresh SQLite store in t.TempDir(), closed at cleanup.
func Open(t testing.TB) *sqlite.Store {
	t.Helper()
	return OpenPath(t, filepath.Join(t.TempDir(), "stepwise.db"))
}

// OpenPath opens the store at path, closed at cleanup.
func OpenPath(t testing.TB, path string) *sqlite.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), sqlite.Config{Path: path})
	if err != nil {
		t.Fatalf("open checkpoint store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}
