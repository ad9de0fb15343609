package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
)

// claimNow is the fixed "now" of these tests; the store never reads the clock, so
// every time it records comes from here.
var claimNow = time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)

const testParams = `{"date":"2026-11-28"}`

// claimReq is a claim of runID by owner at now with a one-minute lease.
func claimReq(runID, owner string, now time.Time) checkpoint.ClaimRequest {
	job, key, _ := strings.Cut(runID, "/")
	return checkpoint.ClaimRequest{
		RunID: runID, Job: job, RunKey: key,
		Params: []byte(testParams), ParamsHash: "hash-" + testParams,
		Owner: owner, Now: now, LeaseFor: time.Minute,
	}
}

func mustClaim(t *testing.T, st checkpoint.Store, req checkpoint.ClaimRequest) checkpoint.Claim {
	t.Helper()
	c, err := st.Claim(context.Background(), req)
	if err != nil {
		t.Fatalf("claim %s by %s: %v", req.RunID, req.Owner, err)
	}
	return c
}

func putStep(st checkpoint.Store, l checkpoint.Lease, s checkpoint.Step) error {
	return st.InTx(context.Background(), l, func(tx checkpoint.Tx) error { return tx.PutStep(s) })
}

func allSteps(t *testing.T, st checkpoint.Store, runID string) []checkpoint.Step {
	t.Helper()
	var out []checkpoint.Step
	if err := st.Steps(context.Background(), runID, func(s checkpoint.Step) error {
		out = append(out, s)
		return nil
	}); err != nil {
		t.Fatalf("steps of %s: %v", runID, err)
	}
	return out
}

func schemaVersions(t *testing.T, db *sql.DB) []int {
	t.Helper()
	rows, err := db.Query(`SELECT version FROM stepwise_schema ORDER BY version`)
	if err != nil {
		t.Fatalf("read stepwise_schema: %v", err)
	}
	defer rows.Close()
	var vs []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		vs = append(vs, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return vs
}

func openStore(t *testing.T, cfg sqlite.Config) (*sqlite.Store, error) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), cfg)
	if err == nil {
		t.Cleanup(func() { st.Close() })
	}
	return st, err
}

func TestOpenAppliesMigrationsOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stepwise.db")
	want := sqlite.SchemaVersion()
	if want < 1 {
		t.Fatalf("SchemaVersion() = %d; want at least 1 embedded migration", want)
	}
	// Each embedded migration once, in order (their numbers may have
	// gaps while branches that each add one are merged).
	ms, err := checkpoint.ReadMigrations(os.DirFS("migrations"), ".")
	if err != nil {
		t.Fatal(err)
	}
	wantVersions := make([]int, 0, len(ms))
	for _, m := range ms {
		wantVersions = append(wantVersions, m.Version)
	}
	if wantVersions[len(wantVersions)-1] != want {
		t.Fatalf("the newest migration file is %d; SchemaVersion() = %d", wantVersions[len(wantVersions)-1], want)
	}

	st, err := sqlite.Open(context.Background(), sqlite.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if got := schemaVersions(t, st.DB()); fmt.Sprint(got) != fmt.Sprint(wantVersions) {
		t.Fatalf("after first open stepwise_schema has versions %v; want %v", got, wantVersions)
	}
	mustClaim(t, st, claimReq("report/2026-11-28", "a:1", claimNow))
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopening twice applies nothing again and keeps the data.
	for i := range 2 {
		st, err = sqlite.Open(context.Background(), sqlite.Config{Path: path})
		if err != nil {
			t.Fatalf("reopen %d: %v", i+1, err)
		}
		if got := schemaVersions(t, st.DB()); fmt.Sprint(got) != fmt.Sprint(wantVersions) {
			t.Fatalf("after reopen %d stepwise_schema has versions %v; want %v", i+1, got, wantVersions)
		}
		if _, err := st.Run(context.Background(), "report/2026-11-28"); err != nil {
			t.Fatalf("reopen %d lost the run: %v", i+1, err)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOpenConcurrentlyCreatesOnce(t *testing.T) {
	// Several runners started together on a new database file all open it,
	// and the migrations are applied once.
	for round := range 5 {
		path := filepath.Join(t.TempDir(), "stepwise.db")
		const n = 4
		errs := make(chan error, n)
		for range n {
			go func() {
				st, err := sqlite.Open(context.Background(), sqlite.Config{Path: path})
				if err == nil {
					_, err = st.Runs(context.Background(), checkpoint.RunFilter{})
					st.Close()
				}
				errs <- err
			}()
		}
		for range n {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: concurrent open of a new database: %v", round, err)
			}
		}
		st, err := openStore(t, sqlite.Config{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		ms, err := checkpoint.ReadMigrations(os.DirFS("migrations"), ".")
		if err != nil {
			t.Fatal(err)
		}
		if got := schemaVersions(t, st.DB()); len(got) != len(ms) || got[len(got)-1] != sqlite.SchemaVersion() {
			t.Fatalf("round %d: stepwise_schema has %v; want each of the %d migrations once, up to %d", round, got, len(ms), sqlite.SchemaVersion())
		}
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stepwise.db")
	st, err := sqlite.Open(context.Background(), sqlite.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.DB().Exec(`INSERT INTO stepwise_schema (version, name) VALUES (999, '0999_future.sql')`); err != nil {
		t.Fatal(err)
	}
	st.Close()

	_, err = openStore(t, sqlite.Config{Path: path})
	if !errors.Is(err, checkpoint.ErrTooNew) {
		t.Fatalf("open of a version 999 database: err = %v; want ErrTooNew", err)
	}
	for _, want := range []string{"999", fmt.Sprint(sqlite.SchemaVersion()), path} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func TestOpenErrorsNameTheFile(t *testing.T) {
	t.Run("missing directory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "no-such-dir")
		path := filepath.Join(dir, "stepwise.db")
		_, err := openStore(t, sqlite.Config{Path: path})
		if !errors.Is(err, checkpoint.ErrNoDirectory) {
			t.Fatalf("err = %v; want ErrNoDirectory", err)
		}
		if !strings.Contains(err.Error(), dir) {
			t.Errorf("error %q does not name the directory %s", err, dir)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("Open created %s (stat err %v); it must not", dir, err)
		}
	})
	t.Run("not a database", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "stepwise.db")
		garbage := []byte(strings.Repeat("this is not a SQLite database, just text. ", 200))
		if err := os.WriteFile(path, garbage, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := openStore(t, sqlite.Config{Path: path})
		if !errors.Is(err, checkpoint.ErrNotDatabase) {
			t.Fatalf("err = %v; want ErrNotDatabase", err)
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("error %q does not name %s", err, path)
		}
		after, _ := os.ReadFile(path)
		if string(after) != string(garbage) {
			t.Errorf("Open changed the file that is not a database")
		}
	})
	t.Run("read-only file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "stepwise.db")
		st, err := sqlite.Open(context.Background(), sqlite.Config{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		st.Close()
		// Tests may run as root, which can write any file; the store checks
		// the mode bits itself.
		if err := os.Chmod(path, 0o444); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(path, 0o644) })
		_, err = openStore(t, sqlite.Config{Path: path})
		if !errors.Is(err, checkpoint.ErrReadOnly) {
			t.Fatalf("err = %v; want ErrReadOnly", err)
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("error %q does not name %s", err, path)
		}
	})
	t.Run("empty path", func(t *testing.T) {
		_, err := openStore(t, sqlite.Config{})
		if err == nil || !strings.Contains(err.Error(), "Path") {
			t.Fatalf("err = %v; want an error naming Config.Path", err)
		}
	})
	t.Run("bad synchronous", func(t *testing.T) {
		_, err := openStore(t, sqlite.Config{Path: filepath.Join(t.TempDir(), "x.db"), Synchronous: "off"})
		if err == nil || !strings.Contains(err.Error(), "Synchronous") {
			t.Fatalf("err = %v; want an error naming Config.Synchronous", err)
		}
	})
}

func TestClaimLockedPastBusyTimeout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stepwise.db")
	cfg := sqlite.Config{Path: path, BusyTimeout: 100 * time.Millisecond}
	st, err := openStore(t, cfg)
	if err != nil {
		t.Fatal(err)
	}

	// Another process (here: another connection) holds the write lock.
	dsn, err := sqlite.DSN(cfg)
	if err != nil {
		t.Fatal(err)
	}
	other, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	holder, err := other.BeginTx(context.Background(), nil) // BEGIN IMMEDIATE through _txlock
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()

	start := time.Now()
	_, err = st.Claim(context.Background(), claimReq("report/2026-11-28", "a:1", claimNow))
	waited := time.Since(start)
	if !errors.Is(err, checkpoint.ErrLocked) {
		t.Fatalf("claim while another connection holds BEGIN IMMEDIATE: err = %v; want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name %s", err, path)
	}
	if waited < 80*time.Millisecond {
		t.Errorf("claim gave up after %s; want it to wait about the 100ms busy timeout", waited)
	}

	// Once the lock is released the same store works, and nothing of the
	// refused claim was kept.
	if err := holder.Rollback(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Run(context.Background(), "report/2026-11-28"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("run after a locked claim: err = %v; want ErrNotFound", err)
	}
	mustClaim(t, st, claimReq("report/2026-11-28", "a:1", claimNow))
}

func TestPutStepIdempotentAndConflict(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	c := mustClaim(t, st, claimReq("report/2026-11-28", "a:1", claimNow))
	step := checkpoint.Step{
		ID: "load", Status: checkpoint.StepCompleted, Output: []byte(`{"n":42}`), InputHash: "in-1",
		Tries: 1, StartedAt: claimNow, FinishedAt: claimNow.Add(time.Second),
	}
	if err := putStep(st, c.Lease, step); err != nil {
		t.Fatal(err)
	}
	// The same row again is our own commit whose acknowledgement was lost.
	if err := putStep(st, c.Lease, step); err != nil {
		t.Fatalf("identical PutStep of a completed step: %v; want it accepted", err)
	}
	// A later attempt recording the identical row is accepted too.
	if err := st.Finish(context.Background(), c.Lease, checkpoint.Ending{Status: checkpoint.RunFailed, At: claimNow}); err != nil {
		t.Fatal(err)
	}
	c2 := mustClaim(t, st, claimReq("report/2026-11-28", "a:1", claimNow.Add(time.Minute)))
	if err := putStep(st, c2.Lease, step); err != nil {
		t.Fatalf("identical PutStep by the next attempt: %v; want it accepted", err)
	}

	for name, changed := range map[string]func(*checkpoint.Step){
		"output": func(s *checkpoint.Step) { s.Output = []byte(`{"n":43}`) },
		"input":  func(s *checkpoint.Step) { s.InputHash = "in-2" },
		"status": func(s *checkpoint.Step) { s.Status, s.Output, s.Error = checkpoint.StepRejected, nil, "no" },
	} {
		other := step
		changed(&other)
		err := putStep(st, c2.Lease, other)
		var conflict *checkpoint.StepConflictError
		if !errors.As(err, &conflict) {
			t.Fatalf("PutStep with a different %s: err = %v; want *StepConflictError", name, err)
		}
		if conflict.StepID != "load" || conflict.RunID != "report/2026-11-28" || conflict.Status != checkpoint.StepCompleted {
			t.Errorf("conflict with a different %s = %+v; want step load of report/2026-11-28, status completed", name, conflict)
		}
	}

	got := allSteps(t, st, "report/2026-11-28")
	if len(got) != 1 || string(got[0].Output) != `{"n":42}` || got[0].InputHash != "in-1" || got[0].Attempt != 1 {
		t.Fatalf("steps after conflicts = %+v; want the first record unchanged", got)
	}
	if !got[0].StartedAt.Equal(claimNow) || !got[0].FinishedAt.Equal(claimNow.Add(time.Second)) {
		t.Errorf("step times = %s..%s; want %s..%s", got[0].StartedAt, got[0].FinishedAt, claimNow, claimNow.Add(time.Second))
	}
}

func TestPutStepReplacesFailedTry(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	c := mustClaim(t, st, claimReq("report/2026-11-28", "a:1", claimNow))
	failed := checkpoint.Step{ID: "load", Status: checkpoint.StepFailed, Error: "timeout", Tries: 1, StartedAt: claimNow, FinishedAt: claimNow}
	if err := putStep(st, c.Lease, failed); err != nil {
		t.Fatal(err)
	}
	done := checkpoint.Step{ID: "load", Status: checkpoint.StepCompleted, Output: []byte(`1`), Tries: 2, StartedAt: claimNow, FinishedAt: claimNow}
	if err := putStep(st, c.Lease, done); err != nil {
		t.Fatalf("completing a failed step: %v", err)
	}
	got := allSteps(t, st, "report/2026-11-28")
	if len(got) != 1 || got[0].Status != checkpoint.StepCompleted || got[0].Tries != 2 || got[0].Error != "" {
		t.Fatalf("steps = %+v; want load completed with tries 2 and no error", got)
	}
}

func TestInTxRollsBackOnError(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	c := mustClaim(t, st, claimReq("report/2026-11-28", "a:1", claimNow))
	boom := errors.New("boom")
	err := st.InTx(context.Background(), c.Lease, func(tx checkpoint.Tx) error {
		if err := tx.PutStep(checkpoint.Step{ID: "load", Status: checkpoint.StepCompleted, Output: []byte(`1`), Tries: 1, StartedAt: claimNow, FinishedAt: claimNow}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx err = %v; want the function's error", err)
	}
	if got := allSteps(t, st, "report/2026-11-28"); len(got) != 0 {
		t.Fatalf("steps after a failed InTx = %+v; want none", got)
	}
}

func TestRunsAndRun(t *testing.T) {
	st := checkpointtest.OpenSQLite(t)
	ctx := context.Background()
	mustClaim(t, st, claimReq("report/2026-11-27", "a:1", claimNow))
	c := mustClaim(t, st, claimReq("report/2026-11-28", "a:1", claimNow.Add(time.Hour)))
	other := claimReq("settle/2026-11-28", "a:1", claimNow.Add(2*time.Hour))
	mustClaim(t, st, other)
	if err := st.Finish(ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: claimNow.Add(90 * time.Minute)}); err != nil {
		t.Fatal(err)
	}

	ids := func(rs []checkpoint.Run) string {
		var s []string
		for _, r := range rs {
			s = append(s, r.ID)
		}
		return strings.Join(s, " ")
	}
	for _, tc := range []struct {
		f    checkpoint.RunFilter
		want string
	}{
		{checkpoint.RunFilter{}, "settle/2026-11-28 report/2026-11-28 report/2026-11-27"},
		{checkpoint.RunFilter{Job: "report"}, "report/2026-11-28 report/2026-11-27"},
		{checkpoint.RunFilter{Status: checkpoint.RunSucceeded}, "report/2026-11-28"},
		{checkpoint.RunFilter{Limit: 1}, "settle/2026-11-28"},
		{checkpoint.RunFilter{Job: "nope"}, ""},
	} {
		rs, err := st.Runs(ctx, tc.f)
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(rs); got != tc.want {
			t.Errorf("Runs(%+v) = %q; want %q", tc.f, got, tc.want)
		}
	}

	info, err := st.Run(ctx, "report/2026-11-28")
	if err != nil {
		t.Fatal(err)
	}
	r := info.Run
	if r.Status != checkpoint.RunSucceeded || r.Job != "report" || r.RunKey != "2026-11-28" || string(r.Params) != testParams {
		t.Errorf("run = %+v; want report 2026-11-28 succeeded with its params", r)
	}
	if !r.FinishedAt.Equal(claimNow.Add(90*time.Minute)) || !r.CreatedAt.Equal(claimNow.Add(time.Hour)) || r.LeaseOwner != "" || !r.LeaseUntil.IsZero() {
		t.Errorf("run times/lease = created %s finished %s owner %q until %s; want created %s, finished %s, no lease",
			r.CreatedAt, r.FinishedAt, r.LeaseOwner, r.LeaseUntil, claimNow.Add(time.Hour), claimNow.Add(90*time.Minute))
	}
	if len(info.Attempts) != 1 || info.Attempts[0].Status != checkpoint.RunSucceeded || info.Attempts[0].Owner != "a:1" {
		t.Errorf("attempts = %+v; want one succeeded attempt by a:1", info.Attempts)
	}

	_, err = st.Run(ctx, "report/1999-01-01")
	if !errors.Is(err, checkpoint.ErrNotFound) || !strings.Contains(err.Error(), "report/1999-01-01") {
		t.Errorf("Run of a missing run: err = %v; want ErrNotFound naming it", err)
	}
}
