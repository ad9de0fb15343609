package postgres

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stepwise-run/stepwise/checkpoint"
)

// TestWrapErrorCodes maps each SQLSTATE the store knows; authentication
// failures cannot be provoked on a trust-auth test server, so the mapping
// is checked here on the server's own error type.
func TestWrapErrorCodes(t *testing.T) {
	for code, want := range map[string]error{
		"28P01": ErrAuth, "28000": ErrAuth, "3D000": ErrNoDatabase, "42501": ErrPermission,
		"57014": ErrStatementTimeout, "53300": ErrTooManyConnections, "57P03": ErrUnavailable,
		"55P03": checkpoint.ErrLocked,
	} {
		pe := &pgconn.PgError{Severity: "FATAL", Code: code, Message: "the server's words"}
		err := wrapError("server db:5432, database ledger", "open", pe)
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", code, err, want)
		}
		var got *pgconn.PgError
		if !errors.As(err, &got) || got.Code != code {
			t.Errorf("%s: the server's error is not kept in %v", code, err)
		}
		if !strings.Contains(err.Error(), "server db:5432, database ledger") {
			t.Errorf("%s: %q does not name the server and database", code, err)
		}
	}
	if err := wrapError("x", "op", checkpoint.ErrFenced); err != checkpoint.ErrFenced {
		t.Errorf("checkpoint's own errors must pass through unchanged, got %v", err)
	}
}

// TestWrapErrorTransient: a lost or closed connection (class 08, the
// shutdown codes, pgconn's own connection errors), a serialization
// failure and a deadlock match checkpoint.ErrTransient, so the runner
// tries again; refusals an operator must fix (authentication, a missing
// database, a privilege, too many connections) do not.
func TestWrapErrorTransient(t *testing.T) {
	const where = "server db:5432, database ledger"
	for _, code := range []string{"08006", "08003", "08000", "57P01", "57P02", "57P03", "40001", "40P01", "55P03"} {
		err := wrapError(where, "commit", &pgconn.PgError{Severity: "FATAL", Code: code, Message: "the server's words"})
		if !errors.Is(err, checkpoint.ErrTransient) {
			t.Errorf("%s: %v does not match checkpoint.ErrTransient", code, err)
		}
	}
	for _, code := range []string{"28P01", "3D000", "42501", "53300", "23505", "57014"} {
		err := wrapError(where, "commit", &pgconn.PgError{Severity: "ERROR", Code: code, Message: "the server's words"})
		if errors.Is(err, checkpoint.ErrTransient) {
			t.Errorf("%s: %v matches checkpoint.ErrTransient; an operator must fix it", code, err)
		}
	}
	for _, cause := range []error{io.ErrUnexpectedEOF, fmt.Errorf("read: %w", pgconn.ErrConnClosed)} {
		err := wrapError(where, "commit", cause)
		if !errors.Is(err, checkpoint.ErrTransient) || !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), where) {
			t.Errorf("%v: wrapped as %v; want a transient ErrUnavailable naming the server", cause, err)
		}
	}
	err := wrapError(where, "commit", &pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"})
	if !errors.Is(err, ErrConnectionClosed) || !errors.Is(err, ErrUnavailable) || strings.Contains(err.Error(), "server unavailable") ||
		!strings.Contains(err.Error(), "connection closed by the server") || !strings.Contains(err.Error(), "resume") {
		t.Errorf("a terminated session says %q; want what happened and how to resume", err)
	}
}
