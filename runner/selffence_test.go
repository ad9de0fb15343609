package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/steps"
)

// The self-fencing tests run on a sleepClock: every heartbeat, retry and
// the self-fence deadline move only when the test wakes them, so the
// times asserted are exact and nothing sleeps for real.

const fenceLease = 3 * time.Second // renewals every 1s; the default margin is 1s

var fenceStart = time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)

// outsideSystem stands for a payment provider the test job calls: it
// records each call's key and the fake time it came.
type outsideSystem struct {
	mu    sync.Mutex
	clock *sleepClock
	calls []outsideCall
}

type outsideCall struct {
	key string
	at  time.Time
}

func (o *outsideSystem) call(key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls = append(o.calls, outsideCall{key: key, at: o.clock.Now()})
}

func (o *outsideSystem) count(key string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, c := range o.calls {
		if c.key == key {
			n++
		}
	}
	return n
}

func (o *outsideSystem) all() []outsideCall {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]outsideCall(nil), o.calls...)
}

// fenceJob is the test job: an outside call (pay-1), a step that calls
// the outside system once per poke until the test finishes it or its
// context ends (work), and another outside call (pay-2).
type fenceJob struct {
	clock  *sleepClock
	out    *outsideSystem
	inWork chan struct{} // closed once work runs
	tick   chan struct{} // each one received: work calls the outside system
	ticked chan struct{}
	finish chan struct{} // closed: work returns
	seen   chan observed // what work saw when its context ended
	rerun  atomic.Bool   // work returns at once (a later attempt)
	once   sync.Once
}

type observed struct {
	at    time.Time
	cause error
}

func newFenceJob(h *harness, clock *sleepClock) *fenceJob {
	j := &fenceJob{clock: clock, out: &outsideSystem{clock: clock}, inWork: make(chan struct{}),
		tick: make(chan struct{}), ticked: make(chan struct{}), finish: make(chan struct{}), seen: make(chan observed, 1)}
	pay := func(ctx context.Context, key string) (string, error) {
		j.out.call(key)
		return "paid", nil
	}
	h.body = func(ctx context.Context, run *steps.Run, _ jobParams) error {
		if _, err := steps.Call(ctx, run, "pay-1", pay); err != nil {
			return err
		}
		if _, err := steps.Do(ctx, run, "work", j.work); err != nil {
			return err
		}
		_, err := steps.Call(ctx, run, "pay-2", pay)
		return err
	}
	return j
}

func (j *fenceJob) work(ctx context.Context) (int, error) {
	if j.rerun.Load() {
		return 0, nil
	}
	j.once.Do(func() { close(j.inWork) })
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			j.seen <- observed{at: j.clock.Now(), cause: context.Cause(ctx)}
			return n, ctx.Err()
		case <-j.tick:
			j.out.call("work")
			j.ticked <- struct{}{}
		case <-j.finish:
			return n, nil
		}
	}
}

// poke makes work call the outside system once, and waits for it.
func (j *fenceJob) poke(t *testing.T) {
	t.Helper()
	select {
	case j.tick <- struct{}{}:
	case <-time.After(10 * time.Second):
		t.Fatal("work did not take the poke")
	}
	<-j.ticked
}

// waitWork waits until the run is inside work.
func (j *fenceJob) waitWork(t *testing.T, done <-chan struct{}) {
	t.Helper()
	select {
	case <-j.inWork:
	case <-done:
		t.Fatal("the run ended before its work step")
	case <-time.After(10 * time.Second):
		t.Fatal("the run did not reach its work step")
	}
}

type runOutcome struct {
	res runner.Result
	err error
}

// start runs the test job on r in the background; done closes when Run
// returns, and outcome then holds what it returned.
func start(r *runner.Runner) (done chan struct{}, outcome *runOutcome) {
	done, outcome = make(chan struct{}), &runOutcome{}
	go func() {
		defer close(done)
		outcome.res, outcome.err = r.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
	}()
	return done, outcome
}

// wakeUntilDone wakes the clock's sleepers one after another until the run
// ends, and returns the fake times it woke them at.
func wakeUntilDone(t *testing.T, clock *sleepClock, done <-chan struct{}) []time.Time {
	t.Helper()
	var woke []time.Time
	for i := 0; ; i++ {
		if i > 100 {
			t.Fatalf("the run did not end after 100 wake-ups (fake time %s)", clock.Now())
		}
		at, ok := clock.wakeNext(t, done)
		if !ok {
			return woke
		}
		woke = append(woke, at)
	}
}

// logLines are a run's JSON log lines.
func logLines(t *testing.T, buf *syncBuf) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(buf.Bytes())), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	return lines
}

func linesAt(lines []map[string]any, level, msgPart string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		if l["level"] == level && strings.Contains(l["message"].(string), msgPart) {
			out = append(out, l)
		}
	}
	return out
}

// proxiedStore opens a PostgreSQL store on a fresh schema through a
// tcpProxy, and a second handle on the same schema straight to the server,
// both computing leases from the caller's (fake) clock.
func proxiedStore(t *testing.T) (st *postgres.Store, direct checkpoint.Backend, proxy *tcpProxy) {
	t.Helper()
	schema := pgtest.Schema(t)
	u, err := url.Parse(schema)
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5432")
	}
	proxy = startProxy(t, target)
	st, err = postgres.Open(context.Background(), postgres.Config{URL: proxy.ProxyURL(t, schema), CallerClock: true,
		ConnectTimeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("open the store through the proxy: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st, checkpointtest.OpenLocation(t, schema), proxy
}

// A runner whose database becomes unreachable keeps calling outside
// systems while its lease lasts, retries its heartbeat, and at the lease's
// known expiry less the margin cancels its attempt with a
// *runner.LeaseLostError: no outside call after it, the run returns the
// error, and once the lease expires another runner takes the run over.
func TestSelfFenceWhenDatabaseUnreachable(t *testing.T) {
	st, direct, proxy := proxiedStore(t)
	h := newHarnessOn(t, st)
	clock := newSleepClock(fenceStart)
	j := newFenceJob(h, clock)
	var logs syncBuf
	r := h.runner(func(c *runner.Config) { c.Clock, c.Lease, c.Logger = clock, fenceLease, zerolog.New(&logs) })
	done, outcome := start(r)
	j.waitWork(t, done)

	// One renewal goes through: the lease now ends at 4s, the self-fence
	// time is 3s.
	if at, ok := clock.wakeNext(t, done); !ok || !at.Equal(fenceStart.Add(time.Second)) {
		t.Fatalf("first heartbeat at %s (run ended: %t); want at 1s", at, !ok)
	}
	clock.waitSleeper(t, done)
	expiry := fenceStart.Add(4 * time.Second)
	if info, err := direct.Run(context.Background(), testRunID); err != nil || !info.Run.LeaseUntil.Equal(expiry) {
		t.Fatalf("lease after the first heartbeat: %+v, %v; want until %s", info.Run, err, expiry)
	}
	j.poke(t)

	// The database becomes unreachable; the lease still holds, so the step
	// goes on calling the outside system.
	proxy.Cut()
	j.poke(t)
	woke := wakeUntilDone(t, clock, done)

	fenceAt := expiry.Add(-fenceLease / 3)
	if len(woke) < 2 || !woke[0].Equal(fenceStart.Add(2*time.Second)) || !woke[len(woke)-1].Equal(fenceAt) {
		t.Errorf("heartbeat woke at %v; want at 2s, retries, and last at the self-fence time %s", woke, fenceAt)
	}
	var seen observed
	select {
	case seen = <-j.seen:
	default:
		t.Fatal("the work step's context did not end")
	}
	var lost *runner.LeaseLostError
	if !errors.As(seen.cause, &lost) || !seen.at.Equal(fenceAt) {
		t.Fatalf("work's context ended at %s with cause %v; want at %s with a *runner.LeaseLostError", seen.at, seen.cause, fenceAt)
	}
	if !lost.Expiry.Equal(expiry) || lost.Margin != fenceLease/3 || lost.Failures < 1 || lost.LastErr == nil ||
		lost.RunID != testRunID || lost.Attempt != 1 {
		t.Errorf("cause = %+v; want run %s attempt 1, expiry %s, margin 1s, at least one failure with its error", lost, testRunID, expiry)
	}

	err, res := outcome.err, outcome.res
	if !errors.Is(err, runner.ErrLeaseLost) || !strings.Contains(err.Error(), "self-fenced") ||
		!strings.Contains(err.Error(), "could not be recorded") {
		t.Errorf("run returned %v; want runner.ErrLeaseLost, naming the self-fencing and the unrecorded end", err)
	}
	if errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("run returned %v; want it not to claim another runner fenced it", err)
	}
	if res.Status != checkpoint.RunRunning || res.Attempt != 1 {
		t.Errorf("result = %+v; want attempt 1, still running (nothing recorded)", res)
	}

	// No outside call after the self-fence time, and none after it ends.
	if n1, nw, n2 := j.out.count(testRunID+"/pay-1"), j.out.count("work"), j.out.count(testRunID+"/pay-2"); n1 != 1 || nw != 2 || n2 != 0 {
		t.Errorf("outside calls: pay-1 %d, work %d, pay-2 %d; want 1, 2, 0", n1, nw, n2)
	}
	for _, c := range j.out.all() {
		if !c.at.Before(fenceAt) {
			t.Errorf("outside call %s at %s, at or after the self-fence time %s", c.key, c.at, fenceAt)
		}
	}
	select {
	case j.tick <- struct{}{}:
		t.Error("the work step still takes pokes after the run returned")
	case <-time.After(50 * time.Millisecond):
	}

	lines := logLines(t, &logs)
	if errs := linesAt(lines, "error", ""); len(errs) != 1 || !strings.Contains(errs[0]["message"].(string), "self-fenced") ||
		errs[0]["heartbeat_error"] == nil {
		t.Errorf("error log lines = %v; want exactly one, on the self-fencing, with the last heartbeat error", errs)
	}
	if warns := linesAt(lines, "warn", "heartbeat failed"); len(warns) != len(woke)-1 {
		t.Errorf("%d heartbeat failure warnings; want one per failed renewal (%d)", len(warns), len(woke)-1)
	}

	// The run stays marked running under the lost attempt until its lease
	// expires; then another runner takes it over and finishes it.
	proxy.Restore()
	info, err := direct.Run(context.Background(), testRunID)
	if err != nil || info.Run.Status != checkpoint.RunRunning || info.Run.LeaseOwner != "test:1" || !info.Run.LeaseUntil.Equal(expiry) {
		t.Fatalf("run after the self-fencing = %+v, %v; want running under test:1 until %s", info.Run, err, expiry)
	}
	clock.Advance(expiry.Sub(clock.Now()))
	j.rerun.Store(true)
	r2, err := runner.New(runner.Config{Store: direct, Jobs: h.reg, Owner: "test:2", Clock: clock, Lease: fenceLease})
	if err != nil {
		t.Fatal(err)
	}
	res2, err := r2.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
	if err != nil || res2.Status != checkpoint.RunSucceeded || res2.Attempt != 2 || res2.TookOverFrom != "test:1" {
		t.Fatalf("takeover = %+v, %v; want attempt 2 succeeded, taken over from test:1", res2, err)
	}
	if n1, n2 := j.out.count(testRunID+"/pay-1"), j.out.count(testRunID+"/pay-2"); n1 != 1 || n2 != 1 {
		t.Errorf("outside calls after the takeover: pay-1 %d, pay-2 %d; want each once", n1, n2)
	}
}

// Heartbeats that fail while the database is unreachable, and succeed
// again before the self-fence time, do not stop the run.
func TestHeartbeatRecoversBeforeSelfFence(t *testing.T) {
	st, direct, proxy := proxiedStore(t)
	h := newHarnessOn(t, st)
	clock := newSleepClock(fenceStart)
	j := newFenceJob(h, clock)
	var logs syncBuf
	r := h.runner(func(c *runner.Config) { c.Clock, c.Lease, c.Logger = clock, fenceLease, zerolog.New(&logs) })
	done, outcome := start(r)
	j.waitWork(t, done)

	proxy.Cut()
	if at, ok := clock.wakeNext(t, done); !ok || !at.Equal(fenceStart.Add(time.Second)) {
		t.Fatalf("first heartbeat at %s (run ended: %t); want at 1s", at, !ok)
	}
	clock.waitSleeper(t, done) // it failed and waits to retry
	proxy.Restore()

	// Retries until one goes through (the pool may first spend connections
	// the cut left dead), all before the self-fence time of 2s.
	oldExpiry, fenceAt := fenceStart.Add(fenceLease), fenceStart.Add(2*time.Second)
	for {
		at, ok := clock.wakeNext(t, done)
		if !ok {
			t.Fatalf("the run ended while its heartbeat retried: %v", outcome.err)
		}
		if !at.Before(fenceAt) {
			t.Fatalf("no renewal went through by %s", at)
		}
		clock.waitSleeper(t, done)
		info, err := direct.Run(context.Background(), testRunID)
		if err != nil {
			t.Fatal(err)
		}
		if info.Run.LeaseUntil.After(oldExpiry) {
			break
		}
	}
	// Past the old expiry, the run goes on under its renewed lease.
	for clock.Now().Before(oldExpiry.Add(time.Second)) {
		if _, ok := clock.wakeNext(t, done); !ok {
			t.Fatalf("the run ended after its heartbeat recovered: %v", outcome.err)
		}
	}
	clock.waitSleeper(t, done)
	j.poke(t)
	close(j.finish)
	<-done
	if outcome.err != nil || outcome.res.Status != checkpoint.RunSucceeded {
		t.Fatalf("run = %+v, %v; want succeeded", outcome.res, outcome.err)
	}
	select {
	case seen := <-j.seen:
		t.Errorf("work's context ended at %s: %v; want it never cancelled", seen.at, seen.cause)
	default:
	}
	if n := j.out.count(testRunID + "/pay-2"); n != 1 {
		t.Errorf("pay-2 called %d times; want once", n)
	}
	lines := logLines(t, &logs)
	if errs := linesAt(lines, "error", ""); len(errs) != 0 {
		t.Errorf("error log lines = %v; want none", errs)
	}
	if w, i := linesAt(lines, "warn", "heartbeat failed"), linesAt(lines, "info", "renewed the lease again"); len(w) < 1 || len(i) != 1 {
		t.Errorf("%d heartbeat failure warnings, %d recoveries logged; want at least one, and one", len(w), len(i))
	}
}

// errUnreachable is what failingHeartbeats' renewals fail with.
var errUnreachable = errors.New("injected: the database is unreachable")

// failingHeartbeats is a real store whose lease renewals fail while fail
// is set; every other call goes to the store.
type failingHeartbeats struct {
	checkpoint.Backend
	fail  atomic.Bool
	tries atomic.Int32
}

func (s *failingHeartbeats) Heartbeat(ctx context.Context, l checkpoint.Lease, now, until time.Time) error {
	if s.fail.Load() {
		s.tries.Add(1)
		return errUnreachable
	}
	return s.Backend.Heartbeat(ctx, l, now, until)
}

// On any store: renewals that keep failing make the runner fence itself at
// the claim's expiry less a custom margin; with the database still
// answering, the attempt is recorded interrupted, so the next run goes on
// at once.
func TestSelfFenceRecordsInterrupted(t *testing.T) {
	st := &failingHeartbeats{Backend: checkpointtest.Open(t)}
	h := newHarnessOn(t, st)
	clock := newSleepClock(fenceStart)
	j := newFenceJob(h, clock)
	const margin = 1500 * time.Millisecond
	r := h.runner(func(c *runner.Config) { c.Clock, c.Lease, c.SelfFenceMargin = clock, fenceLease, margin })
	done, outcome := start(r)
	j.waitWork(t, done)

	st.fail.Store(true)
	woke := wakeUntilDone(t, clock, done)
	fenceAt := fenceStart.Add(fenceLease - margin)
	if len(woke) < 2 || !woke[0].Equal(fenceStart.Add(time.Second)) || !woke[len(woke)-1].Equal(fenceAt) {
		t.Errorf("heartbeat woke at %v; want at 1s, retries, and last at %s", woke, fenceAt)
	}
	seen := <-j.seen
	var lost *runner.LeaseLostError
	if !errors.As(seen.cause, &lost) || !seen.at.Equal(fenceAt) {
		t.Fatalf("work's context ended at %s with %v; want at %s with a *runner.LeaseLostError", seen.at, seen.cause, fenceAt)
	}
	if !lost.Expiry.Equal(fenceStart.Add(fenceLease)) || lost.Margin != margin || lost.Failures != int(st.tries.Load()) {
		t.Errorf("cause = %+v; want the claim's expiry, margin %s, %d failures", lost, margin, st.tries.Load())
	}
	err, res := outcome.err, outcome.res
	if !errors.Is(err, runner.ErrLeaseLost) || !errors.Is(err, errUnreachable) || !strings.Contains(err.Error(), "recorded as interrupted") {
		t.Errorf("run returned %v; want ErrLeaseLost wrapping the heartbeat's error, recorded as interrupted", err)
	}
	if res.Status != checkpoint.RunInterrupted {
		t.Errorf("result status = %q; want interrupted", res.Status)
	}
	info := h.info()
	if info.Run.Status != checkpoint.RunInterrupted || info.Run.LeaseOwner != "" || len(info.Attempts) != 1 ||
		info.Attempts[0].Status != checkpoint.RunInterrupted || !strings.Contains(info.Attempts[0].Error, "self-fenced") {
		t.Errorf("recorded run = %+v, attempts %+v; want interrupted, lease released, the attempt naming the self-fencing", info.Run, info.Attempts)
	}
	if n := j.out.count(testRunID + "/pay-2"); n != 0 {
		t.Errorf("pay-2 called %d times after the self-fencing; want none", n)
	}

	// The database answers again: the next run goes on at once.
	st.fail.Store(false)
	j.rerun.Store(true)
	res, err = r.Run(context.Background(), runner.Request{Job: "job", Values: testValues})
	if err != nil || res.Status != checkpoint.RunSucceeded || res.Attempt != 2 {
		t.Fatalf("next run = %+v, %v; want attempt 2 succeeded", res, err)
	}
	if n1, n2 := j.out.count(testRunID+"/pay-1"), j.out.count(testRunID+"/pay-2"); n1 != 1 || n2 != 1 {
		t.Errorf("outside calls: pay-1 %d, pay-2 %d; want each once", n1, n2)
	}
}

// A renewal refused because another runner took the run over cancels the
// attempt at once with checkpoint.ErrFenced, not at the self-fence time.
func TestHeartbeatFenceCancelsAtOnce(t *testing.T) {
	h := newHarness(t)
	clock := newSleepClock(fenceStart)
	j := newFenceJob(h, clock)
	r := h.runner(func(c *runner.Config) { c.Clock, c.Lease = clock, fenceLease })
	done, outcome := start(r)
	j.waitWork(t, done)
	if _, err := h.claimAs("other:9", fenceStart.Add(time.Hour), time.Hour); err != nil {
		t.Fatalf("takeover: %v", err)
	}
	woke := wakeUntilDone(t, clock, done)
	if len(woke) != 1 || !woke[0].Equal(fenceStart.Add(time.Second)) {
		t.Errorf("heartbeat woke at %v; want once, at 1s", woke)
	}
	seen := <-j.seen
	if !errors.Is(seen.cause, checkpoint.ErrFenced) || errors.Is(seen.cause, runner.ErrLeaseLost) || !seen.at.Equal(woke[0]) {
		t.Errorf("work's context ended at %s with %v; want at 1s with checkpoint.ErrFenced", seen.at, seen.cause)
	}
	if !errors.Is(outcome.err, checkpoint.ErrFenced) || errors.Is(outcome.err, runner.ErrLeaseLost) {
		t.Errorf("run returned %v; want checkpoint.ErrFenced", outcome.err)
	}
}
