package settlement_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// The crash campaign settles a small ledger in real processes (this test
// binary re-executed as the stepwise CLI, see TestMain), kills them with
// SIGKILL at every named crash point and at random moments, reruns them
// until the run succeeds, and then audits the result: settlement.Check
// passes, and every balance, every version and the set of rejected
// transfers equal those of a run that never crashed.
//
// A plain `go test` makes 20 random kills, split between the layouts; a
// failure prints the campaign's seed, which replays every random choice:
//
//	STEPWISE_CAMPAIGN=500 go test -run TestCrashCampaign ./examples/settlement/   # 500 random kills
//	STEPWISE_CAMPAIGN_SEED=1234 go test -run TestCrashCampaign ./examples/settlement/  # replay a failure
//	STEPWISE_CAMPAIGN_SEED=1234 go test -run 'TestCrashCampaign/separate_file/random_kill_3$' ./examples/settlement/
//
// With STEPWISE_TEST_STORE=postgres the checkpoints are in PostgreSQL (a
// schema per case) and the layouts are the same store, another database
// and a SQLite file; the random kills are split between the layouts.

const (
	// childEnv makes TestMain act as the stepwise CLI.
	childEnv = "STEPWISE_SETTLEMENT_CHILD"
	// campaignEnv sets the number of random kills (all layouts together).
	campaignEnv = "STEPWISE_CAMPAIGN"
	// campaignSeedEnv replays a campaign's random choices.
	campaignSeedEnv = "STEPWISE_CAMPAIGN_SEED"
	// defaultRandomKills is the random kills of a plain `go test`.
	defaultRandomKills = 20
)

// campaignLedger is small: every child run under -race on two shared
// cores stays around a second, and it still has several chunks and both
// posted and rejected transfers.
var campaignLedger = settlement.SeedConfig{Accounts: 20, Transfers: 300, Date: testDate, Seed: 11, Balance: 5_000}

// campaignChunk gives campaignLedger six chunks, #0 to #5.
const (
	campaignChunk = 50
	lastChunk     = 5
)

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "1":
		os.Exit(cmd.Execute(context.Background(), registry(), crashtest.ChildArgs(), os.Stdout, os.Stderr))
	case poolChild:
		// As the stock binary runs: SIGTERM and SIGINT end the command's
		// context (a worker's graceful stop).
		os.Args = append([]string{os.Args[0]}, crashtest.ChildArgs()...)
		cmd.Main(poolRegistry(), cmd.Name("stepwise"))
	}
	code := m.Run()
	removeTemplates()
	os.Exit(code)
}

// startChild runs the settle job of s in a new process, with env added.
func startChild(t *testing.T, s store, env ...string) *crashtest.Child {
	t.Helper()
	args := []string{"--db", s.db, "--log-level", "error", "run", "settle", "--progress", "none"}
	for k, v := range s.values(testDate, campaignChunk) {
		args = append(args, "-p", k+"="+v)
	}
	return crashtest.Start(t, crashtest.Spec{Args: args, Env: append([]string{childEnv + "=1"}, env...), Timeout: 2 * time.Minute})
}

// crashAt runs the job with the crash point set and fails unless the
// process died there.
func crashAt(t *testing.T, s store, point string) {
	t.Helper()
	c := startChild(t, s, crashtest.CrashAt(point))
	c.WantKilled()
	settleKilled(t, c)
}

// settleKilled waits, after c was killed with SIGKILL and reaped, until
// the PostgreSQL server has ended c's sessions (pgtest.WaitSessionsGone),
// so that what the test reads next is all c will ever have written: a
// commit c sent just before it died may still land after the kill.
// Without STEPWISE_TEST_PG it returns at once.
func settleKilled(t *testing.T, c *crashtest.Child) {
	t.Helper()
	pgtest.WaitSessionsGone(t, c.SessionName())
}

// settleToSuccess runs the job in a child and fails unless it succeeds.
func settleToSuccess(t *testing.T, s store) time.Duration {
	t.Helper()
	start := time.Now()
	startChild(t, s).WantCode(cmd.ExitOK)
	return time.Since(start)
}

// outcome is what a settlement left behind, compared across runs.
type outcome struct {
	accounts accounts // balance and version of every account
	rejected []string // rejected transfers, sorted
	posted   int
	summary  settlement.Summary
}

func readOutcome(t *testing.T, s store) outcome {
	t.Helper()
	o := outcome{accounts: readAccounts(t, s.ledgerLoc()), summary: s.summary(t, testDate)}
	for k, st := range s.items(t, testDate) {
		switch st {
		case checkpoint.StepRejected:
			o.rejected = append(o.rejected, k)
		case checkpoint.StepCompleted:
			o.posted++
		}
	}
	slices.Sort(o.rejected)
	return o
}

// audit returns every way the settlement in s differs from what it must
// be: the independent ledger check, the no-crash reference outcome, each
// transfer recorded once as posted or rejected, the run succeeded and, on
// a separate store, every chunk plan applied exactly once.
func audit(t *testing.T, s store, ref outcome) []string {
	t.Helper()
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	rep := s.check(t, testDate)
	if rep.Total != rep.OpeningTotal {
		bad("money not conserved: total %d, opening %d", rep.Total, rep.OpeningTotal)
	}
	for _, m := range rep.Mismatches {
		bad("ledger check: account %s has balance %d, want %d", m.Account, m.Got, m.Want)
	}

	got := readOutcome(t, s)
	for id, want := range ref.accounts {
		if g, ok := got.accounts[id]; !ok || g != want {
			bad("account %s: balance %d version %d, reference run %d version %d", id, g[0], g[1], want[0], want[1])
		}
	}
	if len(got.accounts) != len(ref.accounts) {
		bad("%d accounts, reference run %d", len(got.accounts), len(ref.accounts))
	}
	if !slices.Equal(got.rejected, ref.rejected) {
		bad("rejected %d transfers %v, reference run %d %v", len(got.rejected), got.rejected, len(ref.rejected), ref.rejected)
	}
	if n := got.posted + len(got.rejected); n != campaignLedger.Transfers || got.posted != ref.posted {
		bad("%d transfers posted and %d rejected of %d; the reference posted %d", got.posted, len(got.rejected), campaignLedger.Transfers, ref.posted)
	}
	if !summariesEqual(got.summary, ref.summary) {
		bad("summary %+v, reference run %+v", got.summary, ref.summary)
	}

	ctx := context.Background()
	st := s.open(t)
	defer st.Close()
	info, err := st.Run(ctx, jobs.RunID(settlement.Job.Name(), testDate))
	if err != nil {
		t.Fatal(err)
	}
	if info.Run.Status != checkpoint.RunSucceeded {
		bad("run is %s, want succeeded", info.Run.Status)
	}
	if s.ledger != "" {
		// Every chunk plan, asked of the ledger through the store's
		// effect target: applied exactly when it says so.
		plans := s.plans(t, testDate)
		ids := make([]string, 0, len(plans))
		for id := range plans {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		if len(ids) == 0 {
			bad("a separate ledger settled with no chunk plans recorded")
		}
		applied := s.applied(t, ids)
		for _, id := range ids {
			switch status := plans[id]; {
			case status == checkpoint.ChunkApplied && !applied[id]:
				bad("chunk plan %s is marked applied but its effect ID is not in the ledger", id)
			case status == checkpoint.StepPlanned:
				bad("chunk plan %s is still planned after the run succeeded", id)
			case status == checkpoint.ChunkSuperseded && applied[id]:
				bad("chunk plan %s was superseded, yet its effect ID is in the ledger", id)
			case status != checkpoint.ChunkApplied && status != checkpoint.ChunkSuperseded:
				bad("chunk plan %s is %q", id, status)
			}
		}
	}
	return problems
}

func summariesEqual(a, b settlement.Summary) bool {
	return a.Date == b.Date && a.Transfers == b.Transfers && a.Posted == b.Posted && a.Rejected == b.Rejected &&
		a.PostedAmount == b.PostedAmount && a.RejectedAmount == b.RejectedAmount && slices.Equal(a.RejectedIDs, b.RejectedIDs)
}

// campaignLayout is one ledger layout with the reference outcome of a
// run that never crashed.
type campaignLayout struct {
	layout
	ref  outcome
	took time.Duration // the reference run's wall time
}

// fresh makes a new store of the layout with the campaign ledger seeded
// (reproducibly: every case starts from the same ledger).
func (l *campaignLayout) fresh(t *testing.T) store {
	t.Helper()
	return newStore(t, l.layout, campaignLedger)
}

// newLayout runs the reference settlement of layout in a child that is
// never killed.
func newLayout(t *testing.T, lay layout) *campaignLayout {
	t.Helper()
	l := &campaignLayout{layout: lay}
	s := l.fresh(t)
	l.took = settleToSuccess(t, s)
	if problems := checkOnly(t, s); len(problems) > 0 {
		t.Fatalf("%s: the reference run itself is wrong:\n%s", l.name, strings.Join(problems, "\n"))
	}
	l.ref = readOutcome(t, s)
	if len(l.ref.rejected) == 0 || l.ref.posted == 0 {
		t.Fatalf("the campaign ledger should post some and reject some transfers: %d posted, %d rejected", l.ref.posted, len(l.ref.rejected))
	}
	return l
}

// checkOnly is the part of audit that needs no reference.
func checkOnly(t *testing.T, s store) []string {
	rep := s.check(t, testDate)
	if rep.OK() {
		return nil
	}
	return []string{rep.String()}
}

// namedCases are the crash sequences every layout goes through: each run
// but the last dies at its point, then reruns go to success. Chunk
// indices count chunks within an attempt, replayed ones too, so #3 is the
// same fourth chunk of transfers in every attempt.
func namedCases(separate bool) [][]string {
	cases := [][]string{
		{"step:count:before-checkpoint"},
		{"step:count:after-checkpoint"},
		{"step:post#0:before-commit"},
		{"step:post#0:after-commit"},
		{"step:post#3:before-commit"},
		{"step:post#3:after-commit"},
		{"step:post#" + strconv.Itoa(lastChunk) + ":after-commit"},
		{"step:summary:before-checkpoint"},
		{"step:summary:after-checkpoint"},
		{"step:notify:after-checkpoint"}, // queued with its checkpoint, not yet delivered
		{"run:before-finish"},
		// A rerun killed again, further on.
		{"step:post#1:after-commit", "step:post#4:before-commit"},
	}
	if separate {
		runID := jobs.RunID(settlement.Job.Name(), testDate)
		cases = append(cases,
			[]string{"step:post#0:after-plan"},
			[]string{"step:post#3:after-plan"},
			[]string{"step:post:after-apply"}, // the first chunk applied, not recorded
			// Chunk #3 of the first attempt (fence 1) applied, not recorded.
			[]string{"step:post#" + runID + "/post@1.c3.0:after-apply"},
			// Planned, then the rerun dies right after applying the
			// recorded plan, before recording it.
			[]string{"step:post#2:after-plan", "step:post:after-apply"},
			[]string{"step:post#2:after-plan", "step:post#4:after-plan"},
		)
	}
	return cases
}

func TestCrashCampaign(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(campaignSeedEnv); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", campaignSeedEnv, v, err)
		}
	}
	kills := defaultRandomKills
	if v := os.Getenv(campaignEnv); v != "" {
		var err error
		if kills, err = strconv.Atoi(v); err != nil || kills < 0 {
			t.Fatalf("%s=%q: want a number of random kills", campaignEnv, v)
		}
	}
	t.Logf("campaign seed %d, %d random kills (replay with %s=%d)", seed, kills, campaignSeedEnv, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED campaign seed %d: replay with %s=%d go test -run TestCrashCampaign ./examples/settlement/", seed, campaignSeedEnv, seed)
		}
	})

	// The reference runs, in the test itself (not subtests) so that -run
	// can pick one case and still have them: one per layout of the
	// selected store.
	var active []*campaignLayout
	for _, lay := range layouts(t) {
		active = append(active, newLayout(t, lay))
	}
	// Every layout settles the same ledger to the same balances.
	for _, l := range active[1:] {
		if a, b := active[0].ref, l.ref; !mapsEqual(a.accounts, b.accounts) || !slices.Equal(a.rejected, b.rejected) {
			t.Fatalf("the %s and %s reference runs disagree", active[0].name, l.name)
		}
	}

	for li, l := range active {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			for _, points := range namedCases(l.separate()) {
				t.Run(strings.Join(points, " then "), func(t *testing.T) {
					t.Parallel()
					s := l.fresh(t)
					for _, p := range points {
						crashAt(t, s, p)
					}
					settleToSuccess(t, s)
					if problems := audit(t, s, l.ref); len(problems) > 0 {
						t.Fatalf("after crashes at %v and a rerun:\n%s", points, strings.Join(problems, "\n"))
					}
				})
			}

			// Random kills: this layout's share, each with its own seed
			// derived from the campaign's, so one case replays alone.
			n := kills / len(active)
			if li < kills%len(active) {
				n++
			}
			for k := range n {
				caseSeed := seed ^ uint64(li+1)<<32 ^ uint64(k)
				t.Run("random kill "+strconv.Itoa(k), func(t *testing.T) {
					t.Parallel()
					randomKills(t, l, caseSeed, seed)
				})
			}

			t.Run("a double apply is caught", func(t *testing.T) {
				t.Parallel()
				s := l.fresh(t)
				crashAt(t, s, "step:post#2:after-commit")
				settleToSuccess(t, s)
				if problems := audit(t, s, l.ref); len(problems) > 0 {
					t.Fatalf("after a crash and a rerun:\n%s", strings.Join(problems, "\n"))
				}
				from, to := applyTwice(t, s)
				problems := audit(t, s, l.ref)
				for _, id := range []string{from, to} {
					named := false
					for _, p := range problems {
						named = named || strings.Contains(p, "ledger check: account "+id)
					}
					if !named {
						t.Errorf("the audit does not report %s after a transfer from %s to %s was applied twice:\n%s",
							id, from, to, strings.Join(problems, "\n"))
					}
				}
			})
		})
	}
}

// randomKills kills the settlement at a random moment, reruns it (a rerun
// that gets killed too may be followed by another kill, three at most),
// reruns it to success and audits it. A quarter of the kills come at a
// random time over a whole run's span (startup, claim, count, posting,
// summary, finish); the rest once a random number of transfers are
// checkpointed, plus up to 50 ms, to land inside posting.
func randomKills(t *testing.T, l *campaignLayout, caseSeed, campaignSeed uint64) {
	rng := rand.New(rand.NewPCG(caseSeed, 0xc4a5))
	s := l.fresh(t)
	var log []string
	for i := 0; i < 3 && (i == 0 || rng.IntN(2) == 0); i++ {
		c := startChild(t, s)
		var when string
		if rng.IntN(4) == 0 {
			delay := time.Duration(rng.Int64N(int64(l.took)))
			time.Sleep(delay)
			when = fmt.Sprintf("at %s", delay.Round(time.Millisecond))
		} else {
			target := 1 + rng.IntN(campaignLedger.Transfers)
			jitter := time.Duration(rng.Int64N(int64(50 * time.Millisecond)))
			waitForItems(t, c, s, target)
			time.Sleep(jitter)
			when = fmt.Sprintf("%s after transfer %d was checkpointed", jitter.Round(time.Millisecond), target)
		}
		c.Signal(syscall.SIGKILL) // harmless if it just ended
		got := c.Wait()
		if got == crashtest.Code(cmd.ExitOK) {
			log = append(log, "finished before the kill "+when)
			break
		}
		if got != crashtest.Killed {
			t.Fatalf("killed run: %s (replay with %s=%d)\n%s", got, campaignSeedEnv, campaignSeed, c.Output())
		}
		settleKilled(t, c)
		log = append(log, fmt.Sprintf("killed %s (%s)", when, progressOf(t, s)))
	}
	settleToSuccess(t, s)
	if problems := audit(t, s, l.ref); len(problems) > 0 {
		t.Fatalf("%s, then a rerun (replay with %s=%d):\n%s", strings.Join(log, "; "), campaignSeedEnv, campaignSeed, strings.Join(problems, "\n"))
	}
	t.Logf("%s; audit passed", strings.Join(log, "; "))
}

// waitForItems returns once the child has checkpointed n items (in all its
// attempts) or has ended, asking the store (ItemCounts) every few
// milliseconds. A SQLite file is opened only once the child has put it in
// WAL mode, so the test never races the child's schema migration; a
// PostgreSQL store migrates under an advisory lock, so it is opened at
// once.
func waitForItems(t *testing.T, c *crashtest.Child, s store, n int) {
	t.Helper()
	var st checkpoint.Backend
	defer func() {
		if st != nil {
			st.Close()
		}
	}()
	for {
		select {
		case <-c.Done():
			return
		case <-time.After(2 * time.Millisecond):
		}
		if st == nil {
			if !isURL(s.db) {
				if _, err := os.Stat(s.db + "-wal"); err != nil {
					continue
				}
			}
			st = s.open(t)
		}
		if got, err := checkpointed(st); err == nil && got >= n {
			return
		}
	}
}

// checkpointed counts the transfers (post items) the run has recorded.
func checkpointed(st checkpoint.Store) (int, error) {
	counts, err := st.ItemCounts(context.Background(), jobs.RunID(settlement.Job.Name(), testDate))
	var n int64
	for _, c := range counts {
		if c.Step == "post" {
			n += c.Count
		}
	}
	return int(n), err
}

// progressOf says how many transfers a killed run left checkpointed.
func progressOf(t *testing.T, s store) string {
	t.Helper()
	if !isURL(s.db) {
		if _, err := os.Stat(s.db); err != nil {
			return "no checkpoint database yet"
		}
	}
	st := s.open(t)
	defer st.Close()
	n, err := checkpointed(st)
	if err != nil {
		return "no items readable: " + err.Error()
	}
	return fmt.Sprintf("%d of %d transfers checkpointed", n, campaignLedger.Transfers)
}

// applyTwice posts one posted transfer a second time with plain SQL, as a
// bug that lost track of it would, and returns its accounts.
func applyTwice(t *testing.T, s store) (from, to string) {
	t.Helper()
	var key string
	for k, st := range s.items(t, testDate) {
		if st == checkpoint.StepCompleted && (key == "" || k < key) {
			key = k
		}
	}
	db := openLedger(t, s.ledgerLoc())
	defer db.Close()
	var amount int64
	if err := db.QueryRow(`SELECT from_account, to_account, amount FROM transfers WHERE id = $1`, key).Scan(&from, &to, &amount); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE accounts SET balance = balance - $1, version = version + 1 WHERE id = $2`, amount, from); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE accounts SET balance = balance + $1, version = version + 1 WHERE id = $2`, amount, to); err != nil {
		t.Fatal(err)
	}
	return from, to
}
