package jobs

import (
	"errors"
	"strings"
	"testing"
)

// A run's error names a PostgreSQL target by its name, never its host,
// port, user or database, however the store and the driver spelled them.
func TestTargetErrorsShowNoServer(t *testing.T) {
	r := resolved{names: []string{"pg"}, locs: []string{"postgres://anyone@127.0.0.1:15434/x"}}
	err := r.wrap(errors.New("effect target postgres://anyone@127.0.0.1:15434/x:accounts: postgres: server unavailable: " +
		"server 127.0.0.1:15434, database x (connect): failed to connect to `user=anyone database=x`: 127.0.0.1:15434 (127.0.0.1): tls error"))
	got := err.Error()
	for _, leak := range []string{"15434", "anyone", "database=x", "database x", "127.0.0.1"} {
		if strings.Contains(got, leak) {
			t.Errorf("the error shows %q: %s", leak, got)
		}
	}
	if !strings.Contains(got, `target "pg"`) {
		t.Errorf("the error does not name the target: %s", got)
	}
}
