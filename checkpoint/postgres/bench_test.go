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

// sqlRawInsert is the raw baseline: a checkpoint-shaped row, one
// autocommit INSERT, no fence, no conflict rule.
const sqlRawInsert = `INSERT INTO steps (run_id, step_id, status, output, input_hash, error, tries, attempt, started_at, finished_at)
VALUES ($1, $2, 'completed', $3, $4, '', 1, 1, $5, $6)`

// BenchmarkPutStepVsRaw alternates a raw pgx single-row autocommit insert
// with one durable step checkpoint through InTx (fence lock, PutStep,
// commit) on the same store and run, so both see the same disk and load;
// it reports each rate and their ratio (the goal is at least 0.8).
//
//	STEPWISE_TEST_PG=postgres://postgres@127.0.0.1:5432/test go test ./checkpoint/postgres -run '^$' -bench PutStepVsRaw -benchtime 2000x
func BenchmarkPutStepVsRaw(b *testing.B) {
	st := open(b, postgres.Config{URL: pgtest.Schema(b), MaxConns: 1})
	ctx := context.Background()
	c := mustClaim(b, st, claimReq("bench/1", "bench:1", time.Time{}))
	output := []byte(`{"account":"acct:42","amount":-1000,"balance":125000}`)
	now := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	var raw, ours time.Duration
	b.ResetTimer()
	for i := range b.N {
		id := strconv.Itoa(i)
		start := time.Now()
		if _, err := st.Pool().Exec(ctx, sqlRawInsert, c.Lease.RunID, "raw/"+id, output, "sha256:abc", now, now); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		err := st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
			return tx.PutStep(checkpoint.Step{ID: "step/" + id, Status: checkpoint.StepCompleted, Output: output,
				InputHash: "sha256:abc", Tries: 1, StartedAt: now, FinishedAt: now})
		})
		if err != nil {
			b.Fatal(err)
		}
		raw += mid.Sub(start)
		ours += time.Since(mid)
	}
	b.StopTimer()
	rawRate := float64(b.N) / raw.Seconds()
	ourRate := float64(b.N) / ours.Seconds()
	b.ReportMetric(rawRate, "raw_rows/s")
	b.ReportMetric(ourRate, "steps/s")
	b.ReportMetric(ourRate/rawRate, "ratio")
}

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
