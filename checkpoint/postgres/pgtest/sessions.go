package pgtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// SessionsTimeout bounds how long WaitSessionsGone waits.
const SessionsTimeout = 30 * time.Second

// sqlSessions lists the server's sessions, in any database, whose
// application_name is $1, but for the asking session itself.
const sqlSessions = `SELECT pid, datname, state, wait_event_type, wait_event, left(query, 200)
FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`

// WaitSessionsGone waits until the STEPWISE_TEST_PG server has no session
// whose application_name is name, other than the one it asks on, and
// fails t naming the sessions left if that takes longer than
// SessionsTimeout. Without STEPWISE_TEST_PG it returns at once: nothing
// ran on a server.
//
// Call it after SIGKILLing a process (crashtest.Child.SessionName names
// its sessions) and before reading what the process left behind. The
// server runs what a client sent before it died to the end: a COMMIT sent
// just before a SIGKILL commits after it, once its session gets to it
// (behind a lock, or a WAL flush on a busy disk). A read that races that
// session can miss a write that then lands. A session ends only after
// its last statement did, so once none is left, what the store holds is
// all the killed process will ever have written.
func WaitSessionsGone(t testing.TB, name string) {
	t.Helper()
	base := os.Getenv(EnvURL)
	if base == "" {
		return
	}
	conn := connect(t, withParam(t, base, "application_name", "pgtest-sessions"), false)
	defer conn.Close(context.Background())
	deadline := time.Now().Add(SessionsTimeout)
	for {
		left, err := sessions(conn, name)
		if err != nil {
			t.Fatalf("pgtest: list the sessions named %s: %v", name, err)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: %d sessions named %s (a killed process's) still on the server after %s:\n%s",
				len(left), name, SessionsTimeout, strings.Join(left, "\n"))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// sessions describes the sessions named name, one line each.
func sessions(conn *pgx.Conn, name string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := conn.Query(ctx, sqlSessions, name)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
		var (
			pid                                  int32
			db, state, waitType, waitEvent, text *string
		)
		if err := row.Scan(&pid, &db, &state, &waitType, &waitEvent, &text); err != nil {
			return "", err
		}
		return fmt.Sprintf("  pid %d, database %s, %s, waiting on %s/%s: %s",
			pid, str(db), str(state), str(waitType), str(waitEvent), str(text)), nil
	})
}

// str is *s, or "-" for NULL.
func str(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}
