package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stepwise-run/stepwise/checkpoint"
)

// Sentinel errors of a PostgreSQL store, for failures that have no
// SQLite counterpart in checkpoint. Match them with errors.Is; each also
// matches checkpoint's backend-neutral kind of the same name
// (checkpoint.ErrUnavailable, ...; ErrBadURL matches
// checkpoint.ErrBadLocation), so callers need not import this package to
// tell them apart. Every error names the server and the database, never the
// password.
var (
	// ErrUnavailable: the server cannot be reached (down, refusing
	// connections, starting up or shutting down) or the connection was
	// lost. Nothing of the failed operation was kept, except that a lost
	// commit may have committed: a rerun finds out from the checkpoints.
	ErrUnavailable error = &kind{"postgres: server unavailable", checkpoint.ErrUnavailable}
	// ErrAuth: the server refused the credentials.
	ErrAuth error = &kind{"postgres: authentication failed", checkpoint.ErrAuth}
	// ErrNoDatabase: the server has no database of the URL's name.
	ErrNoDatabase error = &kind{"postgres: database does not exist", checkpoint.ErrNoDatabase}
	// ErrPermission: the role lacks a privilege the store needs (to
	// connect, to create the schema's tables, or to read or write them).
	ErrPermission error = &kind{"postgres: permission denied", checkpoint.ErrPermission}
	// ErrStatementTimeout: a statement ran longer than the configured
	// statement timeout and was cancelled; its transaction was rolled back.
	ErrStatementTimeout error = &kind{"postgres: statement timeout", checkpoint.ErrStatementTimeout}
	// ErrTooManyConnections: the server (or the role, or the database)
	// has reached its connection limit.
	ErrTooManyConnections error = &kind{"postgres: too many connections", checkpoint.ErrTooManyConnections}
	// ErrConnectionClosed: the server ended the session (an
	// administrator's pg_terminate_backend, a shutdown, a crash) or the
	// connection broke under a statement. It also matches ErrUnavailable
	// and checkpoint.ErrTransient: the step or chunk is tried again.
	ErrConnectionClosed = errors.New("postgres: connection closed by the server")
	// ErrAborted: the server aborted the transaction to break a
	// deadlock or a serialization failure. Nothing of it was kept; it
	// matches checkpoint.ErrTransient, so it is tried again.
	ErrAborted = errors.New("postgres: transaction aborted (deadlock or serialization failure)")
	// ErrBadURL: the database URL does not parse, or names settings pgx
	// refuses (an unknown sslmode, say). Nothing was connected to.
	ErrBadURL error = &kind{"postgres: bad database URL", checkpoint.ErrBadLocation}
)

// kind is a sentinel of this package that also matches checkpoint's
// backend-neutral kind of the same failure.
type kind struct {
	msg     string
	neutral error
}

func (k *kind) Error() string { return k.msg }

// Unwrap returns checkpoint's kind, so errors.Is matches it too.
func (k *kind) Unwrap() error { return k.neutral }

// SQLSTATE codes the store maps.
const (
	codeInvalidPassword       = "28P01"
	codeInvalidAuthorization  = "28000"
	codeInvalidCatalogName    = "3D000"
	codeInsufficientPrivilege = "42501"
	codeQueryCanceled         = "57014"
	codeLockNotAvailable      = "55P03"
	codeTooManyConnections    = "53300"
	codeAdminShutdown         = "57P01"
	codeCrashShutdown         = "57P02"
	codeCannotConnectNow      = "57P03"
	codeInvalidSchemaName     = "3F000"
	codeUndefinedTable        = "42P01"
	codeUndefinedColumn       = "42703"
	codeUniqueViolation       = "23505"
	codeSerialization         = "40001"
	codeDeadlock              = "40P01"
	classConnection           = "08"
)

// Error is a store error the server or the network caused: what kind it
// is (one of the sentinels above, or checkpoint's), where (server and
// database), what the store was doing, and the cause in a few words. It
// matches its kind and its cause (a *pgconn.PgError, a net error) with
// errors.Is and errors.As.
type Error struct {
	Kind   error  // ErrUnavailable, ErrAuth, ...
	Where  string // "server HOST:PORT, database NAME"
	Op     string // what the store was doing, e.g. "claim run settle/2026-11-28"
	Detail string // the server's message, or the network error
	Hint   string // what to do about it
	Err    error  // the driver's error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%v: %s (%s): %s; %s", e.Kind, e.Where, e.Op, e.Detail, e.Hint)
}

// Unwrap returns the kind and the driver's error. A kind of this package
// also matches checkpoint's (an ErrNoDatabase matches
// checkpoint.ErrNoDatabase, as a missing SQLite file does), so callers can
// tell what failed without knowing the backend.
func (e *Error) Unwrap() []error {
	switch e.Kind {
	case ErrConnectionClosed:
		return []error{e.Kind, ErrUnavailable, checkpoint.ErrTransient, e.Err}
	case ErrUnavailable, ErrAborted, checkpoint.ErrLocked:
		return []error{e.Kind, checkpoint.ErrTransient, e.Err}
	}
	return []error{e.Kind, e.Err}
}

// Hints of the transient kinds: what happened and what becomes of it.
const (
	hintClosed = "the server closed the connection (an administrator ended the session, or the server is shutting down); " +
		"the step or chunk is tried again under the job's retry policy, and a run that still fails is resumed with `stepwise resume RUN-ID`"
	hintAborted = "nothing of the transaction was kept; it is tried again under the job's retry policy"
	hintLost    = "the connection to the server was lost; the step or chunk is tried again under the job's retry policy " +
		"once the server answers, and a run that still fails is resumed with `stepwise resume RUN-ID`"
)

// wrapError turns a driver error into an *Error of one of the package's
// sentinels (or checkpoint's, where one means the same), naming where (the
// server and database) and what the store was doing. Errors of checkpoint
// (fencing, conflicts, mismatches) and the caller's own pass through
// unchanged.
func wrapError(where, op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("postgres: %s on %s: %w", op, where, err)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		var kind error
		hint := ""
		switch pe.Code {
		case codeInvalidPassword, codeInvalidAuthorization:
			kind, hint = ErrAuth, "check the user and password in the URL (or the server's pg_hba.conf)"
		case codeInvalidCatalogName:
			kind, hint = ErrNoDatabase, "create it (CREATE DATABASE) or name an existing one"
		case codeInsufficientPrivilege:
			kind, hint = ErrPermission, "grant the role the privilege or connect as a role that has it"
		case codeQueryCanceled:
			kind, hint = ErrStatementTimeout, "nothing of this write was kept; retry, or raise the statement timeout"
		case codeLockNotAvailable:
			kind, hint = checkpoint.ErrLocked, "another session holds a lock it needs; retry when it is done"
		case codeTooManyConnections:
			kind, hint = ErrTooManyConnections, "lower the pool size of the runners or raise the server's max_connections"
		case codeAdminShutdown, codeCrashShutdown:
			kind, hint = ErrConnectionClosed, hintClosed
		case codeCannotConnectNow:
			kind, hint = ErrUnavailable, "the server is starting up or shutting down; retry when it is up"
		case codeSerialization, codeDeadlock:
			kind, hint = ErrAborted, hintAborted
		case codeInvalidSchemaName:
			kind, hint = ErrNoDatabase, "no schema of the URL's search_path exists that this role may use: create it, grant USAGE on it, or fix the URL"
		default:
			if strings.HasPrefix(pe.Code, classConnection) {
				kind, hint = ErrUnavailable, hintLost
			}
		}
		if kind != nil {
			return &Error{Kind: kind, Where: where, Op: op, Detail: pe.Message, Hint: hint, Err: err}
		}
		return fmt.Errorf("postgres: %s on %s: %w", op, where, err)
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	if errors.As(err, &ce) || errors.As(err, &ne) {
		detail := err.Error()
		var oe *net.OpError
		if errors.As(err, &oe) {
			detail = oe.Error()
		}
		return &Error{Kind: ErrUnavailable, Where: where, Op: op, Detail: detail,
			Hint: "check the server is running and accepts connections at that address", Err: err}
	}
	if connectionLost(err) {
		return &Error{Kind: ErrConnectionClosed, Where: where, Op: op, Detail: "connection lost: " + err.Error(), Hint: hintLost, Err: err}
	}
	return err
}

// connectionLost reports whether err is pgconn's own word that the
// connection broke under a statement or was closed before it: a read cut
// off mid-answer, a closed connection, or an error pgconn says happened
// before anything was sent (pgconn.SafeToRetry).
func connectionLost(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, pgconn.ErrConnClosed) ||
		pgconn.SafeToRetry(err)
}
