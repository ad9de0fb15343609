package checkpoint

import "errors"

// Backend-neutral kinds of the failures of a store's database server: a
// backend's own errors of these kinds match them with errors.Is (as a
// missing database of either backend matches ErrNoDatabase), so a caller
// tells what to fix without importing the backend. SQLite, which has no
// server, returns none of them.
var (
	// ErrUnavailable: the server cannot be reached (down, refusing
	// connections, starting up or shutting down) or the connection was lost.
	ErrUnavailable = errors.New("checkpoint: database server unavailable")
	// ErrAuth: the server refused the credentials.
	ErrAuth = errors.New("checkpoint: authentication failed")
	// ErrPermission: the role lacks a privilege the store needs.
	ErrPermission = errors.New("checkpoint: permission denied")
	// ErrStatementTimeout: a statement ran past the configured statement
	// timeout and was cancelled; its transaction was rolled back.
	ErrStatementTimeout = errors.New("checkpoint: statement timeout")
	// ErrTooManyConnections: the server has reached its connection limit.
	ErrTooManyConnections = errors.New("checkpoint: too many connections")
	// ErrBadLocation: the store's location (a database URL) does not parse
	// or names settings the backend refuses. Nothing was connected to.
	ErrBadLocation = errors.New("checkpoint: bad store location")
)
