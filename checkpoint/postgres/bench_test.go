package postgres_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
)

// BenchmarkSameStoreChunk commits one chunk the way a batch step does on
// a same-store target: read the chunk's keys (locking them), write them
// (compare-and-set), record its items, commit. The keys exist (half the
// chunk's writes update, half insert on the first pass only), so each
// iteration runs the full read-write-record path; it reports chunks/s.
//
//	STEPWISE_TEST_PG=postgres://postgres@127.0.0.1:5432/test go test ./checkpoint/postgres -run '^$' -bench SameStoreChunk -benchtime 300x
func BenchmarkSameStoreChunk(b *testing.B) {
	st := open(b, postgres.Config{URL: pgtest.Schema(b), MaxConns: 1})
	ctx := context.Background()
	c := mustClaim(b, st, claimReq("bench/1", "bench:1", time.Time{}))
	const size = 100
	keys := make([]string, size)
	for i := range keys {
		keys[i] = "acct:" + strconv.Itoa(i)
	}
	b.ResetTimer()
	for n := range b.N {
		err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
			v, err := tx.Target(checkpoint.StateTable)
			if err != nil {
				return err
			}
			cur, err := v.Read(ctx, keys)
			if err != nil {
				return err
			}
			ws := make([]checkpoint.Write, 0, size)
			items := make([]checkpoint.Item, 0, size)
			for _, k := range keys {
				s := cur[k]
				ws = append(ws, checkpoint.Write{Key: k, OldVersion: s.Version, OldValue: s.Value, NewValue: s.Value + 1, Insert: !s.Exists})
				items = append(items, checkpoint.Item{Step: "post", Key: k + "/" + strconv.Itoa(n), Status: checkpoint.StepCompleted,
					Output: []byte(`{}`), Chunk: "c" + strconv.Itoa(n)})
			}
			if err := v.Write(ctx, ws); err != nil {
				return err
			}
			return tx.PutItems(items)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "chunks/s")
}

// BenchmarkClaimMessages claims outbox messages in batches of 10 with 1, 4
// and 16 claimers at once on one store (the SKIP LOCKED claim of many
// dispatchers); an iteration is one claim, and it reports messages
// claimed per second. Every message is claimed once: the benchmark fails
// on a message claimed twice.
//
//	STEPWISE_TEST_PG=postgres://postgres@127.0.0.1:5432/test go test ./checkpoint/postgres -run '^$' -bench ClaimMessages -benchtime 2000x
func BenchmarkClaimMessages(b *testing.B) {
	for _, claimers := range []int{1, 4, 16} {
		b.Run("claimers="+strconv.Itoa(claimers), func(b *testing.B) {
			st := open(b, postgres.Config{URL: pgtest.Schema(b), MaxConns: int32(claimers)})
			ctx := context.Background()
			c := mustClaim(b, st, claimReq("bench/1", "bench:1", time.Time{}))
			const batch = 10
			total := b.N * batch
			for from := 0; from < total; from += 1000 {
				err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
					for i := from; i < min(from+1000, total); i++ {
						if err := tx.Enqueue(checkpoint.Message{Key: "bench/1/m" + strconv.Itoa(i), Topic: "t", Payload: []byte(`{}`)}); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			var (
				next    atomic.Int64
				claimed sync.Map
				twice   atomic.Int64
				wg      sync.WaitGroup
			)
			b.ResetTimer()
			for range claimers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						ms, err := st.ClaimMessages(ctx, time.Time{}, batch, time.Hour)
						if err != nil {
							b.Error(err)
							return
						}
						for _, m := range ms {
							if _, dup := claimed.LoadOrStore(m.Key, true); dup {
								twice.Add(1)
							}
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			if twice.Load() > 0 {
				b.Fatalf("%d messages claimed twice within one window", twice.Load())
			}
			b.ReportMetric(float64(total)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
