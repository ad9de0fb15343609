package cmd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// These tests hold outside calls and lease owners to their promise with
// real processes: a payment provider on 127.0.0.1 (in this test process)
// counts every call, runners are paused with SIGSTOP past their lease, run
// in another PID namespace (unshare), and killed with SIGKILL.

// callJobs are this file's test jobs; testRegistry registers them.
var callJobs = []jobs.Job{providerJob}

// providerParams are the parameters of the provider job: one outside call
// ("pay") to an HTTP payment provider, then a step using its receipt.
type providerParams struct {
	Key       string        `param:"key,key" help:"run key"`
	URL       string        `param:"url,required" help:"the provider: POST URL/pay pays, GET URL/pay?key=KEY looks a payment up"`
	Timeout   time.Duration `param:"timeout" default:"0s" help:"the call's timeout (0: none but the lease's)"`
	Reconcile bool          `param:"reconcile" default:"true" help:"settle an unknown outcome by looking the payment up"`
	// Deaf makes the call ignore its context, as careless client code
	// does: only a check before calling can then stop it.
	Deaf bool `param:"deaf" default:"false" help:"the call ignores its context"`
}

var providerJob = jobs.Define("provider", func(ctx context.Context, run *steps.Run, p providerParams) error {
	var opts []steps.Option
	if p.Timeout > 0 {
		opts = append(opts, steps.Timeout(p.Timeout))
	}
	if p.Reconcile {
		opts = append(opts, steps.Reconcile(func(ctx context.Context, key string) (any, bool, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/pay?key="+url.QueryEscape(key), nil)
			if err != nil {
				return nil, false, err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return nil, false, err
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			switch {
			case err != nil:
				return nil, false, err
			case resp.StatusCode == http.StatusNotFound:
				return nil, false, nil
			case resp.StatusCode != http.StatusOK:
				return nil, false, fmt.Errorf("lookup: %s", resp.Status)
			}
			return string(body), true, nil
		}))
	}
	receipt, err := steps.Call(ctx, run, "pay", func(ctx context.Context, key string) (string, error) {
		if p.Deaf {
			ctx = context.WithoutCancel(ctx)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/pay", nil)
		if err != nil {
			return "", steps.Permanent(err)
		}
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return "", ctx.Err() // cut off: its outcome is unknown
			}
			return "", steps.OutcomeUnknown(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		switch {
		case err != nil:
			return "", steps.OutcomeUnknown(err)
		case resp.StatusCode == http.StatusServiceUnavailable:
			return "", steps.Transient(errors.New(resp.Status))
		case resp.StatusCode != http.StatusOK:
			return "", fmt.Errorf("pay: %s", resp.Status)
		}
		return string(body), nil
	}, opts...)
	if err != nil {
		return err
	}
	_, err = steps.Do(ctx, run, "record", func(ctx context.Context) (string, error) { return "recorded " + receipt, nil })
	return err
}, jobs.Help("test job: a payment through an HTTP provider, then a step using its receipt"),
	jobs.Retry(steps.RetryPolicy{MaxTries: 3, Initial: time.Millisecond, Jitter: steps.NoJitter}))

// provider is a payment provider on 127.0.0.1 that records every call.
type provider struct {
	t   *testing.T
	srv *httptest.Server

	mu      sync.Mutex
	calls   []string // idempotency keys of the POSTs, in order
	lookups int
	// busy answers the first busy POSTs 503 without taking the payment;
	// hang makes the first POST take the payment and then not answer
	// until the caller gives up; failLookups answers lookups 500.
	busy        int
	hang        bool
	failLookups bool
}

func newProvider(t *testing.T) *provider {
	p := &provider{t: t}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	if !strings.HasPrefix(p.srv.URL, "http://127.0.0.1:") {
		t.Fatalf("provider at %s, want 127.0.0.1", p.srv.URL)
	}
	return p
}

func (p *provider) serve(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	if r.Method == http.MethodGet {
		p.lookups++
		key := r.URL.Query().Get("key")
		paid, fail := slices.Contains(p.calls, key), p.failLookups
		p.mu.Unlock()
		switch {
		case fail:
			http.Error(w, "lookups are down", http.StatusInternalServerError)
		case paid:
			fmt.Fprint(w, "receipt:"+key)
		default:
			http.NotFound(w, r)
		}
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if p.busy > 0 {
		p.busy--
		p.mu.Unlock()
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return
	}
	p.calls = append(p.calls, key)
	hang := p.hang && len(p.calls) == 1
	p.mu.Unlock()
	if hang {
		<-r.Context().Done() // the payment is taken; the answer never comes
		return
	}
	fmt.Fprint(w, "receipt:"+key)
}

// set changes how the provider behaves.
func (p *provider) set(f func(*provider)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

// lookupCount returns how many lookups the provider answered.
func (p *provider) lookupCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lookups
}

// paid returns the idempotency keys of the payments taken.
func (p *provider) paid() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

func providerArgs(db, url string, more ...string) []string {
	args := []string{"--db", db, "run", "provider", "-p", "key=k", "-p", "url=" + url}
	for _, m := range more {
		if strings.HasPrefix(m, "--") {
			args = append(args, m)
		} else {
			args = append(args, "-p", m)
		}
	}
	return args
}

// TestPausedRunnerDoesNotCallAfterLosingItsLease is the case (b):
// runner A records its intent to pay and is paused (SIGSTOP) right before
// calling, past its lease. Runner B takes over once the lease has run out,
// reconciles (nothing found) and pays. When A wakes (SIGCONT) it checks its
// lease before calling, finds it lost, and stops: one payment. A's call
// ignores its context, so A's heartbeat noticing the lost lease (and
// cancelling the run) cannot be what saves the day.
func TestPausedRunnerDoesNotCallAfterLosingItsLease(t *testing.T) {
	t.Parallel()
	prov := newProvider(t)
	db, _ := testFiles(t)
	args := providerArgs(db, prov.srv.URL, "deaf=true", "--lease=1s")

	a := startChild(t, []string{crashtest.PauseAt("step:pay:after-intent")}, nil, args...)
	a.WaitFor("runner A paused before its call", a.Stopped)
	if s := readRun(t, db, "provider/k").steps["pay"]; s.Status != checkpoint.StepCalling {
		t.Fatalf("pay is %q while A is paused, want %q (its intent recorded)\nA's stderr:\n%s", s.Status, checkpoint.StepCalling, a.Stderr())
	}

	// B is not let in while A's lease lasts (A's process is alive), then
	// takes over, reconciles and pays.
	b, got := runChild(t, nil, append(args, "--wait")...)
	b.WantExit(got, exited0)
	if !strings.Contains(b.Stderr(), "took over") || !strings.Contains(b.Stdout(), "run provider/k succeeded (attempt 2)") {
		t.Errorf("runner B: stdout %q, stderr %q; want a takeover and success", b.Stdout(), b.Stderr())
	}
	if n := prov.lookupCount(); n != 1 {
		t.Errorf("B looked the payment up %d times, want once (reconciling A's intent)", n)
	}
	if got := prov.paid(); len(got) != 1 {
		t.Fatalf("payments after B = %q, want one", got)
	}

	// A wakes: it must not pay.
	if err := a.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	a.WantExit(a.Wait(), crashtest.Code(ExitHeld))
	if !strings.Contains(a.Stderr(), "lease lost") {
		t.Errorf("runner A's stderr = %q, want it to say its lease was lost", a.Stderr())
	}
	if got := prov.paid(); len(got) != 1 || got[0] != "provider/k/pay" {
		t.Fatalf("payments = %q, want exactly one, with key provider/k/pay: the paused runner paid after losing its lease", got)
	}
	s := readRun(t, db, "provider/k")
	if r := s.info.Run; r.Status != checkpoint.RunSucceeded || string(s.steps["pay"].Output) != `"receipt:provider/k/pay"` {
		t.Errorf("run %s, pay output %s; want succeeded with B's receipt", r.Status, s.steps["pay"].Output)
	}
}

// TestRunnerInAnotherPIDNamespaceIsNotTakenOver is the case (a): a
// runner in another PID namespace with the same host name (another
// container on this node) holds a run. Its PID does not exist in this
// namespace, which the old check took for "gone"; it must keep its run
// until its lease expires. (A dead runner of this namespace is still taken
// over at once: TestKilledLeaseHolderIsTakenOver.)
func TestRunnerInAnotherPIDNamespaceIsNotTakenOver(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatalf("this test needs unshare (util-linux) to run a runner in another PID namespace: %v", err)
	}
	// The inner runner gets a PID that is free here: the namespace's next
	// PID is set through ns_last_pid before the shell starts it.
	pid := freePID(t)
	db, side := testFiles(t)
	release := filepath.Join(filepath.Dir(side), "release")
	args := crashyArgs(db, "k", side, "block="+release, "block-at=2")
	wrap := []string{"unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c",
		`echo "$0" > /proc/sys/kernel/ns_last_pid && "$@"`, strconv.Itoa(pid - 1)}
	inner := startWrappedChild(t, wrap, nil, nil, args...)
	inner.WaitFor("the inner runner inside step/2", func() bool { return readSide(t, side).ran["step/2"] == 1 })

	r := readRun(t, db, "crashy/k").info.Run
	name := fmt.Sprintf("%s:%d", hostname(t), pid)
	if checkpoint.OwnerName(r.LeaseOwner) != name {
		t.Fatalf("the inner runner holds the run as %q; want %s (is ns_last_pid writable here?)\nstderr:\n%s", r.LeaseOwner, name, inner.Stderr())
	}
	ourNS, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(r.LeaseOwner, "pidns="+strings.TrimSuffix(strings.TrimPrefix(ourNS, "pid:["), "]")) {
		t.Fatalf("owner %q records this test's PID namespace; want the inner one", r.LeaseOwner)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("PID %d exists in this namespace too (%v); the test needs it free here", pid, err)
	}
	if runner.OwnerGone(r.LeaseOwner) {
		t.Errorf("OwnerGone(%q) = true for a live runner in another PID namespace", r.LeaseOwner)
	}

	// A runner here is refused, naming the holder, and runs nothing.
	c, got := runChild(t, nil, args...)
	c.WantExit(got, crashtest.Code(ExitHeld))
	if want := "held by " + name + " until"; !strings.Contains(c.Stderr(), want) {
		t.Errorf("refused runner's stderr = %q, want it to contain %q", c.Stderr(), want)
	}
	// The listing does not call it stale, and abandon refuses it.
	cli := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Execute(context.Background(), testRegistry(), append([]string{"--db", db}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, out, _ := cli("runs"); code != ExitOK || strings.Contains(out, "stale") || !strings.Contains(out, "running") {
		t.Errorf("runs: exit %d\n%s\nwant the run listed as running, not stale", code, out)
	}
	if code, _, errs := cli("abandon", "crashy/k", "--reason", "looks dead"); code != ExitHeld || !strings.Contains(errs, "held by "+name) {
		t.Errorf("abandon of the live inner runner's run: exit %d, %q; want %d, held by %s", code, errs, ExitHeld, name)
	}

	touch(t, release)
	inner.WantExit(inner.Wait(), exited0)
	checkRan(t, readSide(t, side), 3, map[string]int{"step/1": 1, "step/2": 1, "step/3": 1})
	if s := readRun(t, db, "crashy/k"); s.info.Run.Status != checkpoint.RunSucceeded || len(s.info.Attempts) != 1 {
		t.Errorf("run %s with %d attempts; want succeeded by the inner runner alone", s.info.Run.Status, len(s.info.Attempts))
	}
}

// freePID returns a PID no process of this namespace has.
func freePID(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	max, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || max < 1000 {
		t.Fatalf("pid_max %q: %v", b, err)
	}
	for range 1000 {
		pid := max/2 + rand.IntN(max/2-10)
		if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			return pid
		}
	}
	t.Fatal("no free PID found")
	return 0
}

// TestOperatorsActAtOnceAfterKill9 is the point 6: after a kill
// -9 the run's owner is surely gone, so the listing shows it stale and
// abandon, reset, recover and resolve act at once, as run does, instead of
// refusing with "held by" for the rest of the lease.
func TestOperatorsActAtOnceAfterKill9(t *testing.T) {
	t.Parallel()
	db, side := testFiles(t)
	cli := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Execute(context.Background(), testRegistry(), append([]string{"--db", db}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	kill := func(key string) string {
		t.Helper()
		s := filepath.Join(filepath.Dir(side), key+".log")
		c := startChild(t, nil, nil, crashyArgs(db, key, s, "block="+filepath.Join(filepath.Dir(side), "never"), "block-at=2")...)
		c.WaitFor("step/2 started", func() bool { return readSide(t, s).ran["step/2"] == 1 })
		if err := c.Kill(); err != nil {
			t.Fatal(err)
		}
		c.WantExit(c.Wait(), sigkilled)
		settleKilled(t, c)
		r := readRun(t, db, jobs.RunID("crashy", key)).info.Run
		if r.Status != checkpoint.RunRunning || !time.Now().Before(r.LeaseUntil) {
			t.Fatalf("after the kill: %s until %s; want running with its 30s lease unexpired", r.Status, r.LeaseUntil)
		}
		return fmt.Sprintf("%s:%d", hostname(t), c.Pid())
	}

	owner := kill("a")
	want := "stale (runner " + owner + " is gone: its process exited)"
	if code, out, _ := cli("runs"); code != ExitOK || !strings.Contains(out, want) {
		t.Errorf("runs: exit %d\n%s\nwant %q", code, out, want)
	}
	if code, out, _ := cli("runs", "--json"); code != ExitOK || !strings.Contains(out, `"stale": true`) {
		t.Errorf("runs --json: exit %d\n%s\nwant stale", code, out)
	}
	if code, out, errs := cli("abandon", "crashy/a", "--reason", "bad input"); code != ExitOK || !strings.Contains(out, "abandoned") {
		t.Errorf("abandon after kill -9: exit %d, %q %q; want it done at once", code, out, errs)
	}

	kill("b")
	if code, out, errs := cli("reset", "crashy/b", "--step", "step/1", "--reason", "redo"); code != ExitOK || !strings.Contains(out, "cleared") {
		t.Errorf("reset after kill -9: exit %d, %q %q; want it done at once", code, out, errs)
	}
	kill("c")
	if code, out, errs := cli("recover", "crashy/c"); code != ExitOK || !strings.Contains(out, "marked failed") {
		t.Errorf("recover after kill -9 (no --force): exit %d, %q %q; want it done at once", code, out, errs)
	}

	// An outside call left in flight by a killed runner is resolved at once.
	_, outside := testFiles(t)
	pay := []string{"--db", db, "run", "pay", "-p", "key=k", "-p", "outside=" + outside}
	c, got := runChild(t, []string{crashtest.CrashAt("step:pay:after-intent")}, pay...)
	c.WantExit(got, sigkilled)
	settleKilled(t, c)
	if code, out, errs := cli("resolve", "pay/k", "--step", "pay", "--as", "retry", "--reason", "not at the provider", "--json"); code != ExitOK ||
		!strings.Contains(out, `"operation": "resolve"`) || !strings.Contains(out, `"result": "resolved as retry"`) ||
		!strings.Contains(out, `"step": "pay"`) {
		t.Errorf("resolve --json after kill -9: exit %d, %q %q; want it done at once, as one JSON object", code, out, errs)
	}
}

// TestCallTimeoutReconcilesInTheSameAttempt is the point 4: a call
// that times out after the provider took the payment is reconciled in the
// same attempt (found: the run succeeds, paid once), not stopped with exit
// 5; only when the lookup itself fails does it stop, saying a rerun
// reconciles.
func TestCallTimeoutReconcilesInTheSameAttempt(t *testing.T) {
	t.Parallel()
	t.Run("found", func(t *testing.T) {
		t.Parallel()
		prov := newProvider(t)
		prov.set(func(p *provider) { p.hang = true })
		db, _ := testFiles(t)
		c, got := runChild(t, nil, providerArgs(db, prov.srv.URL, "timeout=100ms", "--lease=1s")...)
		c.WantExit(got, exited0)
		if !strings.Contains(c.Stderr(), "outside call of unknown outcome; reconciling") {
			t.Errorf("stderr does not log the reconcile:\n%s", c.Stderr())
		}
		if got := prov.paid(); len(got) != 1 || prov.lookupCount() != 1 {
			t.Errorf("payments %q, lookups %d; want one of each", got, prov.lookupCount())
		}
		if s := readRun(t, db, "provider/k").steps["pay"]; s.Status != checkpoint.StepCompleted || string(s.Output) != `"receipt:provider/k/pay"` {
			t.Errorf("pay: %s %s; want completed with the looked-up receipt", s.Status, s.Output)
		}
	})
	t.Run("lookup fails: exit 5, a rerun reconciles", func(t *testing.T) {
		t.Parallel()
		prov := newProvider(t)
		prov.set(func(p *provider) { p.hang, p.failLookups = true, true })
		db, _ := testFiles(t)
		args := providerArgs(db, prov.srv.URL, "timeout=100ms", "--lease=1s")
		c, got := runChild(t, nil, args...)
		c.WantExit(got, crashtest.Code(ExitOperator))
		stderr := c.Stderr()
		for _, want := range []string{"its reconcile check failed: lookup: 500", "a rerun runs the check again",
			"rerun it (`stepwise resume provider/k`) to reconcile it automatically"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("stderr = %q, want it to contain %q", stderr, want)
			}
		}
		if strings.Contains(stderr, "once checked, settle it with") {
			t.Errorf("stderr advises settling by hand first, though a rerun reconciles: %q", stderr)
		}
		prov.set(func(p *provider) { p.failLookups = false })
		c, got = runChild(t, nil, "--db", db, "resume", "provider/k")
		c.WantExit(got, exited0)
		if got := prov.paid(); len(got) != 1 {
			t.Errorf("payments = %q, want one", got)
		}
	})
	t.Run("busy provider: retried with the same key", func(t *testing.T) {
		t.Parallel()
		prov := newProvider(t)
		prov.set(func(p *provider) { p.busy = 2 })
		db, _ := testFiles(t)
		c, got := runChild(t, nil, providerArgs(db, prov.srv.URL)...)
		c.WantExit(got, exited0)
		if n := strings.Count(c.Stderr(), "outside call failed; retrying with the same idempotency key"); n != 2 {
			t.Errorf("%d retry log lines, want 2\n%s", n, c.Stderr())
		}
		if got := prov.paid(); len(got) != 1 || got[0] != "provider/k/pay" {
			t.Errorf("payments = %q, want one with key provider/k/pay", got)
		}
		if s := readRun(t, db, "provider/k").steps["pay"]; s.Tries != 3 || s.Status != checkpoint.StepCompleted {
			t.Errorf("pay: %s after %d tries; want completed after 3", s.Status, s.Tries)
		}
	})
}

func TestErrorTextAddsTheOutcomeUnknownHint(t *testing.T) {
	base := &steps.OutcomeUnknownError{RunID: "pay/d", Step: "pay", Key: "pay/d/pay", Cause: "timeout"}
	got := errorText(fmt.Errorf("run pay/d failed: %w", base), "stepwise")
	if !strings.Contains(got, "once checked, settle it with `stepwise resolve pay/d --step pay --as done|retry --reason \"...\"`") || strings.Contains(got, "rerun it") {
		t.Errorf("without reconcile: %q; want the resolve command", got)
	}
	rec := *base
	rec.Reconcilable, rec.ReconcileErr = true, "lookup down"
	got = errorText(&rec, "stepwise")
	if !strings.HasPrefix(got, rec.Error()) || !strings.Contains(got, "`stepwise resume pay/d`") ||
		!strings.Contains(got, "only after checking the outside system for key pay/d/pay yourself") {
		t.Errorf("with reconcile: %q; want the rerun first, resolve only after checking", got)
	}
	if got := errorText(errors.New("plain"), "stepwise"); got != "plain" {
		t.Errorf("other errors: %q", got)
	}
}
