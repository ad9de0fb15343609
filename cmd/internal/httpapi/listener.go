package httpapi

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// ConnLimit caps the connections an http.Server holds at once, without
// letting idle ones lock a new caller out. A plain cap (netutil's
// LimitListener) stops accepting at the cap: a client that opens that many
// keep-alive connections, or connections that never send a request, shuts
// the operators out until the idle timeout. ConnLimit instead, when a
// connection arrives at the cap, closes the connection that has waited
// longest without a request in flight (idle between requests first, then
// one that has sent nothing yet), else the one busy longest with a request
// from a caller who has not shown a right token (a body trickling in, a
// refused request whose body is drained), and takes the new one; only
// when every connection is busy serving an authenticated caller
// (TrustConn) does it wait for one to end. So neither idle nor slow
// connections from anyone without a token can lock the operators out.
//
// Wrap the listener with Listener and set the server's ConnState to
// ConnState and its ConnContext to ConnContext.
type ConnLimit struct {
	max   int
	now   func() time.Time
	mu    sync.Mutex
	freed *sync.Cond
	conns map[net.Conn]*connInfo // by the conn Listener returned
}

type connInfo struct {
	state   http.ConnState
	since   time.Time
	trusted bool // a request on it showed a right token (TrustConn)
}

// NewConnLimit returns a limit of n connections (at least 1).
func NewConnLimit(n int) *ConnLimit {
	l := &ConnLimit{max: max(n, 1), now: time.Now, conns: map[net.Conn]*connInfo{}}
	l.freed = sync.NewCond(&l.mu)
	return l
}

// Listener wraps ln: its Accept keeps at most the limit's connections
// open.
func (l *ConnLimit) Listener(ln net.Listener) net.Listener { return &limitListener{Listener: ln, l: l} }

// ConnState is the http.Server's ConnState hook: it tells the limit which
// connections are idle.
func (l *ConnLimit) ConnState(c net.Conn, st http.ConnState) {
	l.mu.Lock()
	if ci, ok := l.conns[c]; ok && st != http.StateClosed {
		ci.state, ci.since = st, l.now()
	}
	l.mu.Unlock()
	if st == http.StateIdle {
		// An Accept waiting because every connection was busy can now
		// close this one.
		l.freed.Signal()
	}
}

// connKey is the context key of a request's connection (ConnContext).
type connKey struct{}

// ConnContext is the http.Server's ConnContext hook: it lets TrustConn
// find a request's connection.
func (l *ConnLimit) ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// TrustConn marks the connection r came on as an authenticated caller's:
// busy, it is not closed for a new connection. A request on a server
// without a ConnLimit is left alone.
func TrustConn(r *http.Request) {
	c, ok := r.Context().Value(connKey{}).(*limitConn)
	if !ok {
		return
	}
	c.l.mu.Lock()
	if ci := c.l.conns[c]; ci != nil {
		ci.trusted = true
	}
	c.l.mu.Unlock()
}

// Open is how many connections are open now.
func (l *ConnLimit) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// Idle is how many open connections are idle between requests.
func (l *ConnLimit) Idle() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ci := range l.conns {
		if ci.state == http.StateIdle {
			n++
		}
	}
	return n
}

// admit makes room for c, closing an idle connection or waiting for one
// to end, and counts c in.
func (l *ConnLimit) admit(c net.Conn) {
	l.mu.Lock()
	for len(l.conns) >= l.max {
		victim := l.victim()
		if victim == nil {
			l.freed.Wait()
			continue
		}
		delete(l.conns, victim)
		l.mu.Unlock()
		victim.(*limitConn).Conn.Close()
		l.mu.Lock()
	}
	l.conns[c] = &connInfo{state: http.StateNew, since: l.now()}
	l.mu.Unlock()
}

// victim is the connection to close for a new one: the longest idle
// between requests, else the longest open without a request, else the
// longest busy with a caller not known to hold a right token; nil when
// all are busy with authenticated callers.
func (l *ConnLimit) victim() net.Conn {
	var best net.Conn
	var bestInfo *connInfo
	rank := func(ci *connInfo) int {
		switch {
		case ci.state == http.StateIdle:
			return 3
		case ci.state == http.StateNew:
			return 2
		case !ci.trusted:
			return 1
		}
		return 0
	}
	for c, ci := range l.conns {
		r := rank(ci)
		if r == 0 {
			continue
		}
		if best == nil || r > rank(bestInfo) || (r == rank(bestInfo) && ci.since.Before(bestInfo.since)) {
			best, bestInfo = c, ci
		}
	}
	return best
}

func (l *ConnLimit) release(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	l.freed.Signal()
}

type limitListener struct {
	net.Listener
	l *ConnLimit
}

func (ll *limitListener) Accept() (net.Conn, error) {
	c, err := ll.Listener.Accept()
	if err != nil {
		return nil, err
	}
	lc := &limitConn{Conn: c, l: ll.l}
	ll.l.admit(lc)
	return lc, nil
}

type limitConn struct {
	net.Conn
	l    *ConnLimit
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}
