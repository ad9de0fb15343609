package web

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
)

//go:embed assets
var assets embed.FS

// Config configures a Handler.
type Config struct {
	// Store is the checkpoint store the pages read. Required.
	Store checkpoint.Backend
	// Auth guards the pages (see Auth). Nil: every page is open to read,
	// as the API is on a server without tokens.
	Auth Auth
	// API is the path of the HTTP API the pages' scripts call to log in,
	// to fetch the session's CSRF token and to operate on runs. Defaults
	// to "/api/v1/".
	API string
	// Schedules lists the schedules the schedules page shows; nil shows
	// none.
	Schedules func() ([]runner.Schedule, error)
	// MisfireThreshold is how late a fire may be and still count as on
	// time, as serve's --misfire-threshold; later unsettled fires are
	// shown as missed. Defaults to 1m.
	MisfireThreshold time.Duration
	// Refresh is how often the runs list and a running run's page refresh
	// themselves. Defaults to 2s.
	Refresh time.Duration
	// Location is the zone times are shown in. Defaults to time.Local.
	Location *time.Location
	// Logger receives one line per page that failed to render. Defaults
	// to zerolog.Nop().
	Logger zerolog.Logger
	// Now is the clock the pages judge staleness and progress by.
	// Defaults to time.Now.
	Now func() time.Time
}

func (c *Config) validate() error {
	switch {
	case c.Store == nil:
		return errors.New("web: Config.Store is nil; give the checkpoint store")
	case c.MisfireThreshold < 0 || c.Refresh < 0:
		return fmt.Errorf("web: Config.MisfireThreshold (%s) and Config.Refresh (%s) cannot be negative", c.MisfireThreshold, c.Refresh)
	case c.API != "" && (!strings.HasPrefix(c.API, "/") || !strings.HasSuffix(c.API, "/")):
		return fmt.Errorf("web: Config.API is %q; want a path that starts and ends with /, such as /api/v1/", c.API)
	}
	if c.API == "" {
		c.API = "/api/v1/"
	}
	if c.MisfireThreshold == 0 {
		c.MisfireThreshold = time.Minute
	}
	if c.Refresh == 0 {
		c.Refresh = 2 * time.Second
	}
	if c.Location == nil {
		c.Location = time.Local
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Auth is the authentication the pages sit behind: the HTTP API's, so a
// browser logs in once with an API token (the API's login sets its
// session cookie) and the pages and the API's writes see the same caller.
// httpapi.Server provides both halves (its Auth middleware with the read
// role, and httpapi.Caller).
type Auth interface {
	// Require wraps a page so only a caller allowed to read reaches it,
	// and answers any other request itself: 401 when it brought no
	// credential or a wrong one (the dashboard then sends the browser to
	// its login page), 403 when it may not read.
	Require(next http.Handler) http.Handler
	// Caller says who a request that passed Require comes from; false
	// for an anonymous one (a server without tokens).
	Caller(r *http.Request) (Caller, bool)
}

// Caller is who a page is shown to.
type Caller struct {
	// Name is the caller's token name, as the audit trail records it.
	Name string
	// CanOperate says whether the caller may operate on runs.
	CanOperate bool
}

// Handler serves the dashboard. It is an http.Handler for every path but
// the API's: mount it at "/".
type Handler struct {
	cfg   Config
	mux   *http.ServeMux
	pages map[string]*template.Template
}

// New returns a Handler for cfg.
func New(cfg Config) (*Handler, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux(), pages: map[string]*template.Template{}}
	for _, name := range []string{"runs", "run", "job", "schedules", "login", "error"} {
		t, err := template.New("layout.html").Funcs(h.funcs()).ParseFS(assets, "assets/templates/layout.html", "assets/templates/partials.html", "assets/templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("web: page %s: %w", name, err)
		}
		h.pages[name] = t
	}
	static, err := fs.Sub(assets, "assets/static")
	if err != nil {
		return nil, err
	}
	files := http.StripPrefix("/static/", http.FileServerFS(static))
	h.mux.Handle("GET /static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Embedded files have no modification time: revalidate each load
		// so a new binary's assets are never served from an old cache.
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	}))
	h.mux.HandleFunc("GET /login", h.login)
	h.mux.HandleFunc("POST /login", h.login)
	h.mux.Handle("GET /{$}", h.guard(h.runs))
	h.mux.Handle("GET /runs/{id...}", h.guard(h.run))
	h.mux.Handle("GET /jobs/{name}", h.guard(h.job))
	h.mux.Handle("GET /schedules", h.guard(h.schedules))
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, http.StatusNotFound, "No such page", "There is no page at "+r.URL.Path+".", nil)
	})
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	// Everything the pages load comes from this server: no inline script
	// or style, no framing, forms and fetches only to this origin.
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("X-Frame-Options", "DENY")
	h.mux.ServeHTTP(w, r)
}

// reachedKey marks, in a guarded request's context, whether Auth let it
// through to the page.
type reachedKey struct{}

// guard puts a page behind Auth. A 401 that Auth answers before the page
// is reached becomes a redirect to the login page, which returns here.
func (h *Handler) guard(page func(http.ResponseWriter, *http.Request, Caller, bool)) http.Handler {
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p, ok := r.Context().Value(reachedKey{}).(*bool); ok {
			*p = true
		}
		if err := ops.CheckURL(r.URL); err != nil { // a NUL would reach the store's queries
			h.fail(w, r, http.StatusBadRequest, "Bad request", err.Error(), nil)
			return
		}
		var who Caller
		ok := false
		if h.cfg.Auth != nil {
			who, ok = h.cfg.Auth.Caller(r)
		}
		page(w, r, who, ok)
	})
	if h.cfg.Auth == nil {
		return inner
	}
	guarded := h.cfg.Auth.Require(inner)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached := new(bool)
		r = r.WithContext(context.WithValue(r.Context(), reachedKey{}, reached))
		guarded.ServeHTTP(&loginRedirect{ResponseWriter: w, r: r, reached: reached}, r)
	})
}

// loginRedirect turns Auth's 401 into a redirect to the login page, and
// any other refusal of Auth into an error page.
type loginRedirect struct {
	http.ResponseWriter
	r        *http.Request
	reached  *bool
	swallow  bool
	answered bool
}

func (l *loginRedirect) WriteHeader(code int) {
	if l.answered {
		return
	}
	l.answered = true
	if !*l.reached && code == http.StatusUnauthorized {
		l.swallow = true
		next := l.r.URL.RequestURI()
		l.Header().Del("Content-Type")
		l.Header().Set("Location", "/login?next="+url.QueryEscape(next))
		l.ResponseWriter.WriteHeader(http.StatusSeeOther)
		return
	}
	l.ResponseWriter.WriteHeader(code)
}

func (l *loginRedirect) Write(b []byte) (int, error) {
	if !l.answered {
		l.WriteHeader(http.StatusOK)
	}
	if l.swallow {
		return len(b), nil
	}
	return l.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the real writer.
func (l *loginRedirect) Unwrap() http.ResponseWriter { return l.ResponseWriter }

// common is what every page's layout shows.
type common struct {
	Title   string
	Nav     string // runs, schedules
	API     string
	Caller  Caller
	Known   bool // Caller came from a token
	Refresh int  // milliseconds; 0: the page does not refresh itself
	Now     time.Time
}

func (h *Handler) common(title, nav string, who Caller, known bool) common {
	return common{Title: title, Nav: nav, API: h.cfg.API, Caller: who, Known: known, Now: h.cfg.Now()}
}

// render writes page name with data, or an error page if it fails.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	var b bytes.Buffer
	if err := h.pages[name].Execute(&b, data); err != nil {
		h.cfg.Logger.Error().Err(err).Str("page", name).Str("path", r.URL.Path).Msg("dashboard page failed")
		http.Error(w, "the page could not be rendered; the server's log has why", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// errorPage is the data of the error page.
type errorPage struct {
	common
	Heading, Message string
}

// fail answers an error page. An unexpected err (one the page cannot
// explain) is logged and shown only as "see the server's log": store
// errors may name the database.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, status int, heading, message string, err error) {
	if err != nil {
		h.cfg.Logger.Error().Err(err).Str("path", r.URL.Path).Msg("dashboard page failed")
	}
	h.render(w, r, status, "error", errorPage{common: h.common(heading, "", Caller{}, false), Heading: heading, Message: message})
}

// login shows the login page; its script posts the token to the API. A
// form posted here came from a browser without the script: the token is
// not looked at (nor echoed), and the page says what is missing.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	problem := ""
	if r.Method == http.MethodPost {
		problem = "Logging in needs JavaScript: the page hands the token to the API, which sets the session cookie. Enable JavaScript for this site and try again."
	}
	next := localPath(r.URL.Query().Get("next"))
	h.render(w, r, http.StatusOK, "login", struct {
		common
		Next, Problem string
	}{h.common("Log in", "", Caller{}, false), next, problem})
}

// localPath is next if it is a path on this server, else "/": never an
// open redirect. Browsers drop tabs and newlines from a URL and read a
// backslash as a slash (WHATWG URL), so "/\t/evil.example" would go to
// another site: control characters and backslashes are refused, and what
// is left must parse with no scheme, user or host and start with exactly
// one "/". The login page's script (app.js, localPath) checks the same.
func localPath(next string) string {
	if strings.ContainsFunc(next, func(c rune) bool { return c < 0x20 || c == 0x7f || c == '\\' }) ||
		!strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") {
		return "/"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" {
		return "/"
	}
	return next
}
