package steps_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/steps"
)

// jsonPlanStore records chunk plans as JSON, as a Stepwise from before
// checkpoint.EncodeChunkPlan did, and crashes (panics) once, right after
// the first transaction that recorded one commits.
type jsonPlanStore struct {
	checkpoint.Backend
	t       *testing.T
	crashed bool
}

type jsonPlanTx struct {
	checkpoint.Tx
	t       *testing.T
	planned *bool
}

func (tx jsonPlanTx) PutChunkPlan(p checkpoint.ChunkPlan) error {
	r, err := checkpoint.DecodeChunkPlan(p.Plan)
	if err != nil {
		tx.t.Fatal(err)
	}
	if p.Plan, err = json.Marshal(r); err != nil {
		tx.t.Fatal(err)
	}
	*tx.planned = true
	return tx.Tx.PutChunkPlan(p)
}

func (s *jsonPlanStore) InTx(ctx context.Context, l checkpoint.Lease, fn func(checkpoint.Tx) error) error {
	planned := false
	err := s.Backend.InTx(ctx, l, func(tx checkpoint.Tx) error { return fn(jsonPlanTx{Tx: tx, t: s.t, planned: &planned}) })
	if err == nil && planned && !s.crashed {
		s.crashed = true
		panic("crash after the plan is recorded")
	}
	return err
}

// TestForEachResumesChunkPlansRecordedAsJSON: a separate-store chunk plan
// recorded as JSON by an earlier Stepwise, not yet known to be applied,
// is finished by today's: applied as recorded when its versions still
// hold, made again from its recorded operations when another writer moved
// a key.
func TestForEachResumesChunkPlansRecordedAsJSON(t *testing.T) {
	for _, moved := range []bool{false, true} {
		name := "versions hold"
		if moved {
			name = "another writer moved the key"
		}
		t.Run(name, func(t *testing.T) {
			st, path, db := rvLedger(t)
			target := steps.Target{Location: path, Table: accountsTable}
			items := []string{"a", "b", "c"}
			fn := func(ctx context.Context, it string, e *steps.Effects) (int, error) {
				switch it {
				case "a":
					rvMove(e, 10)
				case "b":
					rvMove(e, 2000) // rejected by A's guard
				case "c":
					rvMove(e, 20)
				}
				return 1, nil
			}
			src := steps.Slice(items, func(s string) string { return s })
			run := rvBegin(t, st, &jsonPlanStore{Backend: st, t: t})
			func() {
				defer func() {
					if recover() == nil {
						t.Fatal("the first attempt did not crash after recording its plan")
					}
				}()
				steps.ForEach(context.Background(), run, "post", src, fn, steps.WithTarget(target))
			}()
			plans, err := st.ChunkPlans(context.Background(), "j/k", "post")
			if err != nil || len(plans) != 1 || len(plans[0].Plan) == 0 || plans[0].Plan[0] != '{' {
				t.Fatalf("recorded plans %+v, %v; want one, planned, as JSON", plans, err)
			}
			// a and c applied once, b never; the chunk writes each key once.
			check := checkpointtest.LedgerCheck{Opening: rvOpening,
				Applied:  []checkpointtest.Transfer{{ID: "a", From: "A", To: "B", Amount: 10}, {ID: "c", From: "A", To: "B", Amount: 20}},
				Versions: map[string]int64{"A": 1, "B": 1}}
			if moved {
				check.Applied = append(check.Applied, rvOtherWriter(t, db))
				check.Versions = map[string]int64{"A": 2, "B": 2}
			}
			sum, err := steps.ForEach(context.Background(), rvBegin(t, st, st), "post", src, fn, steps.WithTarget(target))
			if err != nil {
				t.Fatal(err)
			}
			checkpointtest.CheckLedger(t, path, accountsTable, check) // the plan applied once
			if sum.Completed != 2 || sum.Rejected != 1 {
				t.Errorf("summary %+v; want 2 completed, 1 rejected", sum)
			}
			if plans, err := st.ChunkPlans(context.Background(), "j/k", "post"); err != nil || len(plans) != 0 {
				t.Errorf("plans still planned after the resume: %+v, %v", plans, err)
			}
		})
	}
}
