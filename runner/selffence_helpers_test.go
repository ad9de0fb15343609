package runner_test

import (
	"io"
	"net"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"
)

// sleepClock is a fake runner.Clock whose After fires only when the test
// moves the clock past its wake-up time (wakeNext), so the heartbeat runs
// on the test's time with no real sleeps.
type sleepClock struct {
	mu       sync.Mutex
	now      time.Time
	seq      int // Sleep calls so far
	woken    int // seq of the latest sleeper woken
	sleepers []*sleeper
}

type sleeper struct {
	seq  int
	at   time.Time
	wake chan time.Time // buffered: the wake-up never blocks
}

func newSleepClock(start time.Time) *sleepClock { return &sleepClock{now: start} }

// Now returns the fake time.
func (c *sleepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After returns a channel that receives once the clock reaches now+d.
func (c *sleepClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	s := &sleeper{seq: c.seq, at: c.now.Add(d), wake: make(chan time.Time, 1)}
	c.sleepers = append(c.sleepers, s)
	c.setLocked(c.now) // wakes it at once if d <= 0
	return s.wake
}

// Advance moves the clock by d, waking the sleepers due by then.
func (c *sleepClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLocked(c.now.Add(d))
}

func (c *sleepClock) setLocked(now time.Time) {
	if now.After(c.now) {
		c.now = now
	}
	c.sleepers = slices.DeleteFunc(c.sleepers, func(s *sleeper) bool {
		if s.at.After(c.now) {
			return false
		}
		c.woken = max(c.woken, s.seq)
		s.wake <- c.now
		return true
	})
}

// waitSleeper waits (in real time, up to 10s) until a goroutine sleeps that
// began after the last one woken, and returns its wake-up time; ok is false
// if done is closed first.
func (c *sleepClock) waitSleeper(t *testing.T, done <-chan struct{}) (at time.Time, ok bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		var next *sleeper
		fresh := false
		for _, s := range c.sleepers {
			fresh = fresh || s.seq > c.woken
			if next == nil || s.at.Before(next.at) {
				next = s
			}
		}
		c.mu.Unlock()
		if fresh {
			return next.at, true
		}
		select {
		case <-done:
			return time.Time{}, false
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("sleepClock: no goroutine went to sleep within 10s (fake time %s)", c.Now())
		}
	}
}

// wakeNext waits for the next sleeper (see waitSleeper), moves the clock to
// the earliest wake-up time and wakes every sleeper due then. It returns
// the new time; ok is false if done is closed first.
func (c *sleepClock) wakeNext(t *testing.T, done <-chan struct{}) (now time.Time, ok bool) {
	t.Helper()
	at, ok := c.waitSleeper(t, done)
	if !ok {
		return time.Time{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLocked(at)
	return c.now, true
}

// tcpProxy forwards connections from a listener on 127.0.0.1 to a real
// server (the test PostgreSQL), and can cut them all and refuse new ones:
// the database made unreachable under a live client, without touching the
// shared server.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// startProxy listens on a free port of 127.0.0.1 and forwards to target
// (host:port) until the test ends.
func startProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: listen: %v", err)
	}
	p := &tcpProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's host:port.
func (p *tcpProxy) Addr() string { return p.ln.Addr().String() }

// ProxyURL returns rawURL (a postgres:// URL) with its host and port
// replaced by the proxy's.
func (p *tcpProxy) ProxyURL(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("proxy: parse URL: %v", err)
	}
	u.Host = p.Addr()
	return u.String()
}

// Cut closes every forwarded connection, and makes the proxy close new
// ones as soon as it accepts them, until Restore.
func (p *tcpProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// Restore makes the proxy forward new connections again.
func (p *tcpProxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

func (p *tcpProxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed at cleanup
		}
		p.wg.Go(func() { p.forward(client) })
	}
}

// track registers c unless the proxy is cut, in which case it closes c.
func (p *tcpProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *tcpProxy) forward(client net.Conn) {
	if !p.track(client) {
		return
	}
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(server) {
		client.Close()
		return
	}
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src) // ends when either side closes, or at a cut
		dst.Close()
		src.Close()
	}
	wg.Go(func() { pipe(server, client) })
	wg.Go(func() { pipe(client, server) })
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
}
