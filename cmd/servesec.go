package cmd

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/stepwise-run/stepwise/cmd/internal/httpapi"
)

// ServeHTTPFlags are serve's flags of its HTTP server's defences:
// sessions, TLS behind a proxy, the connection cap and the separate
// metrics listener.
type ServeHTTPFlags struct {
	SecureCookies bool          `name:"secure-cookies" help:"The browser reaches the dashboard over HTTPS (a TLS proxy in front): mark the session cookie Secure and name it __Host-stepwise_session, on every request. Without it only a TLS connection or a --trusted-proxy's X-Forwarded-Proto: https does."`
	TrustedProxy  []string      `name:"trusted-proxy" placeholder:"CIDR" help:"The TLS proxy in front, as a CIDR or an IP (repeatable): only from it are X-Forwarded-Proto (https: a Secure cookie) and X-Forwarded-For (the client's address, for the log and the throttle of failed logins) believed."`
	SessionIdle   time.Duration `name:"session-idle" default:"30m" help:"A dashboard session unused this long ends (sessions live in memory: a restart of serve logs everyone out)."`
	SessionMax    time.Duration `name:"session-max" default:"12h" help:"A dashboard session ends this long after its login, however much it is used."`
	MaxConns      int           `name:"max-conns" default:"128" help:"At most this many HTTP connections at once; at the cap the longest-idle one is closed for a new one, so idle keep-alive connections never lock an operator out."`
	MetricsListen string        `name:"metrics-listen" placeholder:"ADDR" help:"Also serve /metrics and /healthz with no token on this loopback address (e.g. 127.0.0.1:9091), for a Prometheus on this machine; with --tokens, --listen's /metrics needs a read token."`
}

// The HTTP server's timeouts. No endpoint streams: every answer is one
// JSON document or page, so one write deadline fits all.
const (
	httpReadHeaderTimeout = 10 * time.Second // the request line and headers
	httpReadTimeout       = 30 * time.Second // the whole request, body included
	httpWriteTimeout      = 60 * time.Second // from the end of the headers to the end of the answer
	httpIdleTimeout       = 60 * time.Second // a keep-alive connection between requests
)

// newHTTPServer is an http.Server for h with serve's timeouts, its
// listener capped at maxConns connections (idle ones closed to make room,
// see httpapi.ConnLimit).
func newHTTPServer(h http.Handler, ln net.Listener, maxConns int) (*http.Server, net.Listener) {
	lim := httpapi.NewConnLimit(maxConns)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: httpReadHeaderTimeout, ReadTimeout: httpReadTimeout,
		WriteTimeout: httpWriteTimeout, IdleTimeout: httpIdleTimeout, ConnState: lim.ConnState, ConnContext: lim.ConnContext}
	return srv, lim.Listener(ln)
}

// trustedProxies parses --trusted-proxy: CIDRs or single addresses.
func trustedProxies(flags []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range flags {
		f = strings.TrimSpace(f)
		p, err := netip.ParsePrefix(f)
		if err != nil {
			ip, err2 := netip.ParseAddr(f)
			if err2 != nil {
				return nil, fmt.Errorf("--trusted-proxy %q is neither a CIDR (10.0.0.0/8) nor an IP address: %w", f, err)
			}
			p = netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// checkServeHTTPFlags refuses serve's HTTP flags that do not fit
// together, naming the flag and what to do.
func (c *ServeCmd) checkServeHTTPFlags() error {
	if err := checkListen(c.Listen, c.Tokens); err != nil {
		return err
	}
	switch {
	case c.MetricsListen != "" && !loopback(c.MetricsListen):
		return fmt.Errorf("--metrics-listen %s is not a loopback address: /metrics there needs no token, so it is for this machine only; "+
			"listen on 127.0.0.1:PORT, or scrape --listen's /metrics with a read token", c.MetricsListen)
	case c.MaxConns < 1:
		return fmt.Errorf("--max-conns %d: give at least 1", c.MaxConns)
	case c.SessionIdle <= 0 || c.SessionMax <= 0:
		return fmt.Errorf("--session-idle (%s) and --session-max (%s) must be above 0", c.SessionIdle, c.SessionMax)
	}
	return nil
}

// checkListen refuses a --listen address other than loopback without
// --tokens: its anonymous reads would be anyone's.
func checkListen(listen, tokens string) error {
	if listen != "" && tokens == "" && !loopback(listen) {
		return fmt.Errorf("--listen %s is not a loopback address, and without --tokens anyone who reaches it could read every run: "+
			"give --tokens FILE (lines NAME:ROLE:TOKEN), or listen on 127.0.0.1", listen)
	}
	return nil
}

// reloadTokens reads the tokens file again and makes api accept its
// tokens: the sessions of removed tokens end at once. A file that cannot
// be read or is refused leaves the tokens as they were. Both are logged.
func reloadTokens(env *Env, path string, api *httpapi.Server) error {
	log := env.Logger()
	if path == "" {
		log.Warn().Msg("SIGHUP: no --tokens file to reload; ignored")
		return nil
	}
	t, err := httpapi.ReadTokens(path)
	if err == nil {
		var r httpapi.Reloaded
		if r, err = api.ReloadTokens(t); err == nil {
			log.Info().Str("file", path).Int("tokens", r.Tokens).Strs("removed", r.Removed).Int("sessions_ended", r.SessionsEnded).
				Msgf("tokens reloaded: %d tokens, %d removed, %d sessions ended", r.Tokens, len(r.Removed), r.SessionsEnded)
			return nil
		}
	}
	log.Error().Err(err).Str("file", path).Msg("tokens not reloaded: the tokens in use are kept")
	return err
}

// onHangup calls reload on every SIGHUP until the returned stop is
// called: serve reloads its tokens instead of dying of the signal.
func onHangup(reload func()) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			select {
			case <-hup:
				reload()
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
		<-ended
	}
}

// serveMetrics serves /metrics (and /healthz) with no token on addr, a
// loopback address (checked before), Host-guarded like a server without
// tokens.
func serveMetrics(env *Env, addr string, metrics, health http.Handler) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("--metrics-listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
	mux.Handle("GET /healthz", health)
	srv, lln := newHTTPServer(httpapi.GuardHost(mux, addr, ln.Addr().String()), ln, 16)
	go func() {
		if err := srv.Serve(lln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(env.Stderr, "%s serve: metrics http: %v\n", env.Name, err)
		}
	}()
	return srv, ln.Addr().String(), nil
}
