package postgres

import (
	"errors"
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
