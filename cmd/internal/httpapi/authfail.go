package httpapi

import (
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The default throttle of failed authentication (see Config.AuthFailures
// and Config.AuthWindow): 10 failures per client address a minute.
const (
	DefaultAuthFailures = 10
	DefaultAuthWindow   = time.Minute
)

// Why an authentication failed, as the log and the
// stepwise_http_auth_failures_total metric name it (with the session
// reasons of sessions.go).
const (
	reasonUnknownToken = "unknown_token"
	reasonBadHeader    = "bad_header"
	reasonThrottled    = "throttled"
)

// throttle counts failed authentications per client address in fixed
// windows: once an address has failed max times in its window, every
// authentication it tries is refused (429) until the window ends, right
// or wrong, so that guessing goes no faster. IPv6 addresses count per /64
// (one host usually holds a whole /64).
type throttle struct {
	mu     sync.Mutex
	max    int
	window time.Duration
	now    func() time.Time
	m      map[string]*failWindow
}

type failWindow struct {
	start time.Time
	n     int
}

// maxThrottled bounds the addresses remembered; past it, windows that
// ended are swept.
const maxThrottled = 10000

func newThrottle(max int, window time.Duration, now func() time.Time) *throttle {
	return &throttle{max: max, window: window, now: now, m: map[string]*failWindow{}}
}

// blocked reports whether addr has used up its failures, and when it may
// try again.
func (t *throttle) blocked(addr string) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	w, ok := t.m[throttleKey(addr)]
	if !ok {
		return 0, false
	}
	left := w.start.Add(t.window).Sub(t.now())
	if left <= 0 {
		delete(t.m, throttleKey(addr))
		return 0, false
	}
	return left, w.n >= t.max
}

// fail counts a failed authentication of addr.
func (t *throttle) fail(addr string) {
	k := throttleKey(addr)
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	w, ok := t.m[k]
	if !ok || now.Sub(w.start) >= t.window {
		if len(t.m) >= maxThrottled {
			for k, w := range t.m {
				if now.Sub(w.start) >= t.window {
					delete(t.m, k)
				}
			}
		}
		w = &failWindow{start: now}
		t.m[k] = w
	}
	w.n++
}

func throttleKey(addr string) string {
	ip, err := netip.ParseAddr(addr)
	if err != nil || ip.Is4() || ip.Is4In6() {
		return addr
	}
	p, _ := ip.Prefix(64)
	return p.String()
}

// authMetrics counts failed authentications by reason.
type authMetrics struct {
	failures *prometheus.CounterVec
}

func newAuthMetrics(reg prometheus.Registerer) (*authMetrics, error) {
	m := &authMetrics{failures: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "stepwise_http_auth_failures_total",
		Help: "Failed authentications of the HTTP API and dashboard, by reason (unknown_token, bad_header, unknown_session, expired_session, token_removed, throttled).",
	}, []string{"reason"})}
	if reg != nil {
		if err := reg.Register(m.failures); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// clientAddr is the address a request comes from: its peer's IP, or, when
// the peer is a trusted proxy, the last address that proxy put in
// X-Forwarded-For.
func (s *Server) clientAddr(r *http.Request) string {
	peer := peerIP(r)
	if !s.trusted(peer) {
		return peer.String()
	}
	xff := r.Header.Values("X-Forwarded-For")
	if len(xff) == 0 {
		return peer.String()
	}
	parts := strings.Split(xff[len(xff)-1], ",")
	if ip, err := netip.ParseAddr(strings.TrimSpace(parts[len(parts)-1])); err == nil {
		return ip.Unmap().String()
	}
	return peer.String()
}

func peerIP(r *http.Request) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, _ := netip.ParseAddr(host)
	return ip.Unmap()
}

// trusted reports whether ip is one of Config.TrustedProxies.
func (s *Server) trusted(ip netip.Addr) bool {
	for _, p := range s.cfg.TrustedProxies {
		if ip.IsValid() && p.Contains(ip) {
			return true
		}
	}
	return false
}

// secure reports whether the browser reached the server over TLS: the
// operator said so (SecureCookies), the connection is TLS, or a trusted
// proxy says X-Forwarded-Proto: https.
func (s *Server) secure(r *http.Request) bool {
	return s.cfg.SecureCookies || r.TLS != nil ||
		(s.trusted(peerIP(r)) && strings.EqualFold(strings.TrimSpace(r.Header.Get("X-Forwarded-Proto")), "https"))
}

// cookieName is the session cookie's name for r: with the __Host- prefix
// over TLS, so that the browser keeps it Secure, for this host only, on
// every path.
func (s *Server) cookieName(r *http.Request) string {
	if s.secure(r) {
		return SecureCookieName
	}
	return CookieName
}

// throttled answers 429 when the client has used up its failures; false
// when the request may go on.
func (s *Server) throttled(w http.ResponseWriter, r *http.Request) bool {
	client := s.clientAddr(r)
	left, blocked := s.throttle.blocked(client)
	if !blocked {
		return false
	}
	s.metrics.failures.WithLabelValues(reasonThrottled).Inc()
	s.cfg.Logger.Warn().Str("request_id", RequestID(r)).Str("remote", client).Str("reason", reasonThrottled).
		Str("path", r.URL.Path).Msg("authentication refused: too many failures from this address")
	secs := int(left/time.Second) + 1
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	s.fail(w, r, &apiError{Status: http.StatusTooManyRequests, Code: "throttled",
		Message: "too many failed authentications from " + client + "; try again in " + strconv.Itoa(secs) + "s"})
	return true
}

// authFailed logs and counts a failed authentication: the client's
// address, why, and the token's name when known; never the token. A wrong
// token counts toward the client's throttle; a dead session cookie does
// not (its ID cannot be guessed, and after a restart every open tab
// brings one).
func (s *Server) authFailed(r *http.Request, reason, name string) {
	client := s.clientAddr(r)
	if reason == reasonUnknownToken || reason == reasonBadHeader {
		s.throttle.fail(client)
	}
	s.metrics.failures.WithLabelValues(reason).Inc()
	ev := s.cfg.Logger.Warn().Str("request_id", RequestID(r)).Str("remote", client).Str("reason", reason).Str("path", r.URL.Path)
	if name != "" {
		ev = ev.Str("token", name)
	}
	ev.Msg("authentication failed")
}
