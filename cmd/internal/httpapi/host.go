package httpapi

import (
	"fmt"
	"net"
	"net/http"
	"strings"
)

// LoopbackHost reports whether host, a request's Host header (with or
// without a port), names this machine by loopback: localhost, 127.0.0.1
// (any loopback IPv4 address) or [::1].
func LoopbackHost(host string) bool {
	h := host
	if name, _, err := net.SplitHostPort(host); err == nil {
		h = name
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// misdirected is the refusal of a request to a server without tokens whose
// Host is not this machine's loopback.
func misdirected(host string) string {
	return fmt.Sprintf("this server has no tokens, so it answers only requests addressed to localhost, 127.0.0.1 or [::1], not to Host %q "+
		"(a page of another site could otherwise point its name at this machine and read it: DNS rebinding); "+
		"open it as http://127.0.0.1:PORT/, or give the server tokens", host)
}

// GuardHost wraps next, a server without tokens whose reads are
// anonymous: a request whose Host is neither LoopbackHost nor one of
// addrs (the listen addresses, compared whole) is answered 421
// Misdirected Request. A page of any site can point its own name at
// 127.0.0.1 (DNS rebinding) and read, same-origin, whatever an anonymous
// request can; it cannot make the browser send a loopback Host. A server
// with tokens needs no guard: the rebound page has no token, nor the
// session cookie.
func GuardHost(next http.Handler, addrs ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok := LoopbackHost(r.Host)
		for _, a := range addrs {
			ok = ok || strings.EqualFold(r.Host, a)
		}
		if !ok {
			w.Header().Set("Cache-Control", "no-store")
			http.Error(w, misdirected(r.Host), http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}
