package postgres

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

// roundTrips counts what a connection sends: each Query, QueryRow or
// Exec and each batch is one round trip.
type roundTrips struct {
	n atomic.Int64
	// stmts counts statements: each Query, QueryRow or Exec, and each
	// statement of a batch.
	stmts atomic.Int64
	mu    sync.Mutex
	sql   []string // every statement's SQL, when recording
}

func (r *roundTrips) record(sql string) {
	r.mu.Lock()
	r.sql = append(r.sql, sql)
	r.mu.Unlock()
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	r.stmts.Add(1)
	r.record(d.SQL)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.stmts.Add(1)
	r.record(d.SQL)
}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// A same-store chunk (read and lock its keys, compare-and-set them, record
// its items, commit) costs two round trips, whatever its size: BEGIN,
// the fence lock, the key locks and the read go in one batch; the
// compare-and-set, the items and COMMIT in the other.
func TestSameStoreChunkRoundTrips(t *testing.T) {
	ctx := context.Background()
	s, rt, c := tracedStore(t)
	chunk := func(n, size int) int64 {
		t.Helper()
		before := rt.n.Load()
		err := s.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
			v, err := tx.Target(checkpoint.StateTable)
			if err != nil {
				return err
			}
			keys := make([]string, size)
			for i := range keys {
				keys[i] = "acct:" + strconv.Itoa(i)
			}
			cur, err := v.Read(ctx, keys)
			if err != nil {
				return err
			}
			var ws []checkpoint.Write
			var items []checkpoint.Item
			for i, k := range keys {
				st := cur[k]
				// Half the keys exist after the first chunk, half are new each time.
				if i%2 == 1 {
					k = k + "/" + strconv.Itoa(n)
					st = checkpoint.State{}
				}
				ws = append(ws, checkpoint.Write{Key: k, OldVersion: st.Version, NewValue: st.Value + 1, Insert: !st.Exists})
				items = append(items, checkpoint.Item{Step: "post", Key: k + "#" + strconv.Itoa(n), Status: checkpoint.StepCompleted, Output: []byte(`{}`), Chunk: strconv.Itoa(n)})
			}
			if err := v.Write(ctx, ws); err != nil {
				return err
			}
			return tx.PutItems(items)
		})
		if err != nil {
			t.Fatalf("chunk %d: %v", n, err)
		}
		return rt.n.Load() - before
	}
	chunk(0, 10) // the first chunk inserts the even keys
	for n, size := range []int{10, 100, 1000} {
		if got := chunk(n+1, size); got != 2 {
			t.Errorf("a chunk of %d keys took %d round trips; want 2", size, got)
		}
	}
}

// tracedStore opens a store of one connection in a new schema, counting
// its round trips, and claims a run.
func tracedStore(t *testing.T) (*Store, *roundTrips, checkpoint.Claim) {
	t.Helper()
	ctx := context.Background()
	cfg := Config{URL: pgtest.Schema(t), CallerClock: true, MaxConns: 1}
	pc, err := cfg.poolConfig()
	if err != nil {
		t.Fatal(err)
	}
	rt := &roundTrips{}
	pc.ConnConfig.Tracer = rt
	s := &Store{cfg: cfg, where: describe(pc), rdb: openReader(pc)}
	if s.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.migrate(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	c, err := s.Claim(ctx, checkpoint.ClaimRequest{RunID: "rt/1", Job: "rt", RunKey: "1", Params: []byte(`{}`), ParamsHash: "h",
		Owner: "test:1", Now: now, LeaseFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return s, rt, c
}

// A transaction of writes that need no result (a lone step checkpoint,
// a checkpoint with its outbox message, a batch step's reset and start)
// costs one round trip: one batch outside BEGIN/COMMIT, the fence check
// ahead of the writes (a lone step checkpoint: one statement, see
// TestLoneStepIsOneStatement). (The tracer counts batches and queries; pgx's
// preparation of a statement new to the connection is not counted.) A write after a read goes through an explicit
// transaction (BEGIN, the fence check and the read in one batch; the
// write with COMMIT).
func TestLoneWriteRoundTrips(t *testing.T) {
	ctx := context.Background()
	s, rt, c := tracedStore(t)
	now := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	put := func(tx checkpoint.Tx, id string) error {
		return tx.PutStep(checkpoint.Step{ID: id, Status: checkpoint.StepCompleted, Output: []byte(`{}`), StartedAt: now, FinishedAt: now})
	}
	for _, tc := range []struct {
		name string
		want int64
		fn   func(tx checkpoint.Tx) error
	}{
		{"a lone PutStep", 1, func(tx checkpoint.Tx) error { return put(tx, "do/1") }},
		{"a PutStep and its message", 1, func(tx checkpoint.Tx) error {
			if err := put(tx, "notify/1"); err != nil {
				return err
			}
			return tx.Enqueue(checkpoint.Message{Key: "rt/1/notify/1", Topic: "t", Payload: []byte(`{}`), CreatedAt: now})
		}},
		{"a ResetStep and a PutStep", 1, func(tx checkpoint.Tx) error {
			if err := tx.ResetStep("do/1"); err != nil {
				return err
			}
			return put(tx, "do/1")
		}},
		{"a lone PutItems", 1, func(tx checkpoint.Tx) error {
			return tx.PutItems([]checkpoint.Item{{Step: "post", Key: "k1", Status: checkpoint.StepCompleted, Output: []byte(`{}`)}})
		}},
		// The rare case: the batch is refused and rolled back, and the
		// write made again in an explicit transaction (BEGIN, the fence
		// check and the write; the recorded step read; COMMIT).
		{"a PutStep of a step finished with the same content", 4, func(tx checkpoint.Tx) error { return put(tx, "do/1") }},
		{"a read, then a PutStep", 2, func(tx checkpoint.Tx) error {
			v, err := tx.Target(checkpoint.StateTable)
			if err != nil {
				return err
			}
			if _, err := v.Read(ctx, []string{"k"}); err != nil {
				return err
			}
			return put(tx, "apply/1")
		}},
		// An effect step: the read, then the compare-and-set and the
		// checkpoint with COMMIT.
		{"a read, a write and a PutStep", 2, func(tx checkpoint.Tx) error {
			v, err := tx.Target(checkpoint.StateTable)
			if err != nil {
				return err
			}
			cur, err := v.Read(ctx, []string{"e"})
			if err != nil {
				return err
			}
			s := cur["e"]
			if err := v.Write(ctx, []checkpoint.Write{{Key: "e", OldVersion: s.Version, NewValue: s.Value + 1, Insert: !s.Exists}}); err != nil {
				return err
			}
			return put(tx, "apply/2")
		}},
		// Writes after a read go ahead of the next read, in its batch.
		{"a read, a PutStep, a read, a PutStep", 3, func(tx checkpoint.Tx) error {
			v, err := tx.Target(checkpoint.StateTable)
			if err != nil {
				return err
			}
			if _, err := v.Read(ctx, []string{"k"}); err != nil {
				return err
			}
			if err := put(tx, "apply/3"); err != nil {
				return err
			}
			if _, err := v.Read(ctx, []string{"k2"}); err != nil {
				return err
			}
			return put(tx, "apply/4")
		}},
	} {
		before := rt.n.Load()
		if err := s.InTx(ctx, c.Lease, tc.fn); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := rt.n.Load() - before; got != tc.want {
			t.Errorf("%s took %d round trips; want %d", tc.name, got, tc.want)
		}
	}
}

// A step's lone checkpoint (steps.Do's commit) is one statement in one
// round trip, as a raw autocommit insert is: the fenced upsert that locks
// the run row itself, with no fence check ahead of it, no batch and no
// BEGIN/COMMIT. A fenced attempt's checkpoint is refused all the same.
func TestLoneStepIsOneStatement(t *testing.T) {
	ctx := context.Background()
	s, rt, c := tracedStore(t)
	now := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	put := func(l checkpoint.Lease, id string) error {
		return s.InTx(ctx, l, func(tx checkpoint.Tx) error {
			return tx.PutStep(checkpoint.Step{ID: id, Status: checkpoint.StepCompleted, Output: []byte(`42`), StartedAt: now, FinishedAt: now})
		})
	}
	for i := range 3 {
		n, stmts := rt.n.Load(), rt.stmts.Load()
		if err := put(c.Lease, "do/"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
		if got, gotStmts := rt.n.Load()-n, rt.stmts.Load()-stmts; got != 1 || gotStmts != 1 {
			t.Errorf("step %d: %d round trips and %d statements; want 1 and 1", i, got, gotStmts)
		}
	}
	stale := c.Lease
	stale.Fence--
	if err := put(stale, "do/stale"); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("a checkpoint at an old fence: %v; want ErrFenced", err)
	}
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM steps WHERE run_id = $1`, c.Lease.RunID).Scan(&n); err != nil || n != 3 {
		t.Errorf("%d steps recorded (%v); want the 3 of the live fence", n, err)
	}
}

// An effect step on one key (the common steps.Apply) sends that key as a
// scalar: no statement of its transaction unnests arrays or matches
// = ANY, whose plans cost the server several times the work for one key.
// A missed compare-and-set of one key is still the conflict it names.
func TestOneKeyEffectIsScalar(t *testing.T) {
	ctx := context.Background()
	s, rt, c := tracedStore(t)
	now := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	step := func(id string, stale int64) error {
		return s.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
			v, err := tx.Target(checkpoint.StateTable)
			if err != nil {
				return err
			}
			cur, err := v.Read(ctx, []string{"k"})
			if err != nil {
				return err
			}
			st := cur["k"]
			w := checkpoint.Write{Key: "k", OldVersion: st.Version - stale, NewValue: st.Value + 1, Insert: !st.Exists && stale == 0}
			if err := v.Write(ctx, []checkpoint.Write{w}); err != nil {
				return err
			}
			return tx.PutStep(checkpoint.Step{ID: id, Status: checkpoint.StepCompleted, Output: []byte(`1`), StartedAt: now, FinishedAt: now})
		})
	}
	rt.mu.Lock()
	rt.sql = nil
	rt.mu.Unlock()
	for i := range 3 { // an insert, then updates
		if err := step("apply/"+strconv.Itoa(i), 0); err != nil {
			t.Fatal(err)
		}
	}
	rt.mu.Lock()
	for _, q := range rt.sql {
		if strings.Contains(q, "unnest(") || strings.Contains(q, "ANY(") {
			t.Errorf("a one-key effect step sent %q", q)
		}
	}
	rt.mu.Unlock()
	err := step("apply/stale", 1)
	var vc *checkpoint.VersionConflictError
	if !errors.As(err, &vc) || vc.Key != "k" || vc.Expected != 2 || vc.Found != 3 {
		t.Errorf("a stale one-key compare-and-set: %v; want a conflict on k, expected 2, found 3", err)
	}
	err = s.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
		v, err := tx.Target(checkpoint.StateTable)
		if err != nil {
			return err
		}
		if _, err := v.Read(ctx, []string{"k"}); err != nil {
			return err
		}
		return v.Write(ctx, []checkpoint.Write{{Key: "k", NewValue: 1, Insert: true}})
	})
	if !errors.As(err, &vc) || vc.Key != "k" || vc.Expected != 0 || vc.Found != 3 {
		t.Errorf("a one-key insert of a key that exists: %v; want a conflict on k, expected 0, found 3", err)
	}
}
