package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// skewedEnv is an Env on db whose local clock is skew ahead of the real
// one, as on a host whose clock drifted: the clock `runs` and `show`
// take (Env.Now).
func skewedEnv(db string, skew time.Duration, out *bytes.Buffer) *Env {
	return &Env{Ctx: context.Background(), Registry: testRegistry(), Stdout: out, Stderr: out, Name: "stepwise",
		Globals: &Globals{DB: db, Synchronous: "full", BusyTimeout: 5 * time.Second},
		Now:     func() time.Time { return time.Now().Add(skew) }}
}

// issue 23.4: `runs` and `show` judge staleness on the store's clock.
// A live run (a lease of ten minutes, taken on the real clock) seen from
// a host one hour ahead is live on PostgreSQL, whose now() is the store's
// clock; on SQLite the local clock is the store's clock, so the same
// skew makes it stale there (what its runners would judge too).
func TestRunsAndShowJudgeStalenessOnTheStoresClock(t *testing.T) {
	db := testDB(t)
	st := openStore(t, db)
	const runID = "crashy/skew"
	if _, err := st.Claim(context.Background(), checkpoint.ClaimRequest{RunID: runID, Job: "crashy", RunKey: "skew",
		Params: []byte(`{"key":"skew"}`), ParamsHash: "h", Owner: "elsewhere:1", Now: time.Now(), LeaseFor: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	wantStale := !onPostgres(t)
	var out bytes.Buffer
	env := skewedEnv(db, time.Hour, &out)
	defer env.close()
	if err := (&RunsCmd{Limit: 100, JSON: true}).Run(env); err != nil {
		t.Fatal(err)
	}
	var views []ops.RunView
	if err := json.Unmarshal(out.Bytes(), &views); err != nil || len(views) != 1 {
		t.Fatalf("runs --json: %v\n%s", err, out.String())
	}
	if views[0].Stale != wantStale {
		t.Errorf("runs --json from a host an hour ahead: stale %v, want %v (postgres %v)", views[0].Stale, wantStale, onPostgres(t))
	}
	out.Reset()
	if err := (&RunsCmd{Limit: 100}).Run(env); err != nil {
		t.Fatal(err)
	}
	if got := strings.Contains(out.String(), "stale"); got != wantStale {
		t.Errorf("runs from a host an hour ahead says stale: %v, want %v:\n%s", got, wantStale, out.String())
	}
	out.Reset()
	if err := (&ShowCmd{RunID: runID, Limit: 10}).Run(env); err != nil {
		t.Fatal(err)
	}
	if got := strings.Contains(out.String(), "stale"); got != wantStale {
		t.Errorf("show from a host an hour ahead says stale: %v, want %v:\n%s", got, wantStale, out.String())
	}
	if onPostgres(t) && strings.Contains(out.String(), "59m") {
		t.Errorf("show from a host an hour ahead counts the skew into its times:\n%s", out.String())
	}
}
