package cmd

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// TestWorkerWaitsForItsStoreToAnswer: a worker started while its
// PostgreSQL server is down (here: nothing listens on the port) keeps
// trying, saying so, instead of exiting for an operator to start it again;
// stopped, it ends.
func TestWorkerWaitsForItsStoreToAnswer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // a port nothing listens on: connections are refused
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	var out, errb syncBuffer
	start := time.Now()
	code := Execute(ctx, opsRegistry(), []string{"--db", "postgres://postgres@" + addr + "/x?connect_timeout=1", "worker"}, &out, &errb)
	if took := time.Since(start); took < time.Second {
		t.Fatalf("the worker gave up after %s (exit %d); want it to keep trying until stopped\n%s", took, code, errb.String())
	}
	if n := strings.Count(errb.String(), "does not answer yet; trying again"); n < 2 {
		t.Errorf("the worker said it was trying again %d times; want at least 2\n%s", n, errb.String())
	}
}
