package httpapi_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/cmd/internal/httpapi"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// auditRefusing is a real store whose claims carry a record it cannot
// keep: each audit record's reason gets a NUL, as if a request had slipped
// past the API's checks. Everything else is the store's own.
type auditRefusing struct{ checkpoint.Backend }

func (s auditRefusing) Claim(ctx context.Context, req checkpoint.ClaimRequest) (checkpoint.Claim, error) {
	req.Audits = slices.Clone(req.Audits)
	for i := range req.Audits {
		req.Audits[i].Reason += "\x00"
	}
	return s.Backend.Claim(ctx, req)
}

// probe is a job of one step that fails on its first execution and
// records, each time it runs, the commands of its run's audit log as it
// sees them then.
type probe struct {
	st    checkpoint.Backend
	runs  atomic.Int32
	mu    sync.Mutex
	saw   [][]string
	steps *jobs.Registry
}

func newProbe(st checkpoint.Backend) *probe {
	p := &probe{st: st, steps: &jobs.Registry{}}
	p.steps.MustRegister(jobs.Define("probe", func(ctx context.Context, run *steps.Run, d dayParams) error {
		_, err := steps.Do(ctx, run, steps.ID("look"), func(ctx context.Context) (int, error) {
			as, err := p.st.Audits(ctx, "probe/"+d.Date)
			if err != nil {
				return 0, err
			}
			var cmds []string
			for _, a := range as {
				cmds = append(cmds, a.Command)
			}
			p.mu.Lock()
			p.saw = append(p.saw, cmds)
			p.mu.Unlock()
			if p.runs.Add(1) == 1 {
				return 0, errors.New("the ledger is closed")
			}
			return 1, nil
		})
		return err
	}))
	return p
}

// probeAPI is a server on st for the probe job whose runner claims
// through runnerStore (st itself, or st wrapped).
func probeAPI(t *testing.T, st checkpoint.Backend, p *probe, runnerStore checkpoint.Backend) *testAPI {
	t.Helper()
	r, err := runner.New(runner.Config{Store: runnerStore, Jobs: p.steps})
	if err != nil {
		t.Fatal(err)
	}
	a := &testAPI{t: t, st: st, ended: map[string]chan struct{}{}}
	a.local = httpapi.NewLocal(r)
	a.local.OnDone = func(res runner.Result, err error) { close(a.endOf(res.RunID)) }
	tokens, err := httpapi.ParseTokens([]byte("ops-alice:operate:" + operateToken + "\nreader:read:" + readToken + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	api, err := httpapi.New(httpapi.Config{Store: st, Jobs: p.steps, Starter: a.local, Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	a.srv = httptest.NewServer(api)
	t.Cleanup(func() {
		a.srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a.local.Shutdown(ctx)
	})
	return a
}

// failedProbe starts the probe run of 2026-11-28 through the API and
// waits for its first attempt to fail.
func failedProbe(t *testing.T, a *testAPI) {
	t.Helper()
	expect(t, "start", a.do("POST", "/api/v1/runs", operateToken, start("probe", "2026-11-28")), http.StatusCreated)
	a.wait("probe/2026-11-28")
	if info, err := a.st.Run(context.Background(), "probe/2026-11-28"); err != nil || info.Run.Status != checkpoint.RunFailed {
		t.Fatalf("the probe's first attempt: %+v, %v; want failed", info.Run, err)
	}
}

// A resume's audit record is in the store before its first step runs:
// it commits with the claim.
func TestResumeIsAuditedBeforeAnyStepRuns(t *testing.T) {
	st := checkpointtest.Open(t)
	p := newProbe(st)
	a := probeAPI(t, st, p, st)
	failedProbe(t, a)
	rs := a.do("POST", "/api/v1/runs/probe/2026-11-28/resume", operateToken, reason("the ledger reopened"))
	expect(t, "resume", rs, http.StatusOK)
	a.wait("probe/2026-11-28")
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.saw) != 2 || !slices.Equal(p.saw[1], []string{"resume"}) {
		t.Errorf("the audit log as the steps saw it: %q; want nothing on the first attempt, then the resume before the resumed step ran", p.saw)
	}
}

// A resume whose audit record cannot be written did not happen: the API
// refuses it, and the run is as it was: not claimed, no new attempt, no
// step executed, no record.
func TestResumeWhoseAuditCannotBeWrittenDoesNotHappen(t *testing.T) {
	st := checkpointtest.Open(t)
	p := newProbe(st)
	failedProbe(t, probeAPI(t, st, p, st))
	before, err := st.Run(context.Background(), "probe/2026-11-28")
	if err != nil {
		t.Fatal(err)
	}
	a := probeAPI(t, st, p, auditRefusing{st})
	for _, verb := range []string{"resume", "rerun"} {
		rs := a.do("POST", "/api/v1/runs/probe/2026-11-28/"+verb, operateToken, reason("the ledger reopened"))
		if rs.Status < 400 {
			t.Fatalf("%s whose audit record cannot be written: %d %s; want it refused", verb, rs.Status, rs.Raw)
		}
		if !strings.Contains(rs.str("error"), "audit record") {
			t.Errorf("%s refused with %q; want it to say the audit record could not be kept", verb, rs.str("error"))
		}
	}
	after, err := st.Run(context.Background(), "probe/2026-11-28")
	if err != nil {
		t.Fatal(err)
	}
	if r := after.Run; r.Status != checkpoint.RunFailed || r.Fence != before.Run.Fence || r.LeaseOwner != "" || len(after.Attempts) != len(before.Attempts) {
		t.Errorf("after the refused resume the run is %s at fence %d (owner %q) with %d attempts; want it as it was: failed at fence %d, no owner, %d attempts",
			r.Status, r.Fence, r.LeaseOwner, len(after.Attempts), before.Run.Fence, len(before.Attempts))
	}
	if n := p.runs.Load(); n != 1 {
		t.Errorf("the step ran %d times; want once (the first attempt only)", n)
	}
	if as, err := st.Audits(context.Background(), "probe/2026-11-28"); err != nil || len(as) != 0 {
		t.Errorf("audit log after the refused resume: %+v, %v; want it empty", as, err)
	}
}
