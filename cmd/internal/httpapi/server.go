package httpapi

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// Config configures a Server.
type Config struct {
	// Store is the checkpoint store the API reads and operates on.
	// Required.
	Store checkpoint.Backend
	// Jobs are the jobs runs may be started of. Required.
	Jobs *jobs.Registry
	// Starter starts and resumes the runs the API accepts. Required (see
	// Local).
	Starter Starter
	// Targets are what a start's resource parameters (a file or a
	// database: jobs.IsResourceFormat) may name: a request gives a
	// target's name, never a path or URL (jobs.RequestValues), and the
	// run stores "target:NAME". The Starter's runner resolves it with
	// the same names (runner.Config.Targets). Nil configures none.
	Targets *jobs.Targets
	// Tokens are the bearer tokens accepted. Nil or empty: every request
	// is anonymous and only reads are served (writes are 401), and only
	// to a request whose Host is localhost or a loopback IP (else 421;
	// see GuardHost).
	Tokens *Tokens
	// Schedules lists the schedules GET /api/v1/schedules shows; nil
	// shows none.
	Schedules func() ([]runner.Schedule, error)
	// MisfireThreshold is how late a fire may be and still count as on
	// time, as serve's --misfire-threshold: GET /api/v1/schedules lists
	// later unsettled fires as missed. Defaults to 1m.
	MisfireThreshold time.Duration
	// Logger receives one line per unexpected error (with its request
	// id) and per write. Defaults to zerolog.Nop().
	Logger zerolog.Logger
	// Now is the clock of listings and the audit trail. Defaults to
	// time.Now.
	Now func() time.Time
	// MaxBody bounds request bodies, in bytes (413 beyond). Defaults to
	// 64 KiB.
	MaxBody int64
	// AcceptTimeout is how long an Idempotency-Key's first request may
	// take to be accepted before another request with the key takes it
	// over (its process died). Defaults to 1m.
	AcceptTimeout time.Duration
	// NoTokensHint is added to the refusal of a write on a server without
	// tokens: how to give it some. Defaults to "the server needs a tokens file".
	NoTokensHint string
	// SessionIdle ends a dashboard session unused for this long; SessionMax
	// ends one this long after its login, used or not. Default to
	// DefaultSessionIdle (30m) and DefaultSessionMax (12h). Sessions live
	// in memory: a restart logs everyone out.
	SessionIdle, SessionMax time.Duration
	// SecureCookies marks the session cookie Secure, named with the
	// __Host- prefix, on every request: the browser reaches the server
	// over TLS (a proxy in front). Without it only a TLS connection or a
	// trusted proxy's X-Forwarded-Proto: https does.
	SecureCookies bool
	// TrustedProxies are the peers whose X-Forwarded-Proto and
	// X-Forwarded-For are believed (the TLS proxy in front); from any
	// other peer those headers are ignored.
	TrustedProxies []netip.Prefix
	// AuthFailures failed authentications per client address within
	// AuthWindow are allowed; beyond them every authentication from that
	// address is 429 until the window ends. Default to
	// DefaultAuthFailures (10) and DefaultAuthWindow (1m).
	AuthFailures int
	AuthWindow   time.Duration
	// Registerer, if set, receives stepwise_http_auth_failures_total.
	Registerer prometheus.Registerer
}

func (c *Config) validate() error {
	switch {
	case c.Store == nil:
		return errors.New("httpapi: Config.Store is nil; give the checkpoint store")
	case c.Jobs == nil:
		return errors.New("httpapi: Config.Jobs is nil; give the job registry")
	case c.Starter == nil:
		return errors.New("httpapi: Config.Starter is nil; give one (NewLocal executes runs in this process)")
	case c.MaxBody < 0 || c.AcceptTimeout < 0:
		return fmt.Errorf("httpapi: Config.MaxBody (%d) and Config.AcceptTimeout (%s) cannot be negative", c.MaxBody, c.AcceptTimeout)
	case c.SessionIdle < 0 || c.SessionMax < 0 || c.AuthFailures < 0 || c.AuthWindow < 0:
		return fmt.Errorf("httpapi: Config.SessionIdle (%s), SessionMax (%s), AuthFailures (%d) and AuthWindow (%s) cannot be negative",
			c.SessionIdle, c.SessionMax, c.AuthFailures, c.AuthWindow)
	}
	if c.SessionIdle == 0 {
		c.SessionIdle = DefaultSessionIdle
	}
	if c.SessionMax == 0 {
		c.SessionMax = DefaultSessionMax
	}
	if c.AuthFailures == 0 {
		c.AuthFailures = DefaultAuthFailures
	}
	if c.AuthWindow == 0 {
		c.AuthWindow = DefaultAuthWindow
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxBody == 0 {
		c.MaxBody = 64 << 10
	}
	if c.MisfireThreshold <= 0 {
		c.MisfireThreshold = time.Minute
	}
	if c.AcceptTimeout == 0 {
		c.AcceptTimeout = time.Minute
	}
	if c.NoTokensHint == "" {
		c.NoTokensHint = "the server needs a tokens file"
	}
	return nil
}

// Server serves the API. It is an http.Handler for the paths under
// /api/v1/.
type Server struct {
	cfg      Config
	mux      *http.ServeMux
	secret   []byte // keys the CSRF tokens of cookie sessions
	cross    *http.CrossOriginProtection
	open     bool                   // started without tokens: anonymous reads
	tokens   atomic.Pointer[Tokens] // the tokens accepted now (ReloadTokens)
	sessions *sessions              // the dashboard's logins
	throttle *throttle              // failed authentications per address
	metrics  *authMetrics
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), secret: make([]byte, 32), cross: http.NewCrossOriginProtection(),
		open: cfg.Tokens.Len() == 0, sessions: newSessions(cfg.SessionIdle, cfg.SessionMax, cfg.Now),
		throttle: newThrottle(cfg.AuthFailures, cfg.AuthWindow, cfg.Now)}
	s.tokens.Store(cfg.Tokens)
	if _, err := rand.Read(s.secret); err != nil {
		return nil, fmt.Errorf("httpapi: a CSRF key: %w", err)
	}
	m, err := newAuthMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("httpapi: the auth failures metric: %w", err)
	}
	s.metrics = m
	s.cross.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, &apiError{Status: http.StatusForbidden, Code: "cross_origin",
			Message: "cross-origin request refused: a browser may write only from the server's own pages"})
	}))
	s.routes()
	return s, nil
}

// Prefix is the path under which the API is served.
const Prefix = "/api/v1/"

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := newRequestID()
	w.Header().Set("X-Request-Id", id)
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	r = r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id))
	if r.Body != nil {
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBody)
	}
	if err := ops.CheckURL(r.URL); err != nil { // before any store reads them
		s.fail(w, r, err)
		return
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) routes() {
	s.mux.HandleFunc("POST /api/v1/login", s.takes(s.login))
	s.mux.HandleFunc("POST /api/v1/logout", s.takes(s.logout))
	s.mux.Handle("GET /api/v1/session", s.auth(RoleRead, s.takes(s.session)))
	s.mux.Handle("GET /api/v1/runs", s.auth(RoleRead, s.takes(s.listRuns, "job", "status", "key_prefix", "since", "until", "limit", "cursor")))
	s.mux.Handle("POST /api/v1/runs", s.auth(RoleOperate, s.takes(s.createRun)))
	s.mux.Handle("GET /api/v1/runs/{rest...}", s.auth(RoleRead, s.runGet))
	s.mux.Handle("POST /api/v1/runs/{rest...}", s.auth(RoleOperate, s.takes(s.runPost)))
	s.mux.Handle("GET /api/v1/schedules", s.auth(RoleRead, s.takes(s.schedules, "next", "from")))
	s.mux.Handle("POST /api/v1/schedules/{name}/{verb}", s.auth(RoleOperate, s.takes(s.schedulePost)))
	s.mux.Handle("GET /api/v1/jobs/{job}/history", s.auth(RoleRead, s.takes(s.jobHistory, "limit")))
	s.mux.Handle("GET /api/v1/outbox", s.auth(RoleRead, s.takes(s.listOutbox, "status", "run", "limit")))
	s.mux.Handle("POST /api/v1/outbox/requeue", s.auth(RoleOperate, s.takes(s.requeueOutbox)))
	s.mux.HandleFunc("/api/v1/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, &apiError{Status: http.StatusNotFound, Code: "not_found", Message: "no such endpoint: " + r.Method + " " + r.URL.Path})
	})
}

type requestIDKey struct{}
type identityKey struct{}

func newRequestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// RequestID is the id the server gave the request (also in the
// X-Request-Id header and in every error body).
func RequestID(r *http.Request) string {
	id, _ := r.Context().Value(requestIDKey{}).(string)
	return id
}

// Caller is who the request comes from, as the auth middleware found it;
// false for an anonymous request.
func Caller(r *http.Request) (Identity, bool) {
	id, ok := r.Context().Value(identityKey{}).(Identity)
	return id, ok
}

// CookieName is the cookie login sets over plain HTTP: a random session
// ID (never the token), HttpOnly, SameSite=Strict, Path=/.
const CookieName = "stepwise_session"

// SecureCookieName is the session cookie's name over TLS (see
// Config.SecureCookies): Secure, and the __Host- prefix makes the browser
// refuse it unless Secure, for this host only, on Path=/.
const SecureCookieName = "__Host-" + CookieName

// CSRFHeader is the header a cookie-authenticated write must carry: the
// csrf_token login and GET /api/v1/session return.
const CSRFHeader = "X-CSRF-Token"

// csrfToken is the CSRF token of a session: an HMAC of its ID under the
// server's key, so it cannot be made without the server and changes with
// the session.
func (s *Server) csrfToken(sessionID string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(sessionID))
	return hex.EncodeToString(m.Sum(nil))
}

// HasTokens reports whether the server was started with tokens (else its
// reads are anonymous, on loopback only).
func (s *Server) HasTokens() bool { return !s.open }

// Reloaded is what ReloadTokens did.
type Reloaded struct {
	// Tokens is how many tokens are accepted now.
	Tokens int
	// Removed are the names of the tokens no longer accepted (a token
	// whose value changed counts as removed).
	Removed []string
	// SessionsEnded is how many sessions of removed tokens ended.
	SessionsEnded int
}

// ReloadTokens makes tokens the ones accepted from now on, and ends at
// once every session whose token is not among them. A server started
// without tokens stays without (its reads are anonymous and its Host
// guarded): ErrBadTokens.
func (s *Server) ReloadTokens(tokens *Tokens) (Reloaded, error) {
	if s.open {
		return Reloaded{}, fmt.Errorf("%w: this server was started without tokens; restart it with them", ErrBadTokens)
	}
	if tokens.Len() == 0 {
		return Reloaded{}, fmt.Errorf("%w: no token in it; add a line NAME:ROLE:TOKEN", ErrBadTokens)
	}
	old := s.tokens.Swap(tokens)
	r := Reloaded{Tokens: tokens.Len(), SessionsEnded: s.sessions.prune(tokens)}
	for _, t := range old.tokens {
		if _, ok := tokens.Lookup(t.Value); !ok {
			r.Removed = append(r.Removed, t.Name)
		}
	}
	return r, nil
}

// Auth wraps next (for a handler beside the API, e.g. a dashboard page)
// in the API's authentication: a bearer token or the session cookie of
// at least role need; cookie writes checked against CSRF.
func (s *Server) Auth(need Role, next http.Handler) http.Handler {
	return s.auth(need, next.ServeHTTP)
}

func (s *Server) auth(need Role, next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		write := need == RoleOperate
		if s.open {
			// Anonymous reads are for this machine only: never to a Host
			// another site could have pointed at it (DNS rebinding).
			if !LoopbackHost(r.Host) {
				s.fail(w, r, &apiError{Status: http.StatusMisdirectedRequest, Code: "misdirected", Message: misdirected(r.Host)})
				return
			}
			if write {
				s.fail(w, r, &apiError{Status: http.StatusUnauthorized, Code: "unauthenticated",
					Message: "this server takes no writes: it was started without tokens, so nobody can be identified for the audit trail; " + s.cfg.NoTokensHint})
				return
			}
			next(w, r)
			return
		}
		id, sessionID, ok := s.identify(w, r)
		if !ok {
			return
		}
		if !id.Role.allows(need) {
			s.fail(w, r, &apiError{Status: http.StatusForbidden, Code: "forbidden",
				Message: fmt.Sprintf("token %s has role %s; this needs role %s", id.Name, id.Role, need)})
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), identityKey{}, id))
		if sessionID != "" && r.Method != http.MethodGet && r.Method != http.MethodHead {
			got := r.Header.Get(CSRFHeader)
			if subtle.ConstantTimeCompare([]byte(got), []byte(s.csrfToken(sessionID))) != 1 {
				s.fail(w, r, &apiError{Status: http.StatusForbidden, Code: "csrf",
					Message: "a write with the session cookie needs the " + CSRFHeader + " header that login returned"})
				return
			}
			s.cross.Handler(next).ServeHTTP(w, r)
			return
		}
		next(w, r)
	})
}

// identify finds who a request on a server with tokens comes from: its
// bearer token, or its session cookie (then also the session's ID). A
// request without either, or with a wrong one, is answered (401; 429 once
// its address failed too often) and false returned; a failure is logged,
// counted and throttled. A right token is never throttled: tokens are too
// long to guess, and refusing the right one would let anyone sharing an
// address (a NAT, a proxy) lock the operators out.
func (s *Server) identify(w http.ResponseWriter, r *http.Request) (Identity, string, bool) {
	h := r.Header.Get("Authorization")
	c, _ := r.Cookie(s.cookieName(r))
	if h == "" && (c == nil || c.Value == "") {
		w.Header().Set("WWW-Authenticate", `Bearer realm="stepwise"`)
		s.fail(w, r, &apiError{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: "no token: send Authorization: Bearer TOKEN, or log in"})
		return Identity{}, "", false
	}
	if h != "" {
		scheme, t, _ := strings.Cut(h, " ")
		if !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(t) == "" {
			if s.throttled(w, r) {
				return Identity{}, "", false
			}
			s.authFailed(r, reasonBadHeader, "")
			w.Header().Set("WWW-Authenticate", `Bearer realm="stepwise"`)
			s.fail(w, r, &apiError{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: "the Authorization header is not \"Bearer TOKEN\""})
			return Identity{}, "", false
		}
		id, ok := s.tokens.Load().Lookup(strings.TrimSpace(t))
		if !ok {
			if s.throttled(w, r) {
				return Identity{}, "", false
			}
			s.authFailed(r, reasonUnknownToken, "")
			w.Header().Set("WWW-Authenticate", `Bearer realm="stepwise", error="invalid_token"`)
			s.fail(w, r, &apiError{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: "the token is not one this server accepts"})
			return Identity{}, "", false
		}
		TrustConn(r)
		return id, "", true
	}
	id, name, reason := s.sessions.use(c.Value, s.tokens.Load())
	if reason != "" {
		s.authFailed(r, reason, name)
		// The browser forgets the dead session, so its next request is
		// plainly logged out (and not counted again).
		s.clearCookie(w, r)
		w.Header().Set("WWW-Authenticate", `Bearer realm="stepwise"`)
		s.fail(w, r, &apiError{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: sessionEnded[reason]})
		return Identity{}, "", false
	}
	TrustConn(r)
	return id, c.Value, true
}

// sessionEnded is what a refused session cookie is told, by reason.
var sessionEnded = map[string]string{
	reasonNoSession:    "the session is not one this server holds (sessions end when the server restarts): log in again",
	reasonExpired:      "the session expired: log in again",
	reasonTokenRemoved: "the session's token was removed from the server's tokens file: log in with another",
}

// setCookie sets the session cookie of r's scheme: __Host- and Secure
// over TLS.
func (s *Server) setCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: s.cookieName(r), Value: value, Path: "/", MaxAge: maxAge, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: s.secure(r)})
}

func (s *Server) clearCookie(w http.ResponseWriter, r *http.Request) { s.setCookie(w, r, "", -1) }

// loginBody is the body of POST /api/v1/login.
type loginBody struct {
	Token string `json:"token"`
}

// SessionView is what login and GET /api/v1/session answer.
type SessionView struct {
	Identity
	// CSRFToken goes in the X-CSRF-Token header of every write made with
	// the session cookie (absent for bearer-token requests).
	CSRFToken string `json:"csrf_token,omitempty"`
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	// Login sets a cookie: from another site it would log the browser in
	// as the attacker (login CSRF).
	if err := s.cross.Check(r); err != nil {
		s.fail(w, r, &apiError{Status: http.StatusForbidden, Code: "cross_origin", Message: "cross-origin login refused"})
		return
	}
	var b loginBody
	if err := s.decode(r, &b); err != nil {
		s.fail(w, r, err)
		return
	}
	tokens := s.tokens.Load()
	id, ok := tokens.Lookup(b.Token)
	if !ok {
		if s.throttled(w, r) {
			return
		}
		if !s.open {
			s.authFailed(r, reasonUnknownToken, "")
		}
		s.fail(w, r, &apiError{Status: http.StatusUnauthorized, Code: "unauthenticated", Field: "token", Message: "the token is not one this server accepts"})
		return
	}
	TrustConn(r)
	sid, err := s.sessions.open(sha256.Sum256([]byte(b.Token)), id.Name)
	if err != nil {
		s.fail(w, r, fmt.Errorf("httpapi: a session ID: %w", err))
		return
	}
	s.setCookie(w, r, sid, 0)
	s.cfg.Logger.Info().Str("request_id", RequestID(r)).Str("token", id.Name).Str("remote", s.clientAddr(r)).Msg("api login")
	writeJSON(w, http.StatusOK, SessionView{Identity: id, CSRFToken: s.csrfToken(sid)})
}

// logout ends the session and clears its cookie. With a live session
// cookie it is a cookie write like the others: it needs the CSRF header
// and a same-origin request, so that another site cannot log the browser
// out.
func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(s.cookieName(r)); err == nil && c.Value != "" {
		if id, _, reason := s.sessions.use(c.Value, s.tokens.Load()); reason == "" {
			if subtle.ConstantTimeCompare([]byte(r.Header.Get(CSRFHeader)), []byte(s.csrfToken(c.Value))) != 1 {
				s.fail(w, r, &apiError{Status: http.StatusForbidden, Code: "csrf",
					Message: "logging out with the session cookie needs the " + CSRFHeader + " header that login returned"})
				return
			}
			if err := s.cross.Check(r); err != nil {
				s.fail(w, r, &apiError{Status: http.StatusForbidden, Code: "cross_origin", Message: "cross-origin logout refused"})
				return
			}
			s.sessions.end(c.Value)
			s.cfg.Logger.Info().Str("request_id", RequestID(r)).Str("token", id.Name).Str("remote", s.clientAddr(r)).Msg("api logout")
		}
	}
	s.clearCookie(w, r)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) session(w http.ResponseWriter, r *http.Request) {
	id, ok := Caller(r)
	if !ok {
		writeJSON(w, http.StatusOK, SessionView{Identity: Identity{Name: "anonymous", Role: RoleRead}})
		return
	}
	v := SessionView{Identity: id}
	if c, err := r.Cookie(s.cookieName(r)); err == nil && r.Header.Get("Authorization") == "" {
		v.CSRFToken = s.csrfToken(c.Value)
	}
	writeJSON(w, http.StatusOK, v)
}

// decode reads a JSON body into v: unknown fields, trailing data and
// bodies over MaxBody are refused, naming what is wrong.
func (s *Server) decode(r *http.Request, v any) error {
	var raw bytes.Buffer // every text field is checked in the bytes sent
	dec := json.NewDecoder(io.TeeReader(r.Body, &raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("data after the JSON object")
	}
	if err == nil {
		return ops.CheckJSON(raw.Bytes())
	}
	var (
		tooBig *http.MaxBytesError
		syntax *json.SyntaxError
		typ    *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &tooBig):
		return &apiError{Status: http.StatusRequestEntityTooLarge, Code: "too_large",
			Message: fmt.Sprintf("the request body is over %d bytes", tooBig.Limit)}
	case errors.As(err, &syntax):
		return &apiError{Status: http.StatusBadRequest, Code: "bad_json", Message: fmt.Sprintf("the body is not JSON: %v (at byte %d)", err, syntax.Offset)}
	case errors.As(err, &typ):
		return &apiError{Status: http.StatusBadRequest, Code: "bad_json", Field: typ.Field,
			Message: fmt.Sprintf("field %q is a JSON %s; it must be a %s", typ.Field, typ.Value, jsonKind(typ.Type.Kind().String()))}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		f := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return &apiError{Status: http.StatusBadRequest, Code: "bad_json", Field: f, Message: fmt.Sprintf("unknown field %q", f)}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &apiError{Status: http.StatusBadRequest, Code: "bad_json", Message: "the body is not JSON: it ends in the middle of a value"}
	case errors.Is(err, io.EOF):
		return &apiError{Status: http.StatusBadRequest, Code: "bad_json", Message: "the body is empty; it must be a JSON object"}
	case errors.Is(err, context.Canceled):
		return err
	}
	return &apiError{Status: http.StatusBadRequest, Code: "bad_json", Message: "the body is not one JSON object: " + err.Error()}
}

func jsonKind(k string) string {
	switch k {
	case "map", "struct":
		return "object"
	case "slice":
		return "array"
	case "int", "int64", "int32", "uint", "uint64", "float64":
		return "number"
	}
	return k
}

// writeJSON answers v as JSON. It is encoded before the status is sent, so
// a value that cannot be (a time past year 9999) is a 500 with a JSON body,
// never a 200 with an empty one.
func writeJSON(w http.ResponseWriter, status int, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		b.Reset()
		status = http.StatusInternalServerError
		fmt.Fprintf(&b, "{\n  \"error\": %q,\n  \"code\": \"internal\"\n}\n", "internal error: the answer could not be written as JSON")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}
