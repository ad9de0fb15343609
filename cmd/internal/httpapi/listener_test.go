package httpapi_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/cmd/internal/httpapi"
)

// serveLimited serves h on loopback behind a ConnLimit of n.
func serveLimited(t *testing.T, n int, h http.Handler) (string, *httpapi.ConnLimit) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := httpapi.NewConnLimit(n)
	srv := &http.Server{Handler: h, ConnState: lim.ConnState, ConnContext: lim.ConnContext, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(lim.Listener(ln))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), lim
}

// getOn sends one keep-alive request on nc and reads its answer, within d.
func getOn(nc net.Conn, addr string, d time.Duration) error {
	nc.SetDeadline(time.Now().Add(d))
	if _, err := fmt.Fprintf(nc, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", addr); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// At the cap, the connection idle longest between requests is closed for
// the new one, before one that has sent nothing yet.
func TestConnLimitClosesTheIdleForTheNew(t *testing.T) {
	addr, lim := serveLimited(t, 2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	idle := dial(t, addr)
	if err := getOn(idle, addr, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// The server marks the connection idle just after its answer is
	// sent: wait for it.
	for deadline := time.Now().Add(5 * time.Second); lim.Idle() != 1; {
		if time.Now().After(deadline) {
			t.Fatal("the answered connection never went idle")
		}
		runtime.Gosched()
	}
	silent := dial(t, addr)
	fresh := dial(t, addr)
	if err := getOn(fresh, addr, time.Second); err != nil {
		t.Fatalf("a new connection at the cap: %v; want it answered", err)
	}
	idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := idle.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the idle connection after a new one at the cap: read %v; want it closed (EOF)", err)
	}
	if err := getOn(silent, addr, 5*time.Second); err != nil {
		t.Errorf("the connection that had sent nothing was closed before the idle one: %v", err)
	}
	if n := lim.Open(); n > 2 {
		t.Errorf("%d connections open; want at most 2", n)
	}
}

// When every connection is busy, a new one waits, and is taken as soon
// as one of them goes idle (not only when one closes: the idle one would
// stay open until its client left).
func TestConnLimitTakesTheNewWhenABusyOneGoesIdle(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	addr, _ := serveLimited(t, 1, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			httpapi.TrustConn(r) // an authenticated caller's request
			close(entered)
			<-release
		}
	}))
	busy := dial(t, addr)
	fmt.Fprintf(busy, "GET /?hold=1 HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
	<-entered
	next := dial(t, addr)
	done := make(chan error, 1)
	go func() { done <- getOn(next, addr, 10*time.Second) }()
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the waiting connection: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the waiting connection was not taken when the busy one went idle")
	}
}

// Connections busy with callers who showed no right token (a body that
// trickles in, a refused request whose body the server drains) are closed
// for a new connection at the cap, the longest busy first: at the cap of
// slow unauthenticated bodies, a fresh request is answered at once.
func TestConnLimitClosesSlowUnauthenticatedForTheNew(t *testing.T) {
	const n = 8
	addr, lim := serveLimited(t, n, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // reads the body before any auth, as login does
	}))
	slow := make([]net.Conn, n)
	for i := range slow {
		slow[i] = dial(t, addr)
		fmt.Fprintf(slow[i], "POST /login HTTP/1.1\r\nHost: %s\r\nContent-Length: 100000\r\n\r\n{\"tok", addr)
	}
	for deadline := time.Now().Add(5 * time.Second); lim.Open() < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d slow connections open", lim.Open(), n)
		}
		runtime.Gosched()
	}
	time.Sleep(50 * time.Millisecond) // let the server read their headers: they are busy now
	fresh := dial(t, addr)
	if err := getOn(fresh, addr, time.Second); err != nil {
		t.Fatalf("a fresh request at the cap of slow unauthenticated bodies: %v; want it answered within a second", err)
	}
}
