package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"
)

// TestReadPoolIsBounded checks that the read pool never opens more than
// readPoolSize connections: with every reader busy, one more read waits for
// a connection instead of opening its own. Each SQLite connection keeps its
// own page cache and parsed schema, so an unbounded pool grows a process's
// memory with every concurrent read.
func TestReadPoolIsBounded(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, Config{Path: filepath.Join(t.TempDir(), "pool.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	held := make([]*sql.Rows, 0, readPoolSize)
	for range readPoolSize {
		rows, err := s.rdb.QueryContext(ctx, "SELECT 1 UNION ALL SELECT 2")
		if err != nil {
			t.Fatal(err)
		}
		if !rows.Next() { // the statement stays open: its connection is busy
			t.Fatalf("no row: %v", rows.Err())
		}
		held = append(held, rows)
	}
	if n := s.rdb.Stats().OpenConnections; n != readPoolSize {
		t.Fatalf("%d read connections open with %d reads running; want %d", n, readPoolSize, readPoolSize)
	}
	done := make(chan error, 1)
	go func() {
		var one int
		done <- s.rdb.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	}()
	for waited := false; !waited; {
		select {
		case err := <-done:
			t.Fatalf("a read beyond the pool's %d connections did not wait (err %v, %d open)",
				readPoolSize, err, s.rdb.Stats().OpenConnections)
		case <-time.After(time.Millisecond):
			waited = s.rdb.Stats().WaitCount > 0
		}
	}
	held[0].Close()
	if err := <-done; err != nil {
		t.Fatalf("the waiting read: %v", err)
	}
	for _, rows := range held[1:] {
		rows.Close()
	}
	if st := s.rdb.Stats(); st.MaxOpenConnections != readPoolSize || st.OpenConnections > readPoolSize {
		t.Errorf("read pool: %d open, at most %d; want at most %d", st.OpenConnections, st.MaxOpenConnections, readPoolSize)
	}
}
