package postgres_test

import (
	"context"
	"strconv"
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
