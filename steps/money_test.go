package steps_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/steps"
)

// TestForEachOverflowFailsTheChunk: an Add that would take a balance past
// int64 fails the step naming the item and the key, is not pinned, and
// commits nothing of its chunk (items or effects), on either store; the
// chunks before it stay committed, and a rerun after the data is fixed
// posts the rest.
func TestForEachOverflowFailsTheChunk(t *testing.T) {
	for _, separate := range []bool{false, true} {
		t.Run(fmt.Sprintf("separate=%v", separate), func(t *testing.T) {
			ctx := context.Background()
			st, db, target := targetStore(t, separate)
			opening := map[string]int64{"a": 1000, "b": 0, "max": math.MaxInt64 - 10}
			ledger(t, db, opening)
			var items []xfer
			for i := range 9 {
				items = append(items, xfer{ID: fmt.Sprintf("T%d", i), From: "a", To: "b", Amount: 10})
			}
			items[4] = xfer{ID: "T4", From: "a", To: "max", Amount: 11} // chunk 2 of 3
			run := beginEffects(t, st, "j/k")
			_, err := steps.ForEach(ctx, run, "post", steps.Slice(items, xferKey), post, steps.WithTarget(target), steps.ChunkSize(3))
			var ov *steps.OverflowError
			if !errors.As(err, &ov) || ov.Key != "max" || ov.Value != math.MaxInt64-10 || ov.Delta != 11 {
				t.Fatalf("err = %v; want an *OverflowError on max", err)
			}
			var rej *steps.RejectedError
			if errors.As(err, &rej) {
				t.Fatalf("an overflow became a pinned rejection: %v", err)
			}
			for _, w := range []string{"post/T4", "max", "overflow"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %s", err, w)
				}
			}
			// Chunk 1 (T0..T2) committed, one version per chunk; nothing of
			// chunk 2 (T3..T5).
			checkpointtest.CheckLedger(t, db, accountsTable, checkpointtest.LedgerCheck{Opening: opening,
				Applied: xferTransfers(items[:3]), Versions: map[string]int64{"a": 1, "b": 1, "max": 0}})
			got := itemStatuses(t, run, "post")
			if len(got) != 3 || got["T0"] != checkpoint.StepCompleted || got["T2"] != checkpoint.StepCompleted {
				t.Errorf("items recorded %v; want T0..T2 completed and nothing of the failed chunk", got)
			}
			if separate {
				var n int
				if err := checkpointtest.SQL(t, db).QueryRow(`SELECT count(*) FROM stepwise_applied`).Scan(&n); err != nil || n != 1 {
					t.Errorf("applied chunk plans = %d, %v; want 1", n, err)
				}
			}

			// Fixed data: the rerun posts chunks 2 and 3 once.
			execSQL(t, db, `UPDATE accounts SET balance = 0, version = version + 1 WHERE id = 'max'`)
			run2 := beginEffects(t, st, "j/k")
			sum, err := steps.ForEach(ctx, run2, "post", steps.Slice(items, xferKey), post, steps.WithTarget(target), steps.ChunkSize(3))
			if err != nil || sum.Completed != 9 {
				t.Fatalf("rerun after the fix: %+v, %v", sum, err)
			}
			// The ledger as fixed (max opened at 0, one version more) holds
			// every item once; a and b written once per chunk, max by the
			// fix and chunk 2.
			fixed := map[string]int64{"a": 1000, "b": 0, "max": 0}
			checkpointtest.CheckLedger(t, db, accountsTable, checkpointtest.LedgerCheck{Opening: fixed,
				Applied: xferTransfers(items), Versions: map[string]int64{"a": 3, "b": 3, "max": 2}})
		})
	}
}

// TestApplyOverflowFails: a single effect step that would overflow fails,
// unpinned and with nothing applied, on either store.
func TestApplyOverflowFails(t *testing.T) {
	for _, separate := range []bool{false, true} {
		t.Run(fmt.Sprintf("separate=%v", separate), func(t *testing.T) {
			ctx := context.Background()
			st, db, target := targetStore(t, separate)
			ledger(t, db, map[string]int64{"a": 1000, "low": math.MinInt64 + 1})
			run := beginEffects(t, st, "j/k")
			// Set cannot overflow; the Add after it can.
			_, err := steps.Apply(ctx, run, "fix/1", target, func(ctx context.Context, e *steps.Effects) (int, error) {
				e.Add("a", 5)
				e.Add("low", -2)
				return 0, nil
			})
			var ov *steps.OverflowError
			if !errors.As(err, &ov) || ov.Key != "low" || !strings.Contains(err.Error(), "fix/1") {
				t.Fatalf("err = %v; want an *OverflowError on low naming the step", err)
			}
			if v, ver := balance(t, db, "a"); v != 1000 || ver != 0 {
				t.Errorf("a = %d v%d; the failed step applied part of its plan", v, ver)
			}
			// Not pinned: once the data is fixed the step runs.
			execSQL(t, db, `UPDATE accounts SET balance = 0 WHERE id = 'low'`)
			run2 := beginEffects(t, st, "j/k")
			if _, err := steps.Apply(ctx, run2, "fix/1", target, func(ctx context.Context, e *steps.Effects) (int, error) {
				e.Add("a", 5)
				e.Add("low", -2)
				return 0, nil
			}); err != nil {
				t.Fatalf("rerun after the fix: %v", err)
			}
			if v, _ := balance(t, db, "low"); v != -2 {
				t.Errorf("low = %d, want -2", v)
			}
		})
	}
}

// TestMissingSeparateTarget: a separate-store target whose file is missing
// fails naming its absolute path, in a run and in a dry run, and the file
// is not created. A separate target is a SQLite file, on a SQLite store
// whatever the suite's store (see checkpointtest.SeparateTarget).
func TestMissingSeparateTarget(t *testing.T) {
	for _, dry := range []bool{false, true} {
		t.Run(fmt.Sprintf("dry=%v", dry), func(t *testing.T) {
			ctx := context.Background()
			st := checkpointtest.OpenSQLite(t)
			path := filepath.Join(t.TempDir(), "ledger.db")
			target := steps.Target{Location: path, Table: accountsTable}
			var run *steps.Run
			if dry {
				var err error
				run, err = steps.Begin(ctx, steps.Config{Store: st, Lease: checkpoint.Lease{RunID: "j/k", Owner: "test:1"}, DryRun: true})
				if err != nil {
					t.Fatal(err)
				}
				defer run.Close()
			} else {
				run = beginEffects(t, st, "j/k")
			}
			_, err := steps.Apply(ctx, run, "post/T1", target, transfer("a", "b", 1))
			if !errors.Is(err, checkpoint.ErrNoDatabase) || !strings.Contains(err.Error(), path) {
				t.Fatalf("err = %v; want ErrNoDatabase naming %s", err, path)
			}
			if _, err := run.TargetDB(ctx, target); !errors.Is(err, checkpoint.ErrNoDatabase) {
				t.Errorf("TargetDB: err = %v; want ErrNoDatabase", err)
			}
			if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("opening a missing target created it: %v", err)
			}
		})
	}
}
