package steps_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/steps"
	"github.com/stepwise-run/stepwise/steps/crashtest"
)

// These tests hold ForEach to the failure model a chunk at a time: a real
// runner process settles a ledger of transfers in chunks and is killed with
// SIGKILL at a named chunk boundary or at a random moment, a second process
// reruns the job to success, and the ledger and the checkpoints are checked:
// money conserved, every transfer item completed or rejected exactly once,
// every balance the opening plus the completed transfers' deltas, every
// version the count of the chunk writes that changed the account. A run of
// the same seed that never crashed must end with the same balances and the
// same rejections: a crash changes no outcome.

// Environment of the child runner (TestFeChild).
const (
	feChildEnv    = "STEPWISE_FE_CHILD"    // "1" makes TestFeChild run
	feDBEnv       = "STEPWISE_FE_DB"       // checkpoint database
	feLedgerEnv   = "STEPWISE_FE_LEDGER"   // separate ledger database; empty for the same store
	feSeedEnv     = "STEPWISE_FE_SEED"     // seed of the book of transfers; also the tests' seed
	feOrderEnv    = "STEPWISE_FE_ORDER"    // feForward or feReverse
	feProgressEnv = "STEPWISE_FE_PROGRESS" // "1": print a line per committed chunk
)

const (
	feRunID     = "settle/fe"
	feStep      = "post"
	feAccounts  = 20
	feTransfers = 300
	feChunk     = 25
	feChunks    = feTransfers / feChunk

	feForward = "forward"
	feReverse = "reverse"

	feProgressLine = "fe-progress"
)

// feBook is a ledger's opening balances and the transfers to settle, in
// ascending key order. Amounts are large enough against the balances that
// a good share of the transfers overdraw and are rejected.
type feBook struct {
	seed      uint64
	opening   map[string]int64
	transfers []xfer
}

func feNewBook(seed uint64) feBook {
	rng := rand.New(rand.NewPCG(seed, 0xfe))
	bk := feBook{seed: seed, opening: map[string]int64{}}
	for i := range feAccounts {
		bk.opening[feAccount(i)] = rng.Int64N(501)
	}
	for i := range feTransfers {
		from := rng.IntN(feAccounts)
		to := (from + 1 + rng.IntN(feAccounts-1)) % feAccounts // never from itself
		bk.transfers = append(bk.transfers, xfer{ID: fmt.Sprintf("T%04d", i), From: feAccount(from), To: feAccount(to),
			Amount: 1 + rng.Int64N(300)})
	}
	return bk
}

func feAccount(i int) string { return fmt.Sprintf("acct%02d", i) }

// in returns the transfers in the order a runner yields them.
func (bk feBook) in(order string) []xfer {
	ts := slices.Clone(bk.transfers)
	if order == feReverse {
		slices.Reverse(ts)
	}
	return ts
}

// simulate posts the transfers in ascending order with the overdraft guard
// and returns the final balances and the rejected transfers.
func (bk feBook) simulate() (map[string]int64, map[string]bool) {
	bal := maps.Clone(bk.opening)
	rejected := map[string]bool{}
	for _, x := range bk.transfers {
		if bal[x.From] < x.Amount {
			rejected[x.ID] = true
			continue
		}
		bal[x.From] -= x.Amount
		bal[x.To] += x.Amount
	}
	return bal, rejected
}

// feSeed is the seed of this test process: STEPWISE_FE_SEED if set, else
// the clock. Each test logs it so a failure can be replayed.
func feSeed(t *testing.T) uint64 {
	t.Helper()
	if s := os.Getenv(feSeedEnv); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", feSeedEnv, s, err)
		}
		t.Logf("seed %d (from %s)", seed, feSeedEnv)
		return seed
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d (replay with %s=%d)", seed, feSeedEnv, seed)
	return seed
}

// feSettle is the job a runner runs: claim the run (taking it over from a
// dead runner, or again after it succeeded), settle every transfer with one
// ForEach in chunks of feChunk and mark the run succeeded.
func feSettle(ctx context.Context, dbLoc, ledgerPath string, bk feBook, order string, progress func(steps.Progress)) error {
	st, err := checkpointtest.OpenLocationErr(dbLoc)
	if err != nil {
		return err
	}
	defer st.Close()
	c, err := st.Claim(ctx, checkpoint.ClaimRequest{
		RunID: feRunID, Job: "settle", RunKey: "fe", Params: []byte(`{}`), ParamsHash: "fe",
		Owner: feOwner(os.Getpid()), Now: time.Now(), LeaseFor: time.Hour, Force: true,
		OwnerGone: func(string) bool { return true }, // every earlier runner here is dead
	})
	if err != nil {
		return err
	}
	run, err := steps.Begin(ctx, steps.Config{Store: st, Lease: c.Lease, OnProgress: progress})
	if err != nil {
		return err
	}
	defer run.Close()
	_, err = steps.ForEach(ctx, run, feStep, steps.Slice(bk.in(order), xferKey), post,
		steps.WithTarget(steps.Target{Location: ledgerPath, Table: accountsTable}), steps.ChunkSize(feChunk))
	if err != nil {
		return err
	}
	return st.Finish(ctx, c.Lease, checkpoint.Ending{Status: checkpoint.RunSucceeded, At: time.Now()})
}

func feOwner(pid int) string { return "fe:" + strconv.Itoa(pid) }

// TestFeChild is the runner the crash tests start as a real process.
// STEPWISE_CRASH_AT stops it with SIGKILL at a chunk boundary; with
// STEPWISE_FE_PROGRESS it prints a line after each chunk so the parent can
// kill it at a moment of its choosing.
func TestFeChild(t *testing.T) {
	if os.Getenv(feChildEnv) != "1" {
		t.Skip("helper process for the ForEach crash tests")
	}
	seed, err := strconv.ParseUint(os.Getenv(feSeedEnv), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", feSeedEnv, err)
	}
	var progress func(steps.Progress)
	if os.Getenv(feProgressEnv) == "1" {
		progress = func(p steps.Progress) { fmt.Printf("%s %d\n", feProgressLine, p.Done) }
	}
	err = feSettle(context.Background(), os.Getenv(feDBEnv), os.Getenv(feLedgerEnv), feNewBook(seed), os.Getenv(feOrderEnv), progress)
	if err != nil {
		t.Fatal(err)
	}
}

// feLedger is one scenario's databases, seen from the test process.
type feLedger struct {
	dir        string
	dbLoc      string // the store's location: a file path or a postgres:// URL
	ledgerPath string // "" for the same store
	targetLoc  string // where the accounts table lives: dbLoc or ledgerPath
	store      checkpoint.Backend
	book       feBook
	orders     map[string]string // attempt owner -> the order it yielded items in
	children   int
}

// feNewLedger makes a scenario's databases: the store on the suite's store
// with the accounts in its database, or, separate, a SQLite store with the
// accounts in a separate SQLite file (the PostgreSQL store cannot open a
// separate target yet; see checkpointtest.SeparateTarget).
func feNewLedger(t *testing.T, separate bool, bk feBook) *feLedger {
	t.Helper()
	dir := t.TempDir()
	l := &feLedger{dir: dir, book: bk, orders: map[string]string{}}
	if separate {
		l.dbLoc, l.ledgerPath = checkpointtest.SeparateLocations(t)
		l.targetLoc = l.ledgerPath
	} else {
		l.dbLoc = checkpointtest.NewLocation(t)
		l.targetLoc = l.dbLoc
	}
	l.store = checkpointtest.OpenLocation(t, l.dbLoc)
	ledger(t, l.targetLoc, bk.opening)
	return l
}

// start starts a TestFeChild process over l, yielding items in order.
func (l *feLedger) start(t *testing.T, order string, env ...string) *crashtest.Child {
	t.Helper()
	l.children++
	c := crashtest.Start(t, crashtest.Spec{Test: "TestFeChild", Env: append([]string{feChildEnv + "=1", feDBEnv + "=" + l.dbLoc,
		feLedgerEnv + "=" + l.ledgerPath, feSeedEnv + "=" + strconv.FormatUint(l.book.seed, 10), feOrderEnv + "=" + order}, env...)})
	l.orders[feOwner(c.Pid())] = order
	return c
}

// runChild runs TestFeChild over l with items in order. With crashAt set
// the child must die of SIGKILL there; without, it must succeed.
func (l *feLedger) runChild(t *testing.T, crashAt, order string) {
	t.Helper()
	if crashAt == "" {
		l.start(t, order).WantCode(0)
		return
	}
	l.start(t, order, crashtest.CrashAt(crashAt)).WantKilled()
}

// killChild runs TestFeChild over l and kills it with SIGKILL at a moment
// drawn from rng: after a random number of committed chunks (0 to all of
// them), plus a random delay of up to 3 ms, which lands the kill inside an
// item function, a transaction, a commit's fsync or between chunks. A child
// that finishes first is not an error; the rerun then has nothing to do.
func (l *feLedger) killChild(t *testing.T, rng *rand.Rand) {
	t.Helper()
	chunks, delay := rng.IntN(feChunks+1), time.Duration(rng.IntN(3000))*time.Microsecond
	c := l.start(t, feForward, feProgressEnv+"=1")
	seen := func() int { return strings.Count(c.Stdout(), feProgressLine) }
	c.Until(func() bool { return seen() >= chunks })
	n := seen()
	time.Sleep(delay) // the parent picks the moment; nothing under test sleeps
	killErr := c.Signal(syscall.SIGKILL)
	switch got := c.Wait(); got {
	case crashtest.Killed:
		t.Logf("killed after %d committed chunks + %s", n, delay)
	case crashtest.Code(0):
		t.Logf("child finished before the kill (after %d chunks + %s; kill: %v)", n, delay, killErr)
	default:
		t.Fatalf("child failed on its own: %s\n%s", got, c.Output())
	}
}

// feItem is one item checkpoint as the test reads it.
type feItem struct {
	status  string
	attempt int
	chunk   string
}

// feSeen is the durable state of a scenario, read by the test process.
type feSeen struct {
	accounts  map[string][2]int64 // id -> balance, version
	items     map[string]feItem
	owners    map[int]string // attempt number -> owner
	runStatus string
	step      checkpoint.Step
	summary   steps.BatchSummary
}

func (l *feLedger) read(t *testing.T) feSeen {
	t.Helper()
	ctx := context.Background()
	s := feSeen{accounts: map[string][2]int64{}, items: map[string]feItem{}, owners: map[int]string{}}
	for id, v := range checkpointtest.Balances(t, l.targetLoc, accountsTable) {
		s.accounts[id] = [2]int64{v.Value, v.Version}
	}
	err := l.store.Items(ctx, checkpoint.ItemQuery{RunID: feRunID, Step: feStep}, func(it checkpoint.Item) error {
		if _, dup := s.items[it.Key]; dup {
			return fmt.Errorf("item %s read twice", it.Key)
		}
		s.items[it.Key] = feItem{status: it.Status, attempt: it.Attempt, chunk: it.Chunk}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	info, err := l.store.Run(ctx, feRunID)
	if err != nil {
		t.Fatal(err)
	}
	s.runStatus = info.Run.Status
	for _, a := range info.Attempts {
		s.owners[a.Number] = a.Owner
	}
	err = l.store.Steps(ctx, feRunID, func(st checkpoint.Step) error {
		if st.ID == feStep {
			s.step = st
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.step.Status == checkpoint.StepCompleted {
		if err := json.Unmarshal(s.step.Output, &s.summary); err != nil {
			t.Fatalf("decode summary %s: %v", s.step.Output, err)
		}
	}
	return s
}

// rejected returns the keys of the rejected items.
func (s feSeen) rejected() []string {
	var keys []string
	for k, it := range s.items {
		if it.status == checkpoint.StepRejected {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// check asserts the invariants of a finished scenario and returns what it
// read. The expected version of each account is derived from which attempt
// completed each transfer and in which of that attempt's chunks (its
// position in the order that attempt yielded items, over feChunk): a chunk
// writes an account once, if its completed transfers change it.
func (l *feLedger) check(t *testing.T) feSeen {
	t.Helper()
	s := l.read(t)
	bk := l.book
	if s.runStatus != checkpoint.RunSucceeded {
		t.Errorf("run status = %q, want succeeded", s.runStatus)
	}
	if s.step.Status != checkpoint.StepCompleted {
		t.Fatalf("step %s status = %q, want completed", feStep, s.step.Status)
	}

	// Every transfer is one item, completed or rejected, and nothing else.
	var completed, rejected int64
	for _, x := range bk.transfers {
		it, ok := s.items[x.ID]
		switch {
		case !ok:
			t.Errorf("transfer %s has no item checkpoint", x.ID)
		case it.status == checkpoint.StepCompleted:
			completed++
		case it.status == checkpoint.StepRejected:
			rejected++
		default:
			t.Errorf("transfer %s is %q, want completed or rejected", x.ID, it.status)
		}
	}
	if len(s.items) != feTransfers {
		t.Errorf("%d item checkpoints, want %d", len(s.items), feTransfers)
	}
	if s.summary.Total != feTransfers || s.summary.Completed != completed || s.summary.Rejected != rejected || s.summary.Skipped != 0 {
		t.Errorf("summary %+v, items: %d completed, %d rejected", s.summary, completed, rejected)
	}

	// Balances are the opening plus the completed transfers; versions count
	// the chunk writes that changed each account.
	position := map[string]map[string]int{}
	for _, order := range []string{feForward, feReverse} {
		position[order] = map[string]int{}
		for i, x := range bk.in(order) {
			position[order][x.ID] = i
		}
	}
	var moved []checkpointtest.Transfer
	type chunkOf struct{ attempt, chunk int }
	net := map[chunkOf]map[string]int64{}
	for _, x := range bk.transfers {
		it := s.items[x.ID]
		if it.status != checkpoint.StepCompleted {
			continue
		}
		moved = append(moved, checkpointtest.Transfer{ID: x.ID, From: x.From, To: x.To, Amount: x.Amount})
		order, ok := l.orders[s.owners[it.attempt]]
		if !ok {
			t.Fatalf("item %s was completed by attempt %d (%q), not a runner of this test", x.ID, it.attempt, s.owners[it.attempt])
		}
		c := chunkOf{it.attempt, position[order][x.ID] / feChunk}
		if net[c] == nil {
			net[c] = map[string]int64{}
		}
		net[c][x.From] -= x.Amount
		net[c][x.To] += x.Amount
	}
	wantVersion := map[string]int64{}
	for _, d := range net {
		for acct, delta := range d {
			if delta != 0 {
				wantVersion[acct]++
			}
		}
	}
	// Money is conserved, balances are the opening plus the completed
	// transfers, versions count the chunk writes that changed each account.
	got := map[string]checkpoint.State{}
	for acct, v := range s.accounts {
		got[acct] = checkpoint.State{Value: v[0], Version: v[1], Exists: true}
	}
	for _, p := range (checkpointtest.LedgerCheck{Opening: bk.opening, Applied: moved, Versions: wantVersion}).Problems(got) {
		t.Error(p)
	}
	if l.ledgerPath != "" {
		l.checkChunkPlans(t, s)
	}
	return s
}

// checkChunkPlans asserts a separate store's plans: none left planned or
// superseded, one stepwise_applied row per applied plan, each completed
// item in exactly the applied plan its checkpoint names, and each account's
// version steps covered by exactly one applied write each.
func (l *feLedger) checkChunkPlans(t *testing.T, s feSeen) {
	t.Helper()
	plans := map[string]checkpoint.ChunkPlanRecord{}
	err := l.store.RunChunkPlans(context.Background(), feRunID, checkpoint.Page{}, func(cp checkpoint.ChunkPlan) error {
		if cp.Step != feStep {
			return nil
		}
		if cp.Status != checkpoint.ChunkApplied {
			t.Errorf("chunk plan %s is %q, want applied (no plan left planned; no concurrent writer, so none superseded)", cp.EffectID, cp.Status)
			return nil
		}
		p, err := checkpoint.DecodeChunkPlan(cp.Plan)
		if err != nil {
			t.Fatalf("decode chunk plan %s: %v", cp.EffectID, err)
		}
		plans[cp.EffectID] = p
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	applied := map[string]bool{}
	// The separate target is a SQLite file (see feNewLedger); its
	// stepwise_applied table is the target's own record.
	rows, err := checkpointtest.SQL(t, l.ledgerPath).Query(`SELECT effect_id, step_id FROM stepwise_applied`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, step string
		if err := rows.Scan(&id, &step); err != nil {
			t.Fatal(err)
		}
		if applied[id] {
			t.Errorf("effect %s is in stepwise_applied twice", id)
		}
		applied[id] = true
		if _, ok := plans[id]; !ok || step != feStep {
			t.Errorf("stepwise_applied has %s (step %s) with no applied chunk plan of %s", id, step, feStep)
		}
	}
	rows.Close()
	for id := range plans {
		if !applied[id] {
			t.Errorf("chunk plan %s is marked applied but its effect ID is not in the ledger's stepwise_applied", id)
		}
	}
	planned := map[string]string{} // item key -> plan
	bases := map[string]map[int64]string{}
	for id, p := range plans {
		for _, it := range p.Items {
			if other, dup := planned[it.Key]; dup {
				t.Errorf("item %s is in applied plans %s and %s", it.Key, other, id)
			}
			planned[it.Key] = id
		}
		for _, w := range p.Writes {
			if bases[w.Key] == nil {
				bases[w.Key] = map[int64]string{}
			}
			if other, dup := bases[w.Key][w.OldVersion]; dup {
				t.Errorf("%s version %d was written by applied plans %s and %s", w.Key, w.OldVersion, other, id)
			}
			bases[w.Key][w.OldVersion] = id
		}
	}
	for key, it := range s.items {
		if it.status == checkpoint.StepCompleted && (it.chunk == "" || planned[key] != it.chunk) {
			t.Errorf("completed item %s names chunk plan %q, but the applied plan holding it is %q", key, it.chunk, planned[key])
		}
		if it.status != checkpoint.StepCompleted && planned[key] != "" {
			t.Errorf("item %s is %s but applied plan %s holds its operations", key, it.status, planned[key])
		}
	}
	for acct, v := range s.accounts {
		for ver := range v[1] {
			if _, ok := bases[acct][ver]; !ok {
				t.Errorf("%s is at version %d but no applied plan wrote it from version %d", acct, v[1], ver)
			}
		}
		if int64(len(bases[acct])) != v[1] {
			t.Errorf("%s is at version %d but applied plans wrote it %d times", acct, v[1], len(bases[acct]))
		}
	}
}

// sameOutcome asserts s ended exactly like the reference run ref: same
// balances, same versions, same rejected transfers.
func feSameOutcome(t *testing.T, s, ref feSeen) {
	t.Helper()
	if !maps.Equal(s.accounts, ref.accounts) {
		t.Errorf("accounts (balance, version) differ from the run that never crashed:\n got %v\nwant %v", s.accounts, ref.accounts)
	}
	if got, want := s.rejected(), ref.rejected(); !slices.Equal(got, want) {
		t.Errorf("rejected transfers differ from the run that never crashed:\n got %v\nwant %v", got, want)
	}
}

// feReference settles bk in this process, with no crash, in a fresh
// directory, checks it, checks it against a plain simulation of the
// transfers in order, and returns it as the reference for crash scenarios.
func feReference(t *testing.T, separate bool, bk feBook) feSeen {
	t.Helper()
	l := feNewLedger(t, separate, bk)
	l.orders[feOwner(os.Getpid())] = feForward
	if err := feSettle(context.Background(), l.dbLoc, l.ledgerPath, bk, feForward, nil); err != nil {
		t.Fatalf("reference run: %v", err)
	}
	ref := l.check(t)
	bal, rejected := bk.simulate()
	for acct, v := range bal {
		if ref.accounts[acct][0] != v {
			t.Errorf("reference run: %s = %d, the transfers posted in order give %d", acct, ref.accounts[acct][0], v)
		}
	}
	if got, want := ref.rejected(), slices.Sorted(maps.Keys(rejected)); !slices.Equal(got, want) {
		t.Errorf("reference run rejected %v; posted in order, %v overdraw", got, want)
	}
	if len(rejected) == 0 || len(rejected) == feTransfers {
		t.Fatalf("seed %d gives %d rejections of %d transfers; the scenario needs some of each", bk.seed, len(rejected), feTransfers)
	}
	return ref
}

// feSubtest names a subtest after a crash point. It keeps '#' out: the name
// becomes part of t.TempDir(), and a '#' in a database path cuts the
// SQLite URI that sqlite.DSN builds (the rest is read as a fragment).
func feSubtest(point string) string {
	return strings.NewReplacer("step:"+feStep, "", "#", "chunk", "/", "_", ":", "-").Replace(point)
}

// TestFeCrashMidChunk kills a ForEach runner at each chunk boundary and at
// random moments, for the same store and a separate store, reruns it to
// success and checks the invariants and that the outcome is the one of a
// run that never crashed.
func TestFeCrashMidChunk(t *testing.T) {
	seed := feSeed(t)
	bk := feNewBook(seed)
	chunk := func(n int, where string) string { return fmt.Sprintf("step:%s#%d:%s", feStep, n, where) }
	for _, separate := range []bool{false, true} {
		t.Run(fmt.Sprintf("separate=%v", separate), func(t *testing.T) {
			t.Parallel()
			ref := feReference(t, separate, bk)
			// Each scenario is the crash points of successive runners; a
			// last runner with none finishes the job.
			type scenario struct {
				name   string
				points []string
			}
			scenarios := []scenario{
				{"chunk5-before-commit", []string{chunk(5, "before-commit")}},
				{"chunk5-after-commit", []string{chunk(5, "after-commit")}},
				// Every item done, the step not marked finished.
				{"last-chunk-after-commit", []string{chunk(feChunks-1, "after-commit")}},
			}
			if !separate {
				scenarios = append(scenarios,
					scenario{"chunk0-before-commit", []string{chunk(0, "before-commit")}},
					// The rerun dies too, before committing the chunk after.
					scenario{"chunk5-before-commit-twice", []string{chunk(5, "before-commit"), chunk(6, "before-commit")}},
				)
			} else {
				scenarios = append(scenarios,
					scenario{"chunk5-after-plan", []string{chunk(5, "after-plan")}},
					// The first chunk's plan applied, not recorded as applied.
					scenario{"first-after-apply", []string{"step:" + feStep + ":after-apply"}},
					// Chunk 5's plan applied, not recorded: its effect ID is
					// run/step@fence.c<chunk>.<replan>, fence 1 on the first claim.
					scenario{"chunk5-after-apply", []string{fmt.Sprintf("step:%s#%s/%s@1.c5.0:after-apply", feStep, feRunID, feStep)}},
					// The rerun dies after applying the recorded plan it
					// resumes (its first apply), before recording it.
					scenario{"chunk5-after-plan-then-after-apply", []string{chunk(5, "after-plan"), "step:" + feStep + ":after-apply"}},
				)
			}
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					l := feNewLedger(t, separate, bk)
					for _, point := range sc.points {
						l.runChild(t, point, feForward)
					}
					l.runChild(t, "", feForward)
					feSameOutcome(t, l.check(t), ref)
				})
			}
			// Random moments: the first runner is killed, and in every
			// other scenario its rerun too; the last runner finishes.
			rng := rand.New(rand.NewPCG(seed, map[bool]uint64{false: 1, true: 2}[separate]))
			for i := range 3 {
				t.Run(fmt.Sprintf("random-%d", i), func(t *testing.T) {
					l := feNewLedger(t, separate, bk)
					for range 1 + i%2 {
						l.killChild(t, rng)
					}
					l.runChild(t, "", feForward)
					feSameOutcome(t, l.check(t), ref)
				})
			}
		})
	}
}

// TestFeRerunInOtherOrder crashes a runner mid-run and reruns the job with
// its source yielding the items in reverse. Items are matched by key, never
// by position, so a changed order is harmless: what an earlier attempt
// committed is skipped whatever its position, and every effect still applies
// exactly once. Only the outcomes of items not processed before the crash
// may differ from a forward run, because guards fold in the order the
// rerun yields them; so beyond the invariants this asserts only that the
// outcomes committed before the crash stand.
func TestFeRerunInOtherOrder(t *testing.T) {
	seed := feSeed(t)
	bk := feNewBook(seed)
	for _, c := range []struct {
		separate bool
		point    string
	}{
		{false, "step:" + feStep + "#5:before-commit"},
		{true, "step:" + feStep + "#5:after-plan"},
	} {
		t.Run(fmt.Sprintf("separate=%v/%s", c.separate, feSubtest(c.point)), func(t *testing.T) {
			t.Parallel()
			ref := feReference(t, c.separate, bk)
			l := feNewLedger(t, c.separate, bk)
			l.runChild(t, c.point, feForward)
			before := l.read(t).items
			if len(before) == 0 {
				t.Fatal("the crashed runner committed nothing; the scenario needs a partial run")
			}
			l.runChild(t, "", feReverse)
			s := l.check(t)
			for key, it := range before {
				if it.status == checkpoint.StepRejected || it.status == checkpoint.StepCompleted || it.status == checkpoint.StepPlanned {
					want := ref.items[key].status
					if got := s.items[key].status; got != want {
						t.Errorf("item %s, %s before the crash, ended %s; a forward run gives %s", key, it.status, got, want)
					}
				}
			}
			reversed := 0
			for _, it := range s.items {
				if l.orders[s.owners[it.attempt]] == feReverse {
					reversed++
				}
			}
			if reversed == 0 {
				t.Error("the reversed rerun processed no item; the scenario needs it to")
			}
		})
	}
}

// TestFePagedSource reads items page by page from a SQL table with a
// `WHERE id > ? ORDER BY id LIMIT ?` query: every row is processed once; a
// fetch that returns keys out of order fails the step without losing or
// repeating anything, and a rerun with a correct fetch finishes the rest.
func TestFePagedSource(t *testing.T) {
	ctx := context.Background()
	st, loc := checkpointtest.OpenNew(t)
	db := checkpointtest.SQL(t, loc)
	if _, err := db.Exec(`CREATE TABLE payments (id BIGINT PRIMARY KEY, amount BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const rows = 1000
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= rows; i++ {
		if _, err := tx.Exec(`INSERT INTO payments VALUES ($1, $2)`, i, i*10); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	type payment struct{ ID, Amount int64 }
	// Keys must sort as text the way ids sort in SQL: zero-padded.
	key := func(p payment) string { return fmt.Sprintf("P%06d", p.ID) }
	fetches := 0
	fetch := func(mangle func(page []payment, after string) []payment) func(context.Context, string, int) ([]payment, error) {
		return func(ctx context.Context, after string, limit int) ([]payment, error) {
			fetches++
			var from int64
			if after != "" {
				var err error
				if from, err = strconv.ParseInt(strings.TrimPrefix(after, "P"), 10, 64); err != nil {
					return nil, err
				}
			}
			rs, err := db.QueryContext(ctx, `SELECT id, amount FROM payments WHERE id > $1 ORDER BY id LIMIT $2`, from, limit)
			if err != nil {
				return nil, err
			}
			defer rs.Close()
			var page []payment
			for rs.Next() {
				var p payment
				if err := rs.Scan(&p.ID, &p.Amount); err != nil {
					return nil, err
				}
				page = append(page, p)
			}
			if mangle != nil {
				page = mangle(page, after)
			}
			return page, rs.Err()
		}
	}
	calls := map[string]int{}
	fn := func(ctx context.Context, p payment, e *steps.Effects) (int64, error) {
		calls[key(p)]++
		e.Add("paid", p.Amount)
		return p.Amount, nil
	}
	checkOnce := func(t *testing.T, runID, step string, want int) {
		t.Helper()
		for k, n := range calls {
			if n != 1 {
				t.Errorf("item %s processed %d times", k, n)
			}
		}
		var n int64
		err := st.Items(ctx, checkpoint.ItemQuery{RunID: runID, Step: step, Status: checkpoint.StepCompleted, KeysOnly: true}, func(checkpoint.Item) error {
			n++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		sum := checkpointtest.Balances(t, loc, checkpoint.StateTable)["paid"].Value
		wantSum := int64(want) * int64(want+1) / 2 * 10
		if n != int64(want) || sum != wantSum {
			t.Errorf("%d items completed, paid %d; want %d items, paid %d", n, sum, want, wantSum)
		}
	}

	t.Run("in order", func(t *testing.T) {
		clear(calls)
		fetches = 0
		run := beginEffects(t, st, "pay/ok")
		src := steps.Paged(100, key, fetch(nil), rows)
		sum, err := steps.ForEach(ctx, run, "pay", src, fn, steps.WithTarget(steps.State), steps.ChunkSize(100))
		if err != nil {
			t.Fatal(err)
		}
		if len(calls) != rows || sum.Completed != rows || sum.Total != rows || sum.Executed != rows {
			t.Fatalf("%d distinct items processed, summary %+v; want %d", len(calls), sum, rows)
		}
		// Ten full pages, then an empty one that ends the source.
		if fetches != rows/100+1 {
			t.Errorf("%d fetches, want %d", fetches, rows/100+1)
		}
		checkOnce(t, "pay/ok", "pay", rows)
		if _, err := db.Exec(`DELETE FROM stepwise_state`); err != nil {
			t.Fatal(err)
		}
	})

	for _, c := range []struct {
		name   string
		mangle func(page []payment, after string) []payment
	}{
		// Two rows of the third page swapped.
		{"swapped in a page", func(page []payment, after string) []payment {
			if after == key(payment{ID: 200}) {
				page[9], page[10] = page[10], page[9]
			}
			return page
		}},
		// The third page starts again from the last row of the second: a
		// fetch written with >= instead of >.
		{"repeated across pages", func(page []payment, after string) []payment {
			if after == key(payment{ID: 200}) {
				page = append([]payment{{ID: 200, Amount: 2000}}, page[:len(page)-1]...)
			}
			return page
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			clear(calls)
			runID := "pay/" + strings.ReplaceAll(c.name, " ", "-")
			run := beginEffects(t, st, runID)
			_, err := steps.ForEach(ctx, run, "pay", steps.Paged(100, key, fetch(c.mangle), rows), fn,
				steps.WithTarget(steps.State), steps.ChunkSize(100))
			if err == nil || !strings.Contains(err.Error(), "ascending order") {
				t.Fatalf("err = %v, want the paged source's out-of-order error", err)
			}
			checkOnce(t, runID, "pay", 200) // the two chunks before the bad page, nothing of it
			run2 := beginEffects(t, st, runID)
			sum, err := steps.ForEach(ctx, run2, "pay", steps.Paged(100, key, fetch(nil), rows), fn,
				steps.WithTarget(steps.State), steps.ChunkSize(100))
			if err != nil {
				t.Fatal(err)
			}
			if sum.Completed != rows || sum.Executed != rows-200 {
				t.Errorf("rerun summary %+v, want %d completed, %d executed", sum, rows, rows-200)
			}
			checkOnce(t, runID, "pay", rows)
			if _, err := db.Exec(`DELETE FROM stepwise_state`); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestFeRetrySkipped holds --retry-skipped to its meaning: items skipped
// under SkipFailures stay skipped on a plain rerun (a finished ForEach
// returns its recorded summary without calling fn), and are processed again,
// and only they, by an attempt with Config.RetrySkipped.
func TestFeRetrySkipped(t *testing.T) {
	ctx := context.Background()
	st, loc := checkpointtest.OpenNew(t)
	opening := map[string]int64{"a": 1000, "b": 0}
	ledger(t, loc, opening)
	target := steps.Target{Table: accountsTable}
	var items []xfer
	for i := range 10 {
		items = append(items, xfer{ID: fmt.Sprintf("T%02d", i), From: "a", To: "b", Amount: int64(i + 1)})
	}
	broken := map[string]bool{"T03": true, "T07": true}
	var calls []string
	fn := func(ctx context.Context, x xfer, e *steps.Effects) (int64, error) {
		calls = append(calls, x.ID)
		if broken[x.ID] {
			return 0, fmt.Errorf("bank link down for %s", x.ID)
		}
		return post(ctx, x, e)
	}
	attempt := func(retry bool) (steps.BatchSummary, error) {
		t.Helper()
		calls = nil
		c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: "j/k", Job: "j", RunKey: "k", Params: []byte("{}"), ParamsHash: "h",
			Owner: "test:1", Now: time.Now(), LeaseFor: time.Minute, OwnerGone: func(string) bool { return true }})
		if err != nil {
			t.Fatal(err)
		}
		run, err := steps.Begin(ctx, steps.Config{Store: st, Lease: c.Lease, RetrySkipped: retry})
		if err != nil {
			t.Fatal(err)
		}
		defer run.Close()
		return steps.ForEach(ctx, run, "post", steps.Slice(items, xferKey), fn, steps.WithTarget(target),
			steps.ChunkSize(4), steps.SkipFailures(5))
	}
	status := func(key string) string {
		var s string
		err := st.Items(ctx, checkpoint.ItemQuery{RunID: "j/k", Step: "post", Keys: []string{key}}, func(it checkpoint.Item) error {
			s = it.Status
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if s == "" {
			t.Fatalf("no checkpoint of item %s", key)
		}
		return s
	}

	sum, err := attempt(false)
	if err != nil || sum.Completed != 8 || sum.Skipped != 2 || sum.Total != 10 {
		t.Fatalf("first attempt: %+v, %v; want 8 completed, 2 skipped", sum, err)
	}
	// Every transfer but the two skipped applied once (the test follows
	// which items run, not how chunks merge writes).
	unskipped := slices.DeleteFunc(xferTransfers(items), func(x checkpointtest.Transfer) bool { return x.ID == "T03" || x.ID == "T07" })
	checkpointtest.CheckLedger(t, loc, accountsTable, checkpointtest.LedgerCheck{Opening: opening, Applied: unskipped, SkipVersions: true})
	if t.Failed() {
		t.FailNow()
	}

	// The link is back, but a plain rerun does not retry skipped items.
	broken = nil
	sum, err = attempt(false)
	if err != nil || len(calls) != 0 || sum.Skipped != 2 || sum.Completed != 8 {
		t.Fatalf("plain rerun: %+v, %v, calls %v; want the recorded summary and no calls", sum, err, calls)
	}
	if status("T03") != checkpoint.ItemSkipped {
		t.Fatalf("T03 is %q after a plain rerun, want skipped", status("T03"))
	}

	// --retry-skipped processes the two skipped items, and only them.
	sum, err = attempt(true)
	if err != nil {
		t.Fatalf("rerun with RetrySkipped: %v (ForEach must reopen a finished step that skipped items; "+
			"PutStep never overwrites a completed step)", err)
	}
	if !slices.Equal(calls, []string{"T03", "T07"}) || sum.Completed != 10 || sum.Skipped != 0 || sum.Executed != 2 {
		t.Fatalf("rerun with RetrySkipped: %+v, calls %v; want T03 and T07 processed, 10 completed", sum, calls)
	}
	checkpointtest.CheckLedger(t, loc, accountsTable, checkpointtest.LedgerCheck{Opening: opening, Applied: xferTransfers(items), SkipVersions: true})
	if status("T03") != checkpoint.StepCompleted || status("T07") != checkpoint.StepCompleted {
		t.Fatalf("T03 %q, T07 %q; want completed", status("T03"), status("T07"))
	}
	// Nothing is left to retry: another RetrySkipped attempt calls nothing.
	sum, err = attempt(true)
	if err != nil || len(calls) != 0 || sum.Completed != 10 {
		t.Fatalf("second RetrySkipped rerun: %+v, %v, calls %v", sum, err, calls)
	}
}

// feFaultStore is the real store with one fault: writing a batch step's
// running header fails, as a full disk, a lost lease or a kill between two
// commits would stop it.
type feFaultStore struct{ checkpoint.Backend }

var errFeHeader = errors.New("injected: cannot write the running header")

func (s feFaultStore) InTx(ctx context.Context, l checkpoint.Lease, fn func(checkpoint.Tx) error) error {
	return s.Backend.InTx(ctx, l, func(tx checkpoint.Tx) error { return fn(feFaultTx{tx}) })
}

type feFaultTx struct{ checkpoint.Tx }

func (tx feFaultTx) PutStep(st checkpoint.Step) error {
	if st.Status == checkpoint.StepRunning {
		return errFeHeader
	}
	return tx.Tx.PutStep(st)
}

// TestFeRetrySkippedInterrupted stops a --retry-skipped attempt right after
// it reopens the finished step, before it records the step as running
// again, and reruns plainly: the transfers completed before must not be
// applied a second time, whatever the rerun decides about the skipped ones.
func TestFeRetrySkippedInterrupted(t *testing.T) {
	ctx := context.Background()
	st, loc := checkpointtest.OpenNew(t)
	opening := map[string]int64{"a": 1000, "b": 0}
	ledger(t, loc, opening)
	target := steps.Target{Table: accountsTable}
	var items []xfer
	for i := range 10 {
		items = append(items, xfer{ID: fmt.Sprintf("T%02d", i), From: "a", To: "b", Amount: int64(i + 1)})
	}
	broken := map[string]bool{"T03": true, "T07": true}
	var calls []string
	fn := func(ctx context.Context, x xfer, e *steps.Effects) (int64, error) {
		calls = append(calls, x.ID)
		if broken[x.ID] {
			return 0, fmt.Errorf("bank link down for %s", x.ID)
		}
		return post(ctx, x, e)
	}
	attempt := func(store checkpoint.Backend, retry bool) (steps.BatchSummary, error) {
		t.Helper()
		calls = nil
		c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: "j/k", Job: "j", RunKey: "k", Params: []byte("{}"), ParamsHash: "h",
			Owner: "test:1", Now: time.Now(), LeaseFor: time.Minute, OwnerGone: func(string) bool { return true }})
		if err != nil {
			t.Fatal(err)
		}
		run, err := steps.Begin(ctx, steps.Config{Store: store, Lease: c.Lease, RetrySkipped: retry})
		if err != nil {
			t.Fatal(err)
		}
		defer run.Close()
		return steps.ForEach(ctx, run, "post", steps.Slice(items, xferKey), fn, steps.WithTarget(target),
			steps.ChunkSize(4), steps.SkipFailures(5))
	}
	if sum, err := attempt(st, false); err != nil || sum.Skipped != 2 {
		t.Fatalf("first attempt: %+v, %v; want 2 skipped", sum, err)
	}
	broken = nil
	if _, err := attempt(feFaultStore{st}, true); !errors.Is(err, errFeHeader) {
		t.Fatalf("retry attempt: err = %v, want the injected fault", err)
	}
	if _, err := attempt(st, false); err != nil {
		t.Fatalf("plain rerun: %v", err)
	}
	// The ledger holds exactly the transfers of the completed items, once
	// each: a completed transfer applied again means the reopened step
	// lost its header, so the rerun took the step for fresh.
	byID := map[string]checkpointtest.Transfer{}
	for _, x := range xferTransfers(items) {
		byID[x.ID] = x
	}
	var completed []checkpointtest.Transfer
	err := st.Items(ctx, checkpoint.ItemQuery{RunID: "j/k", Step: "post"}, func(it checkpoint.Item) error {
		if it.Status == checkpoint.StepCompleted {
			completed = append(completed, byID[it.Key])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range calls {
		if k != "T03" && k != "T07" {
			t.Errorf("the plain rerun called fn for %s, completed by the first attempt", k)
		}
	}
	checkpointtest.CheckLedger(t, loc, accountsTable, checkpointtest.LedgerCheck{Opening: opening, Applied: completed, SkipVersions: true})
}
