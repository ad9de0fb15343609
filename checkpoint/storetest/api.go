package storetest

import (
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// testAPI checks what the HTTP API needs of a store: a create-only claim,
// the run listing's filters and cursor, the runs' counts and the
// Idempotency-Keys.
func testAPI(t *testing.T, h Harness) {
	t.Run("CreateOnlyClaim", func(t *testing.T) { apiCreateOnlyClaim(t, h) })
	callerClock(t, h, "RunFilters", apiRunFilters)
	callerClock(t, h, "RunCounts", apiRunCounts)
	callerClock(t, h, "RunCountsFiltered", apiRunCountsFiltered)
	t.Run("IdempotencyKeys", func(t *testing.T) { apiIdempotencyKeys(t, h) })
	t.Run("IdempotencyKeyScopes", func(t *testing.T) { apiIdempotencyKeyScopes(t, h) })
}

// apiCreateOnlyClaim is the API test CreateOnlyClaim.
func apiCreateOnlyClaim(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	req := claimReq("api/1", ownerA, t0)
	req.CreateOnly = true
	c, err := st.Claim(e.ctx, req)
	if err != nil || !c.Created {
		t.Fatalf("create-only claim of a new run: %+v, %v; want created", c, err)
	}
	if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunFailed, Error: "boom", At: t0.Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	// A failed run is not resumed by a create-only claim: it exists.
	req.Now, req.Owner = t0.Add(2*time.Second), ownerB
	_, err = st.Claim(e.ctx, req)
	var exists *checkpoint.RunExistsError
	if !errors.As(err, &exists) || !errors.Is(err, checkpoint.ErrRunExists) || exists.Run.Status != checkpoint.RunFailed {
		t.Fatalf("create-only claim of a failed run: %v; want *RunExistsError with the failed run", err)
	}
	if info := e.run(st, "api/1"); len(info.Attempts) != 1 || info.Run.Fence != c.Lease.Fence {
		t.Errorf("after a refused create-only claim: %d attempts, fence %d; want 1 and %d (nothing changed)",
			len(info.Attempts), info.Run.Fence, c.Lease.Fence)
	}
	req.Params, req.ParamsHash = []byte(`{"date":"2031-03-15"}`), "other"
	var mismatch *checkpoint.ParamsMismatchError
	if _, err := st.Claim(e.ctx, req); !errors.As(err, &mismatch) {
		t.Errorf("create-only claim with other parameters: %v; want *ParamsMismatchError", err)
	}
}

// apiRunFilters is the API test RunFilters.
func apiRunFilters(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	for i, id := range []string{"f/a-1", "f/a-2", "f/b-1", "g/a-3", "f/a-4"} {
		e.claim(st, id, ownerA, t0.Add(time.Duration(i)*time.Second))
	}
	ids := func(f checkpoint.RunFilter) []string {
		t.Helper()
		runs, err := st.Runs(e.ctx, f)
		if err != nil {
			t.Fatalf("Runs(%+v): %v", f, err)
		}
		var out []string
		for _, r := range runs {
			out = append(out, r.ID)
		}
		return out
	}
	check := func(what string, got, want []string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s: %v; want %v", what, got, want)
		}
	}
	check("prefix a-", ids(checkpoint.RunFilter{RunKeyPrefix: "a-"}), []string{"f/a-4", "g/a-3", "f/a-2", "f/a-1"})
	check("job f, prefix a-", ids(checkpoint.RunFilter{Job: "f", RunKeyPrefix: "a-"}), []string{"f/a-4", "f/a-2", "f/a-1"})
	check("prefix matching no run", ids(checkpoint.RunFilter{RunKeyPrefix: "a_"}), nil)
	check("created in [1s, 3s)", ids(checkpoint.RunFilter{CreatedFrom: t0.Add(time.Second), CreatedBefore: t0.Add(3 * time.Second)}),
		[]string{"f/b-1", "f/a-2"})
	// Pages of two, each after the previous page's last run.
	var all []string
	f := checkpoint.RunFilter{Limit: 2}
	for page := 0; page < 5; page++ {
		runs, err := st.Runs(e.ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(runs) == 0 {
			break
		}
		for _, r := range runs {
			all = append(all, r.ID)
		}
		last := runs[len(runs)-1]
		f.After = &checkpoint.RunCursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	check("every page", all, []string{"f/a-4", "g/a-3", "f/b-1", "f/a-2", "f/a-1"})
	// Two runs created at one instant are told apart by ID.
	e.claim(st, "h/x", ownerA, t0.Add(time.Minute))
	e.claim(st, "h/y", ownerA, t0.Add(time.Minute))
	first := ids(checkpoint.RunFilter{Job: "h", Limit: 1})
	check("tie, first page", first, []string{"h/x"})
	check("tie, second page", ids(checkpoint.RunFilter{Job: "h", After: &checkpoint.RunCursor{CreatedAt: t0.Add(time.Minute), ID: "h/x"}}), []string{"h/y"})
}

// apiIdempotencyKeys is the API test IdempotencyKeys.
func apiIdempotencyKeys(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	ik := capability[checkpoint.IdempotencyStore](t, st, "idempotency keys")
	k := checkpoint.IdempotencyKey{Scope: "token:a", Key: "k-1", RequestHash: "h1", Job: "settle", Params: []byte(params), RunID: "settle/1", CreatedAt: t0}
	rec0, begun, err := ik.BeginIdempotency(e.ctx, k, t0.Add(-time.Minute))
	if err != nil || !begun || rec0.State != checkpoint.IdempotencyAccepting || rec0.Holder == "" || rec0.Scope != "token:a" {
		t.Fatalf("first BeginIdempotency: %+v, %v, %v; want begun, accepting, in scope token:a, with a holder", rec0, begun, err)
	}
	// A second request meanwhile finds it accepting; with another
	// fingerprint, it finds the first one's.
	k2 := k
	k2.CreatedAt = t0.Add(time.Second)
	rec, begun, err := ik.BeginIdempotency(e.ctx, k2, t0.Add(-time.Minute))
	if err != nil || begun || rec.State != checkpoint.IdempotencyAccepting || rec.RunID != "settle/1" || !sameTime(rec.CreatedAt, t0) || rec.Holder != "" {
		t.Fatalf("BeginIdempotency while accepting: %+v, %v, %v; want the accepting record", rec, begun, err)
	}
	k3 := k2
	k3.RequestHash, k3.Params = "h2", []byte(`{"date":"x"}`)
	rec, begun, _ = ik.BeginIdempotency(e.ctx, k3, t0.Add(time.Hour))
	if begun || rec.RequestHash != "h1" || string(rec.Params) != params {
		t.Fatalf("BeginIdempotency of another request with the key: %+v, %v; want the first request's record, not begun", rec, begun)
	}
	first := rec0
	// A stale accepting key of the same request is taken over, with a
	// holder of its own.
	takeover, begun, err := ik.BeginIdempotency(e.ctx, k2, t0.Add(time.Millisecond))
	if err != nil || !begun || takeover.Holder == "" || takeover.Holder == first.Holder {
		t.Fatalf("BeginIdempotency of a stale accepting key: %+v, %v, %v; want taken over with a new holder (not %q)", takeover, begun, err, first.Holder)
	}
	// The request that lost it (slow, not dead) can neither forget it
	// nor mark it done.
	if err := ik.DropIdempotency(e.ctx, first); err != nil {
		t.Fatal(err)
	}
	rec, begun, err = ik.BeginIdempotency(e.ctx, k3, t0.Add(time.Hour))
	if err != nil || begun || rec.RequestHash != "h1" || rec.State != checkpoint.IdempotencyAccepting {
		t.Fatalf("after the old holder's drop, another request with the key: %+v, %v, %v; want the key kept, accepting", rec, begun, err)
	}
	var lost *checkpoint.IdempotencyLostError
	if err := ik.FinishIdempotency(e.ctx, first, t0.Add(2*time.Second)); !errors.As(err, &lost) || lost.Key != "k-1" || lost.Scope != "token:a" {
		t.Fatalf("FinishIdempotency by the holder that lost the key: %v; want *IdempotencyLostError of k-1 in token:a", err)
	}
	// The holder, under another scope, names another key: not this one.
	elsewhere := takeover
	elsewhere.Scope = "token:b"
	if err := ik.FinishIdempotency(e.ctx, elsewhere, t0.Add(2*time.Second)); !errors.As(err, &lost) {
		t.Fatalf("FinishIdempotency of the holder in another scope: %v; want *IdempotencyLostError", err)
	}
	if err := ik.DropIdempotency(e.ctx, elsewhere); err != nil {
		t.Fatal(err)
	}
	if err := ik.FinishIdempotency(e.ctx, takeover, t0.Add(2*time.Second)); err != nil {
		t.Fatalf("FinishIdempotency by the holder that took it over: %v", err)
	}
	if err := ik.FinishIdempotency(e.ctx, takeover, t0.Add(3*time.Second)); !errors.As(err, &lost) {
		t.Errorf("FinishIdempotency of a done key: %v; want *IdempotencyLostError", err)
	}
	// Done: stays so, replayed, even when old, dropped by its own
	// holder and on another host.
	other := capability[checkpoint.IdempotencyStore](t, e.open(), "idempotency keys")
	if err := other.DropIdempotency(e.ctx, takeover); err != nil {
		t.Fatal(err)
	}
	rec, begun, err = other.BeginIdempotency(e.ctx, k, t0.Add(time.Hour))
	if err != nil || begun || rec.State != checkpoint.IdempotencyDone || rec.RunID != "settle/1" || rec.Scope != "token:a" {
		t.Fatalf("BeginIdempotency of a done key: %+v, %v, %v; want the done record", rec, begun, err)
	}
	idemDroppedIsBegunAnew(t, e, ik)
	idemOneBeginsAtOnce(t, e, ik)
}

// idemDroppedIsBegunAnew: an accepting key dropped is begun anew.
func idemDroppedIsBegunAnew(t *testing.T, e *env, ik checkpoint.IdempotencyStore) {
	k4 := checkpoint.IdempotencyKey{Scope: "token:a", Key: "k-2", RequestHash: "h", Job: "settle", Params: []byte(params), RunID: "settle/2", CreatedAt: t0}
	rec4, begun, err := ik.BeginIdempotency(e.ctx, k4, t0)
	if err != nil || !begun {
		t.Fatalf("BeginIdempotency k-2: %v, %v", begun, err)
	}
	if err := ik.DropIdempotency(e.ctx, rec4); err != nil {
		t.Fatal(err)
	}
	if _, begun, err := ik.BeginIdempotency(e.ctx, k4, t0); err != nil || !begun {
		t.Errorf("BeginIdempotency after a drop: begun %v, %v; want begun", begun, err)
	}
}

// idemOneBeginsAtOnce: of many begins of one key at once, in two scopes,
// exactly one begins in each.
func idemOneBeginsAtOnce(t *testing.T, e *env, ik checkpoint.IdempotencyStore) {
	results := make(chan string, 16)
	for i := range 16 {
		go func() {
			k5 := checkpoint.IdempotencyKey{Scope: []string{"token:a", "token:b"}[i%2], Key: "k-3", RequestHash: "h",
				Job: "settle", Params: []byte(params), RunID: "settle/3", CreatedAt: t0}
			_, begun, err := ik.BeginIdempotency(e.ctx, k5, t0.Add(-time.Hour))
			if err != nil {
				t.Error(err)
			}
			if !begun {
				k5.Scope = ""
			}
			results <- k5.Scope
		}()
	}
	n := map[string]int{}
	for range 16 {
		n[<-results]++
	}
	if n["token:a"] != 1 || n["token:b"] != 1 {
		t.Errorf("16 BeginIdempotency at once, 8 in each of two scopes: begun %d in token:a and %d in token:b; want 1 in each", n["token:a"], n["token:b"])
	}
}

// apiIdempotencyKeyScopes is the API test IdempotencyKeyScopes.
func apiIdempotencyKeyScopes(t *testing.T, h Harness) {
	e := newEnv(t, h)
	ik := capability[checkpoint.IdempotencyStore](t, e.open(), "idempotency keys")
	a := checkpoint.IdempotencyKey{Scope: "token:a", Key: "k", RequestHash: "ha", Job: "settle", Params: []byte(params), RunID: "settle/a", CreatedAt: t0}
	b := checkpoint.IdempotencyKey{Scope: "token:b", Key: "k", RequestHash: "hb", Job: "settle", Params: []byte(`{"date":"b"}`), RunID: "settle/b", CreatedAt: t0}
	legacy := checkpoint.IdempotencyKey{Key: "k", RequestHash: "hl", Job: "settle", Params: []byte(`{"date":"l"}`), RunID: "settle/l", CreatedAt: t0}
	// The same key in three scopes (the empty one too) is three keys,
	// whatever each request is, each begun while the others accept.
	var holds []checkpoint.IdempotencyKey
	for _, k := range []checkpoint.IdempotencyKey{a, b, legacy} {
		rec, begun, err := ik.BeginIdempotency(e.ctx, k, t0.Add(-time.Minute))
		if err != nil || !begun || rec.Scope != k.Scope || rec.RunID != k.RunID {
			t.Fatalf("BeginIdempotency of key k in scope %q while it accepts in others: %+v, %v, %v; want begun, its own", k.Scope, rec, begun, err)
		}
		holds = append(holds, rec)
	}
	// Each scope's record answers only in its own scope: b's request
	// again is b's, not a conflict with a's.
	if err := ik.FinishIdempotency(e.ctx, holds[0], t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, k := range []checkpoint.IdempotencyKey{a, b, legacy} {
		rec, begun, err := ik.BeginIdempotency(e.ctx, k, t0.Add(-time.Minute))
		if err != nil || begun || rec.Scope != k.Scope || rec.RequestHash != k.RequestHash || rec.RunID != k.RunID || string(rec.Params) != string(k.Params) {
			t.Fatalf("BeginIdempotency again in scope %q: %+v, %v, %v; want that scope's record (run %s)", k.Scope, rec, begun, err, k.RunID)
		}
	}
	if rec, _, _ := ik.BeginIdempotency(e.ctx, a, t0.Add(time.Hour)); rec.State != checkpoint.IdempotencyDone {
		t.Errorf("key k in token:a after its finish: %q; want done", rec.State)
	}
	// Dropping b's hold leaves a's and the empty scope's.
	if err := ik.DropIdempotency(e.ctx, holds[1]); err != nil {
		t.Fatal(err)
	}
	if _, begun, _ := ik.BeginIdempotency(e.ctx, b, t0.Add(-time.Minute)); !begun {
		t.Errorf("key k in token:b after its drop: not begun; want begun anew")
	}
	for _, k := range []checkpoint.IdempotencyKey{a, legacy} {
		if rec, begun, _ := ik.BeginIdempotency(e.ctx, k, t0.Add(-time.Minute)); begun || rec.RunID != k.RunID {
			t.Errorf("key k in scope %q after token:b's drop: %+v, begun %v; want its record kept", k.Scope, rec, begun)
		}
	}
}

// apiRunCountsFiltered is the API test RunCountsFiltered: RunCounts counts
// what the run listing's job, key prefix and creation filters select (its
// status, cursor and limit ignored).
func apiRunCountsFiltered(t *testing.T, h Harness) {
	e := newEnv(t, h)
	st := e.open()
	ins := capability[listings](t, st, "inspector")
	for i, id := range []string{"f/a-1", "f/a-2", "f/b-1", "g/a-3"} {
		c := e.claim(st, id, ownerA, t0.Add(time.Duration(i)*time.Second))
		if i < 2 {
			if err := st.Finish(e.ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: t0.Add(time.Minute)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		f    checkpoint.RunFilter
		want map[string]int64
	}{
		{checkpoint.RunFilter{}, map[string]int64{checkpoint.RunSucceeded: 2, checkpoint.RunRunning: 2}},
		{checkpoint.RunFilter{Job: "f", Status: checkpoint.RunFailed, Limit: 1}, map[string]int64{checkpoint.RunSucceeded: 2, checkpoint.RunRunning: 1}},
		{checkpoint.RunFilter{Job: "f", RunKeyPrefix: "a-"}, map[string]int64{checkpoint.RunSucceeded: 2}},
		{checkpoint.RunFilter{CreatedFrom: t0.Add(time.Second), CreatedBefore: t0.Add(3 * time.Second)}, map[string]int64{checkpoint.RunSucceeded: 1, checkpoint.RunRunning: 1}},
		{checkpoint.RunFilter{Job: "none"}, map[string]int64{}},
	} {
		counts, err := ins.RunCounts(e.ctx, tc.f, t0)
		got := map[string]int64{}
		for _, c := range counts {
			got[c.Status] += c.Count
		}
		if err != nil || !maps.Equal(got, tc.want) {
			t.Errorf("RunCounts(%+v) by status = %v, %v; want %v", tc.f, got, err, tc.want)
		}
	}
}
