package httpapi

import (
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
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
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
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxBody == 0 {
		c.MaxBody = 64 << 10
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
	cfg    Config
	mux    *http.ServeMux
	secret []byte // keys the CSRF tokens of cookie sessions
	cross  *http.CrossOriginProtection
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), secret: make([]byte, 32), cross: http.NewCrossOriginProtection()}
	if _, err := rand.Read(s.secret); err != nil {
		return nil, fmt.Errorf("httpapi: a CSRF key: %w", err)
	}
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
	s.mux.ServeHTTP(w, r)
}

func (s *Server) routes() {
	s.mux.HandleFunc("POST /api/v1/login", s.login)
	s.mux.HandleFunc("POST /api/v1/logout", s.logout)
	s.mux.Handle("GET /api/v1/session", s.auth(RoleRead, s.session))
	s.mux.Handle("GET /api/v1/runs", s.auth(RoleRead, s.listRuns))
	s.mux.Handle("POST /api/v1/runs", s.auth(RoleOperate, s.createRun))
	s.mux.Handle("GET /api/v1/runs/{rest...}", s.auth(RoleRead, s.runGet))
	s.mux.Handle("POST /api/v1/runs/{rest...}", s.auth(RoleOperate, s.runPost))
	s.mux.Handle("GET /api/v1/schedules", s.auth(RoleRead, s.schedules))
	s.mux.Handle("GET /api/v1/outbox", s.auth(RoleRead, s.listOutbox))
	s.mux.Handle("POST /api/v1/outbox/requeue", s.auth(RoleOperate, s.requeueOutbox))
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

// CookieName is the cookie login sets: the session's token, HttpOnly,
// SameSite=Strict.
const CookieName = "stepwise_session"

// CSRFHeader is the header a cookie-authenticated write must carry: the
// csrf_token login and GET /api/v1/session return.
const CSRFHeader = "X-CSRF-Token"

// csrfToken is the CSRF token of a session token: an HMAC under the
// server's key, so it cannot be made without the server and changes with
// the session.
func (s *Server) csrfToken(token string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(token))
	return hex.EncodeToString(m.Sum(nil))
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
		if s.cfg.Tokens.Len() == 0 {
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
		token, fromCookie := "", false
		if h := r.Header.Get("Authorization"); h != "" {
			scheme, t, _ := strings.Cut(h, " ")
			if !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(t) == "" {
				w.Header().Set("WWW-Authenticate", `Bearer realm="stepwise"`)
				s.fail(w, r, &apiError{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: "the Authorization header is not \"Bearer TOKEN\""})
				return
			}
			token = strings.TrimSpace(t)
		} else if c, err := r.Cookie(CookieName); err == nil && c.Value != "" {
			token, fromCookie = c.Value, true
		}
		if token == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="stepwise"`)
			s.fail(w, r, &apiError{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: "no token: send Authorization: Bearer TOKEN, or log in"})
			return
		}
		id, ok := s.cfg.Tokens.Lookup(token)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="stepwise", error="invalid_token"`)
			s.fail(w, r, &apiError{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: "the token is not one this server accepts"})
			return
		}
		if !id.Role.allows(need) {
			s.fail(w, r, &apiError{Status: http.StatusForbidden, Code: "forbidden",
				Message: fmt.Sprintf("token %s has role %s; this needs role %s", id.Name, id.Role, need)})
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), identityKey{}, id))
		if fromCookie && r.Method != http.MethodGet && r.Method != http.MethodHead {
			got := r.Header.Get(CSRFHeader)
			if subtle.ConstantTimeCompare([]byte(got), []byte(s.csrfToken(token))) != 1 {
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
	id, ok := s.cfg.Tokens.Lookup(b.Token)
	if !ok {
		s.fail(w, r, &apiError{Status: http.StatusUnauthorized, Code: "unauthenticated", Field: "token", Message: "the token is not one this server accepts"})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: b.Token, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	s.cfg.Logger.Info().Str("request_id", RequestID(r)).Str("token", id.Name).Msg("api login")
	writeJSON(w, http.StatusOK, SessionView{Identity: id, CSRFToken: s.csrfToken(b.Token)})
}

// logout clears the session cookie. With a session cookie it is a cookie
// write like the others: it needs the CSRF header and a same-origin
// request, so that another site cannot log the browser out.
func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(CookieName); err == nil && c.Value != "" {
		if _, ok := s.cfg.Tokens.Lookup(c.Value); ok {
			if subtle.ConstantTimeCompare([]byte(r.Header.Get(CSRFHeader)), []byte(s.csrfToken(c.Value))) != 1 {
				s.fail(w, r, &apiError{Status: http.StatusForbidden, Code: "csrf",
					Message: "logging out with the session cookie needs the " + CSRFHeader + " header that login returned"})
				return
			}
			if err := s.cross.Check(r); err != nil {
				s.fail(w, r, &apiError{Status: http.StatusForbidden, Code: "cross_origin", Message: "cross-origin logout refused"})
				return
			}
		}
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) session(w http.ResponseWriter, r *http.Request) {
	id, ok := Caller(r)
	if !ok {
		writeJSON(w, http.StatusOK, SessionView{Identity: Identity{Name: "anonymous", Role: RoleRead}})
		return
	}
	v := SessionView{Identity: id}
	if c, err := r.Cookie(CookieName); err == nil && r.Header.Get("Authorization") == "" {
		v.CSRFToken = s.csrfToken(c.Value)
	}
	writeJSON(w, http.StatusOK, v)
}

// decode reads a JSON body into v: unknown fields, trailing data and
// bodies over MaxBody are refused, naming what is wrong.
func (s *Server) decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("data after the JSON object")
	}
	if err == nil {
		return nil
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

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
