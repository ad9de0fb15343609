package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/stores"
	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// ScreenshotsEnv names the directory the browser test saves its
// screenshots in (default: the test's temporary directory).
const ScreenshotsEnv = "STEPWISE_SCREENSHOTS"

// chromiumPath is Debian's chromium, the only browser the test drives:
// it never downloads one.
const chromiumPath = "/usr/bin/chromium"

// BrowserEnv, set to 1, makes TestDashboardInBrowser fail instead of skip
// when chromium is missing: CI sets it once it installed chromium, so the
// test never silently stops running there.
const BrowserEnv = "STEPWISE_TEST_BROWSER"

// syncBuffer is serve's output, written by its goroutine and read by the
// test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDashboardInBrowser is the on-call operator's night from issue 14 in
// headless Chromium against the stock binary's `serve --listen --tokens`:
// a settlement failed on a transfer to an account the ledger lacks; the
// operator logs in with a token, opens the failed run, sees its rejected
// transfers and the balances it changed, has the account opened, resumes
// the run with a reason, watches the batch reach 100 % and finds the
// resume in the audit trail under the token's name. A refused operation
// shows the command line's words. Screenshots of the runs list, the run
// page (light and dark) and the schedules page go to $STEPWISE_SCREENSHOTS.
func TestDashboardInBrowser(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		msg := fmt.Sprintf("the browser test needs Debian's chromium at %s (%v): install the Debian package chromium (`apt-get install -y chromium`)", chromiumPath, err)
		if os.Getenv(BrowserEnv) == "1" {
			t.Fatalf("%s; %s=1 says it must run", msg, BrowserEnv)
		}
		t.Skipf("%s, or set %s=1 to make its absence a failure (.ci/run does)", msg, BrowserEnv)
	}
	shots := os.Getenv(ScreenshotsEnv)
	if shots == "" {
		shots = t.TempDir()
	} else if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}

	// The failed settlement: transfer 650a credits an account the ledger
	// lacks, so its chunk (the seventh of 100) fails the run; the six
	// before it posted, some transfers rejected for overdraft.
	db := testDB(t)
	ledger := openTestLedger(t, db)
	ctx := context.Background()
	const date = "2026-11-28"
	const missing = "A-9999999"
	if err := settlement.Seed(ctx, ledger, settlement.SeedConfig{Accounts: 50, Transfers: 800, Date: date, Seed: 7, Balance: 10_000}); err != nil {
		t.Fatal(err)
	}
	if _, err := ledger.ExecContext(ctx, `INSERT INTO transfers (id, business_date, from_account, to_account, amount) VALUES ($1, $2, $3, $4, $5)`,
		settlement.TransferID(date, 650)+"a", date, settlement.AccountID(1), missing, 5); err != nil {
		t.Fatal(err)
	}
	runID := "settle/" + date
	if code, _, stderr := stepwise(t, "--db", db, "run", "settle", "-p", "date="+date, "-p", "chunk=100"); code == cmd.ExitOK || !strings.Contains(stderr, missing) {
		t.Fatalf("settle with a missing account: exit %d, stderr:\n%s\nwant it to fail naming %s", code, stderr, missing)
	}
	st, err := stores.Open(ctx, db, stores.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	failed, err := ops.Show(ctx, st, runID, ops.ShowOptions{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rejected, err := ops.Items(ctx, st, ops.ItemsQuery{RunID: runID, Status: checkpoint.StepRejected, Limit: 1}, failed.Batches)
	if err != nil || len(rejected.Items) != 1 {
		t.Fatalf("the failed run's rejected items: %+v, %v; the seeded ledger should overdraw some", rejected, err)
	}

	// serve, in this process, with a tokens file.
	const token = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("oncall:operate:"+token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	serveCtx, stop := context.WithCancel(ctx)
	var out syncBuffer
	served := make(chan int, 1)
	go func() {
		served <- cmd.Execute(serveCtx, registry(), []string{"--db", db, "serve", "--listen", "127.0.0.1:0", "--tokens", tokens},
			&out, &out, extraCommands()...)
	}()
	defer func() {
		stop()
		if code := <-served; code != cmd.ExitOK {
			t.Errorf("serve exited %d:\n%s", code, out.String())
		}
	}()
	addr := regexp.MustCompile(`/metrics on http://(127\.0\.0\.1:\d+)`)
	var base string
	for deadline := time.Now().Add(10 * time.Second); base == ""; {
		if m := addr.FindStringSubmatch(out.String()); m != nil {
			base = "http://" + m[1]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve printed no address in 10s:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	browser, cancel := newBrowser(t)
	defer cancel()
	bctx, cancelRun := context.WithTimeout(browser, 45*time.Second)
	defer cancelRun()
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, actions...); err != nil {
			t.Fatalf("%s: %v\nserve's output:\n%s", what, err, out.String())
		}
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	viewShot := func(name string) { // what the screen shows, e.g. an open dialog
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	textOf := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("read %s: %v\nserve's output:\n%s", sel, err, out.String())
		}
		return strings.Join(strings.Fields(s), " ")
	}

	// The run's page sends the browser to log in first, then back.
	run("open the run",
		chromedp.Navigate(base+"/runs/"+runID),
		chromedp.WaitVisible(chromedp.ID("token")),
	)
	viewShot("login.png")
	run("log in",
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.CSS(`#login button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("run-h")),
	)
	if got := textOf("#summary"); !strings.Contains(got, runID+" failed") || !strings.Contains(got, missing) {
		t.Errorf("the run's summary reads %q; want %s failed, naming %s", got, runID, missing)
	}
	if got := textOf(".who"); !strings.Contains(got, "Signed in as oncall operate") {
		t.Errorf("the header reads %q; want it signed in as oncall", got)
	}
	b := failed.Batches[0]
	if got := textOf("#rejected"); !strings.Contains(got, fmt.Sprintf("Rejected items %d", b.Rejected)) ||
		!strings.Contains(got, rejected.Items[0].ID) || !strings.Contains(got, strings.Join(strings.Fields(rejected.Items[0].Reason), " ")) {
		t.Errorf("the rejected items read %q; want %d of them, %s first with its reason %q", got, b.Rejected, rejected.Items[0].ID, rejected.Items[0].Reason)
	}
	// Effects: typing a key keeps its row only.
	key := settlement.AccountID(7)
	run("search the effects", chromedp.SendKeys(chromedp.ID("effects-search"), key))
	visible, err := chromedp.Run(bctx, chromedp.Evaluate[int](`[...document.querySelectorAll("#effects-table tbody tr[data-key]")].filter(tr => !tr.hidden).length`))
	if err != nil {
		t.Fatal(err)
	}
	if row := textOf(`#effects-table tr[data-key="` + key + `"]`); visible != 1 || !strings.Contains(row, key+" 10 000") {
		t.Errorf("searching the effects for %s leaves %d rows, its own %q; want 1, from 10 000", key, visible, row)
	}
	run("clear the search", chromedp.Evaluate[chromedp.Void](`(() => { const i = document.getElementById("effects-search");
		i.value = ""; i.dispatchEvent(new Event("input")); i.blur(); })()`))
	shot("run-failed.png")

	// The account is opened; the operator resumes the run with a reason.
	if _, err := ledger.ExecContext(ctx, `INSERT INTO accounts (id, balance, version) VALUES ($1, 0, 0)`, missing); err != nil {
		t.Fatal(err)
	}
	const reason = "treasury opened account A-9999999"
	run("resume with a reason",
		chromedp.Click(chromedp.CSS(`button[data-op="resume"]`)),
		chromedp.WaitVisible(chromedp.ID("op-reason")),
		chromedp.SendKeys(chromedp.ID("op-reason"), reason),
	)
	viewShot("prompt.png")
	run("submit the resume", chromedp.Click(chromedp.ID("op-submit")), chromedp.WaitVisible(chromedp.ID("op-done")))
	// The page follows the attempt until the batch is done.
	run("watch the progress reach 100 %",
		chromedp.Poll[chromedp.Void](`(() => { const p = document.querySelector('progress[data-step="post"]');
			return p && p.value === 100 && document.querySelector("#summary .s-succeeded") !== null; })()`,
			chromedp.WithPollingTimeout(20*time.Second)),
	)
	if got := textOf("#progress"); !strings.Contains(got, "100.0 %") {
		t.Errorf("the progress reads %q; want 100.0 %%", got)
	}
	if got := textOf("#audit"); !strings.Contains(got, "oncall resume "+reason) {
		t.Errorf("the audit trail reads %q; want oncall's resume with the reason", got)
	}
	shot("run.png")
	run("the run page in the dark", colorScheme("dark"))
	shot("run-dark.png")
	run("back to the light", colorScheme("light"))

	// A refused operation shows the command line's words.
	_, refusal := ops.Abandon(ctx, st, ops.Who{Operator: "test", Reason: "check"}, runID, time.Now())
	if refusal == nil {
		t.Fatal("abandoning a succeeded run was not refused")
	}
	run("abandon a succeeded run",
		chromedp.Click(chromedp.CSS(`button[data-op="abandon"]`)),
		chromedp.SendKeys(chromedp.ID("op-reason"), "wrong ledger"),
		chromedp.Click(chromedp.ID("op-submit")),
		chromedp.WaitVisible(chromedp.ID("op-error")),
	)
	shown := textOf("#op-error")
	viewShot("refusal.png")
	run("cancel", chromedp.Click(chromedp.CSS("[data-cancel]")))
	if want := ops.UserText(refusal.Error()); shown != want || strings.Contains(shown, "checkpoint:") {
		t.Errorf("the refusal shown is %q; want the command line's %q", shown, want)
	}

	run("the runs list", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("runs")))
	if got := textOf("#runs"); !strings.Contains(got, runID+" succeeded") {
		t.Errorf("the runs list reads %q; want %s succeeded", got, runID)
	}
	shot("runs.png")
	// The list refreshes itself: a run a scheduler starts over the API
	// shows up without a reload.
	req, err := http.NewRequest(http.MethodPost, base+"/api/v1/runs", strings.NewReader(`{"job": "settle", "params": {"date": "2026-11-29"}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Idempotency-Key", "nightly-2026-11-29")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("POST /api/v1/runs: %s; want 201", res.Status)
	}
	run("the new run appears in the list",
		chromedp.Poll[chromedp.Void](`document.querySelector('#runs a[href="/runs/settle/2026-11-29"]') !== null`, chromedp.WithPollingTimeout(10*time.Second)))
	// The counts above the list: both runs succeeded once the new one is
	// done, nothing else.
	run("the counts follow the new run",
		chromedp.Poll[chromedp.Void](`document.querySelector('#counts [data-status="succeeded"]').textContent === "2"`,
			chromedp.WithPollingTimeout(20*time.Second)))
	if got := textOf("#counts"); !strings.Contains(got, "2 all") || !strings.Contains(got, "0 failed") || !strings.Contains(got, "0 stale") {
		t.Errorf("the counts read %q; want 2 runs, both succeeded", got)
	}

	// The job's page charts its runs: a duration bar and a stack of
	// batch items per run.
	run("the job's page", chromedp.Navigate(base+"/jobs/settle"), chromedp.WaitVisible(chromedp.ID("duration-chart")))
	bars, err := chromedp.Run(bctx, chromedp.Evaluate[[]int](`[document.querySelectorAll("#duration-chart rect.bar").length,
		document.querySelectorAll("#items-chart a.run").length, document.querySelectorAll("#items-chart rect.seg-rejected").length,
		Math.round(document.getElementById("duration-chart").getBoundingClientRect().width)]`))
	if err != nil {
		t.Fatal(err)
	}
	if bars[0] != 2 || bars[1] != 2 || bars[2] < 1 || bars[3] < 300 {
		t.Errorf("the job page's charts have %d duration bars, %d item bars (%d with rejections), %d px wide; want 2, 2 (the failed night's rejections at least), drawn at least 300 px wide", bars[0], bars[1], bars[2], bars[3])
	}
	shot("job.png")

	run("the schedules", chromedp.Navigate(base+"/schedules"), chromedp.WaitVisible(chromedp.CSS(".schedule")))
	if got := textOf(".schedule"); !strings.Contains(got, "settle-nightly") || !strings.Contains(got, "Next fires") {
		t.Errorf("the schedules page reads %q; want settle-nightly with its next fires", got)
	}
	shot("schedules.png")

	// Pausing the schedule from its page: a reason, recorded under the
	// token's name; the page then shows the pause and an Unpause button.
	const holiday = "bank holiday: no settlement on 2026-12-25"
	run("pause the schedule",
		chromedp.Click(chromedp.CSS(`button[data-pause-op="pause"][data-schedule="settle-nightly"]`)),
		chromedp.WaitVisible(chromedp.ID("pause-reason")),
		chromedp.SendKeys(chromedp.ID("pause-reason"), holiday),
		chromedp.Click(chromedp.ID("pause-submit")),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="paused"]`)),
		chromedp.WaitVisible(chromedp.CSS(`button[data-pause-op="unpause"]`)),
	)
	if got := textOf(`[data-testid="paused"]`); !strings.Contains(got, "Paused by oncall") || !strings.Contains(got, holiday) {
		t.Errorf("the paused schedule reads %q; want paused by oncall with the reason", got)
	}
	shot("schedules-paused.png")
	if as, err := st.Audits(ctx, checkpoint.ScheduleAuditID("settle-nightly")); err != nil || len(as) != 1 || as[0].Operator != "oncall" || as[0].Reason != holiday {
		t.Errorf("the schedule's audit trail = %+v, %v; want oncall's pause", as, err)
	}
	run("unpause the schedule",
		chromedp.Click(chromedp.CSS(`button[data-pause-op="unpause"]`)),
		chromedp.WaitVisible(chromedp.ID("pause-catchup")),
		chromedp.SendKeys(chromedp.ID("pause-reason"), "holiday over"),
		chromedp.Click(chromedp.ID("pause-submit")),
		chromedp.WaitVisible(chromedp.CSS(`button[data-pause-op="pause"]`)),
	)
	if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('[data-testid="paused"]').length`)); err != nil || n != 0 {
		t.Errorf("after the unpause the page shows %d pauses (%v); want none", n, err)
	}

	// Logging out (a cookie write, with the CSRF token) ends the session:
	// a page sends the browser to log in again.
	run("log out",
		chromedp.Click(chromedp.CSS("[data-logout]")),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.ID("token")),
	)

	// The login page's script returns only to a path on this server,
	// whatever its data-next says: a browser drops the tab of "/\t/x"
	// and would go to //x.
	run("log in with a next that leaves the site",
		chromedp.Navigate(base+"/login"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("login").dataset.next = "/\t/evil.example/runs"`),
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.CSS(`#login button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("runs")),
	)
	if href, err := chromedp.Run(bctx, chromedp.Evaluate[string](`location.href`)); err != nil || href != base+"/" {
		t.Errorf("after logging in with next /\t/evil.example/runs the browser is at %q (%v); want %s/", href, err, base)
	}
	t.Logf("screenshots in %s", shots)
}

// colorScheme makes the page see prefers-color-scheme as scheme.
func colorScheme(scheme string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}})
		return err
	})
}

// newBrowser starts headless Chromium with a fresh profile and a laptop's
// screen.
func newBrowser(t *testing.T) (context.Context, context.CancelFunc) {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 900),
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	var logs syncBuffer
	browser, cancelBrowser := chromedp.NewContext(alloc, chromedp.WithErrorf(func(f string, a ...any) { fmt.Fprintf(&logs, f+"\n", a...) }))
	if err := chromedp.Do(browser, chromedp.EmulateViewport(1440, 900)); err != nil {
		cancelBrowser()
		cancelAlloc()
		if _, lookErr := exec.LookPath(chromiumPath); lookErr != nil {
			t.Fatalf("chromium does not start (%v): install it with `apt-get install -y chromium`", err)
		}
		t.Fatalf("chromium does not start: %v\n%s", err, logs.String())
	}
	return browser, func() {
		cancelBrowser()
		cancelAlloc()
		if s := logs.String(); s != "" {
			t.Logf("chromedp: %s", s)
		}
	}
}
