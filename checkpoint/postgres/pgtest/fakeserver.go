package pgtest

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// FakeServer is a PostgreSQL server on loopback that speaks just enough of
// the protocol to ask every client for a clear-text password
// (AuthenticationCleartextPassword), record what it sends, and refuse it:
// what a caller who picks the host of a connection would run to collect
// the server's credentials.
type FakeServer struct {
	ln        net.Listener
	mu        sync.Mutex
	conns     int
	passwords []string
	wg        sync.WaitGroup
}

// NewFakeServer starts a FakeServer on a free loopback port, stopped when
// t ends.
func NewFakeServer(t *testing.T) *FakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &FakeServer{ln: ln}
	f.wg.Add(1)
	go f.serve()
	t.Cleanup(func() { ln.Close(); f.wg.Wait() })
	return f
}

// Port is the port it listens on.
func (f *FakeServer) Port() string {
	_, port, _ := net.SplitHostPort(f.ln.Addr().String())
	return port
}

// Seen is how many connections it accepted and the passwords sent.
func (f *FakeServer) Seen() (int, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conns, append([]string(nil), f.passwords...)
}

func (f *FakeServer) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns++
		f.mu.Unlock()
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			f.session(bufio.NewReader(c), c)
		}()
	}
}

const (
	sslRequest    = 80877103
	gssencRequest = 80877104
)

// session answers one connection: SSL and GSS encryption refused, the
// startup message read, a clear-text password asked for and read, then
// refused as a wrong password.
func (f *FakeServer) session(r *bufio.Reader, w io.Writer) {
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[:4])
		code := binary.BigEndian.Uint32(hdr[4:])
		if n < 8 || n > 10000 {
			return
		}
		if _, err := io.CopyN(io.Discard, r, int64(n-8)); err != nil {
			return
		}
		if code == sslRequest || code == gssencRequest {
			w.Write([]byte{'N'})
			continue
		}
		break // the startup message
	}
	// AuthenticationCleartextPassword.
	w.Write([]byte{'R', 0, 0, 0, 8, 0, 0, 0, 3})
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil || hdr[0] != 'p' {
		return
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n < 4 || n > 10000 {
		return
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return
	}
	pw := string(body)
	if len(pw) > 0 && pw[len(pw)-1] == 0 {
		pw = pw[:len(pw)-1]
	}
	f.mu.Lock()
	f.passwords = append(f.passwords, pw)
	f.mu.Unlock()
	msg := []byte{}
	for _, field := range []string{"SFATAL", "VFATAL", "C28P01", "Mpassword authentication failed for user \"stepwise\""} {
		msg = append(msg, field...)
		msg = append(msg, 0)
	}
	msg = append(msg, 0)
	out := []byte{'E', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], uint32(len(msg)+4))
	w.Write(append(out, msg...))
}
