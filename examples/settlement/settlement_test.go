package settlement_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/checkpoint/postgres/pgtest"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
	"github.com/stepwise-run/stepwise/checkpoint/stores"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
)

// testDate is the business date the tests settle.
const testDate = "2026-11-28"

// smallLedger is the ledger most tests use: small enough to settle in well
// under a second, with opening balances low enough that some transfers
// overdraw and are rejected.
var smallLedger = settlement.SeedConfig{Accounts: 50, Transfers: 800, Date: testDate, Seed: 7, Balance: 10_000}

// registry holds the settle job, as cmd/stepwise registers it.
func registry() *jobs.Registry {
	var reg jobs.Registry
	reg.MustRegister(settlement.Job)
	return &reg
}

// The suite runs on the checkpoint store STEPWISE_TEST_STORE names:
// unset or "sqlite", a SQLite file per test (as the CLI's default);
// "postgres", a fresh schema per test in the STEPWISE_TEST_PG database
// (pgtest.Schema). A separate ledger is a SQLite file or, on postgres,
// also a database of its own (pgtest.Database). Nothing here reads a
// checkpoint store's tables: checkpoints are read through the contract
// (checkpoint.Backend) or the CLI, the ledger through its own SQL.
const storeEnv = "STEPWISE_TEST_STORE"

// onPostgres reports whether the suite runs on PostgreSQL, failing the
// test when STEPWISE_TEST_STORE asks for it without a server to use or
// names no store.
func onPostgres(t testing.TB) bool {
	t.Helper()
	switch v := os.Getenv(storeEnv); v {
	case "", "sqlite":
		return false
	case "postgres":
		if os.Getenv(pgtest.EnvURL) == "" {
			t.Fatalf("%s=postgres, but %s is not set: set it to the test server's URL, "+
				"e.g. postgres://postgres@127.0.0.1:5432/test", storeEnv, pgtest.EnvURL)
		}
		return true
	default:
		t.Fatalf("%s=%q: use sqlite (the default) or postgres", storeEnv, v)
		return false
	}
}

// isURL reports whether a location is a PostgreSQL database's URL; any
// other location is a SQLite file.
func isURL(loc string) bool { return stores.IsURL(loc) }

// openLedger opens the ledger at loc for the test's own SQL: a
// PostgreSQL database (postgres.OpenDB) or a SQLite file with the
// checkpoint store's pragmas.
func openLedger(t testing.TB, loc string) *sql.DB {
	t.Helper()
	var db *sql.DB
	var err error
	if isURL(loc) {
		db, err = postgres.OpenDB(context.Background(), postgres.Config{URL: loc})
	} else {
		db, err = sqlite.OpenTarget(context.Background(), sqlite.Config{Path: loc})
	}
	if err != nil {
		t.Fatalf("open ledger %s: %v", loc, err)
	}
	return db
}

// openStore opens the checkpoint store at loc with checkpoint/stores: its
// backend by the location, able to open effect targets of either backend.
func openStore(t testing.TB, loc string) checkpoint.Backend {
	t.Helper()
	ctx := context.Background()
	st, err := stores.Open(ctx, loc, stores.Settings{})
	if err != nil {
		t.Fatalf("open checkpoint store %s: %v", loc, err)
	}
	return st
}

// seed seeds cfg into the ledger at loc.
func seed(t testing.TB, loc string, cfg settlement.SeedConfig) {
	t.Helper()
	db := openLedger(t, loc)
	defer db.Close()
	if err := settlement.Seed(context.Background(), db, cfg); err != nil {
		t.Fatalf("seed %s: %v", loc, err)
	}
}

// newLedgerLocation returns a fresh, empty place for a ledger or a
// checkpoint store of the selected kind: a SQLite file path in a new
// directory, or on postgres a new schema (a URL with its search_path).
func newLocation(t testing.TB, file string) string {
	t.Helper()
	if onPostgres(t) {
		return pgtest.Schema(t)
	}
	return filepath.Join(t.TempDir(), file)
}

// ledgerKind is where a layout keeps the ledger.
type ledgerKind int

const (
	// sameStore: the ledger's tables are in the checkpoint database (a
	// chunk's balances and checkpoints commit in one transaction).
	sameStore ledgerKind = iota
	// ledgerFile: the ledger is a SQLite file of its own (plan, apply,
	// record), whatever the checkpoint store is.
	ledgerFile
	// ledgerDatabase: the ledger is another PostgreSQL database on the
	// server (postgres only).
	ledgerDatabase
)

// layout is one place for the ledger, named as the subtests are.
type layout struct {
	name string
	kind ledgerKind
	// server is, for ledgerDatabase, the database the test's ledgers
	// live in, a fresh schema each: one CREATE DATABASE per test function
	// rather than per case, which on two shared cores costs seconds.
	server string
}

func (l layout) separate() bool { return l.kind != sameStore }

// sameStoreLayout is the ledger in the checkpoint database.
var sameStoreLayout = layout{name: "same store", kind: sameStore}

// layouts are the places the ledger can live beside the selected store:
// on SQLite the same file or another file; on PostgreSQL the same
// database, another database (made now, for t and its subtests), or a
// SQLite file.
func layouts(t testing.TB) []layout {
	t.Helper()
	file := layout{name: "separate file", kind: ledgerFile}
	if onPostgres(t) {
		return []layout{sameStoreLayout, {name: "separate database", kind: ledgerDatabase, server: pgtest.Database(t)}, file}
	}
	return []layout{sameStoreLayout, file}
}

// schemaIn creates a fresh schema in the database of dbURL, dropped when t
// ends, and returns a URL whose search_path is that schema.
func schemaIn(t testing.TB, dbURL string) string {
	t.Helper()
	name := pgtest.Name(t)
	pgtest.Exec(t, dbURL, "CREATE SCHEMA "+name)
	t.Cleanup(func() { pgtest.Exec(t, dbURL, "DROP SCHEMA "+name+" CASCADE") })
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// store is where a test's run keeps its checkpoints and its ledger.
type store struct {
	db     string // the checkpoint store: a SQLite file or a PostgreSQL URL (--db)
	ledger string // the ledger parameter: "" (same store), a SQLite file or a PostgreSQL URL
}

// ledgerLoc is the database the ledger lives in.
func (s store) ledgerLoc() string {
	if s.ledger == "" {
		return s.db
	}
	return s.ledger
}

// newStore makes a fresh store of the selected kind with the ledger
// where l puts it, and seeds cfg into the ledger: a PostgreSQL ledger by
// settlement.Seed, a SQLite file as a copy of one seeded once per test
// binary (Seed is reproducible; modernc SQLite under -race is slow enough
// that seeding every case's file costs much of the suite's time).
func newStore(t testing.TB, l layout, cfg settlement.SeedConfig) store {
	t.Helper()
	s := emptyStore(t, l)
	if loc := s.ledgerLoc(); isURL(loc) {
		seed(t, loc, cfg)
	} else {
		copyFile(t, seededFile(t, cfg), loc)
	}
	return s
}

// templates holds the seeded ledger files newStore copies, one per seed
// configuration, in templateDir (removed by TestMain).
var (
	templateMu  sync.Mutex
	templateDir string
	templates   = map[settlement.SeedConfig]string{}
)

// seededFile returns a SQLite ledger file seeded with cfg, made the first
// time cfg is asked for. Never write to it: copy it.
func seededFile(t testing.TB, cfg settlement.SeedConfig) string {
	t.Helper()
	templateMu.Lock()
	defer templateMu.Unlock()
	if path, ok := templates[cfg]; ok {
		return path
	}
	if templateDir == "" {
		dir, err := os.MkdirTemp("", "settlement-ledgers-")
		if err != nil {
			t.Fatal(err)
		}
		templateDir = dir
	}
	path := filepath.Join(templateDir, fmt.Sprintf("ledger-%d.db", len(templates)))
	seed(t, path, cfg)
	if _, err := os.Stat(path + "-wal"); err == nil {
		t.Fatalf("the seeded ledger %s kept a WAL file; copying it alone would lose rows", path)
	}
	templates[cfg] = path
	return path
}

// removeTemplates deletes the seeded ledger files.
func removeTemplates() {
	templateMu.Lock()
	defer templateMu.Unlock()
	if templateDir != "" {
		os.RemoveAll(templateDir)
	}
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// emptyStore makes a fresh store of the selected kind with an empty
// ledger location where l puts it.
func emptyStore(t testing.TB, l layout) store {
	t.Helper()
	s := store{db: newLocation(t, "stepwise.db")}
	switch l.kind {
	case ledgerFile:
		s.ledger = filepath.Join(t.TempDir(), "ledger.db")
	case ledgerDatabase:
		if l.server == "" {
			t.Fatalf("layout %q has no database to put ledgers in (make layouts with layouts(t))", l.name)
		}
		s.ledger = schemaIn(t, l.server)
	}
	return s
}

// open opens the layout's checkpoint store.
func (s store) open(t testing.TB) checkpoint.Backend {
	t.Helper()
	return openStore(t, s.db)
}

// values are the settle job's -p parameters for this layout.
func (s store) values(date string, chunk int) map[string]string {
	v := map[string]string{"date": date, "chunk": strconv.Itoa(chunk)}
	if s.ledger != "" {
		v["ledger"] = s.ledger
	}
	return v
}

// settle runs the settle job in this process through the runner, as the
// run command does.
func (s store) settle(t testing.TB, date string, chunk int, force bool) (runner.Result, error) {
	t.Helper()
	st := s.open(t)
	defer st.Close()
	r, err := runner.New(runner.Config{Store: st, Jobs: registry()})
	if err != nil {
		t.Fatal(err)
	}
	return r.Run(context.Background(), runner.Request{Job: settlement.Job.Name(), Values: s.values(date, chunk), Force: force})
}

// mustSettle settles date and fails the test unless the run succeeds.
func (s store) mustSettle(t testing.TB, date string, chunk int) runner.Result {
	t.Helper()
	res, err := s.settle(t, date, chunk, false)
	if err != nil || res.Status != checkpoint.RunSucceeded {
		t.Fatalf("settle %s: status %q, %v", date, res.Status, err)
	}
	return res
}

// check runs settlement.Check on the layout's ledger.
func (s store) check(t testing.TB, date string) settlement.Report {
	t.Helper()
	db := openLedger(t, s.ledgerLoc())
	defer db.Close()
	rep, err := settlement.Check(context.Background(), db, date)
	if err != nil {
		t.Fatalf("ledger check: %v", err)
	}
	return rep
}

// summary returns the settlement summary the run of date recorded.
func (s store) summary(t testing.TB, date string) settlement.Summary {
	t.Helper()
	st := s.open(t)
	defer st.Close()
	var sum *settlement.Summary
	err := st.Steps(context.Background(), jobs.RunID(settlement.Job.Name(), date), func(c checkpoint.Step) error {
		if c.ID != "summary" {
			return nil
		}
		if c.Status != checkpoint.StepCompleted {
			return fmt.Errorf("summary step is %s", c.Status)
		}
		v, err := settlement.DecodeSummary(c.Output)
		sum = &v
		return err
	})
	if err != nil || sum == nil {
		t.Fatalf("read the summary of %s: %v (found: %v)", date, err, sum != nil)
	}
	return *sum
}

// items returns the status of every recorded item of the run's post step.
func (s store) items(t testing.TB, date string) map[string]string {
	t.Helper()
	st := s.open(t)
	defer st.Close()
	out := map[string]string{}
	q := checkpoint.ItemQuery{RunID: jobs.RunID(settlement.Job.Name(), date), Step: "post", KeysOnly: true}
	if err := st.Items(context.Background(), q, func(it checkpoint.Item) error {
		out[it.Key] = it.Status
		return nil
	}); err != nil {
		t.Fatalf("read items: %v", err)
	}
	return out
}

// plans returns the status of every chunk plan of the run's post step,
// applied and superseded ones too (Inspector.RunChunkPlans), by effect ID.
func (s store) plans(t testing.TB, date string) map[string]string {
	t.Helper()
	st := s.open(t)
	defer st.Close()
	out := map[string]string{}
	err := st.RunChunkPlans(context.Background(), jobs.RunID(settlement.Job.Name(), date), checkpoint.Page{}, func(p checkpoint.ChunkPlan) error {
		if p.Step == "post" {
			out[p.EffectID] = p.Status
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read chunk plans: %v", err)
	}
	return out
}

// applied reports, for each effect ID, whether the ledger records it as
// applied, asked through the store's effect target (Target.IsApplied).
func (s store) applied(t testing.TB, ids []string) map[string]bool {
	t.Helper()
	ctx := context.Background()
	st := s.open(t)
	defer st.Close()
	et, err := st.OpenTarget(ctx, checkpoint.TargetSpec{Location: s.ledger, Table: settlement.Accounts, ReadOnly: true})
	if err != nil {
		t.Fatalf("open the ledger as an effect target: %v", err)
	}
	defer et.Close()
	out := map[string]bool{}
	if err := et.View(ctx, func(tg checkpoint.Target) error {
		for _, id := range ids {
			ok, err := tg.IsApplied(ctx, id)
			if err != nil {
				return err
			}
			out[id] = ok
		}
		return nil
	}); err != nil {
		t.Fatalf("look up applied effects: %v", err)
	}
	return out
}

// accounts is every account's balance and version.
type accounts map[string][2]int64

func readAccounts(t testing.TB, loc string) accounts {
	t.Helper()
	db := openLedger(t, loc)
	defer db.Close()
	rows, err := db.Query(`SELECT id, balance, version FROM accounts`)
	if err != nil {
		t.Fatalf("read accounts: %v", err)
	}
	defer rows.Close()
	out := accounts{}
	for rows.Next() {
		var id string
		var b, v int64
		if err := rows.Scan(&id, &b, &v); err != nil {
			t.Fatal(err)
		}
		out[id] = [2]int64{b, v}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// dump returns the ledger's tables as text, for comparing two ledgers.
func dump(t testing.TB, loc string) string {
	t.Helper()
	db := openLedger(t, loc)
	defer db.Close()
	var b strings.Builder
	for _, q := range []string{
		`SELECT id, balance, version FROM accounts ORDER BY id`,
		`SELECT id, business_date, from_account, to_account, amount FROM transfers ORDER BY id`,
		`SELECT business_date, account_id, balance FROM opening_balances ORDER BY business_date, account_id`,
	} {
		rows, err := db.Query(q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		cols, _ := rows.Columns()
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		for rows.Next() {
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintln(&b, vals...)
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		rows.Close()
		b.WriteString("--\n")
	}
	return b.String()
}

// count runs a count(*) query ($n placeholders) on the ledger at loc.
func count(t testing.TB, loc, query string, args ...any) int {
	t.Helper()
	db := openLedger(t, loc)
	defer db.Close()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func TestSeedIsReproducible(t *testing.T) {
	t.Parallel()
	a, b, c := newLocation(t, "a.db"), newLocation(t, "b.db"), newLocation(t, "c.db")
	seed(t, a, smallLedger)
	seed(t, b, smallLedger)
	if da, db := dump(t, a), dump(t, b); da != db {
		t.Fatalf("the same seed made two different ledgers:\n%.500s\n...\n%.500s", da, db)
	}
	other := smallLedger
	other.Seed++
	seed(t, c, other)
	if dump(t, a) == dump(t, c) {
		t.Fatalf("seeds %d and %d made the same ledger", smallLedger.Seed, other.Seed)
	}
	if n := count(t, a, `SELECT count(*) FROM transfers WHERE from_account = to_account`); n != 0 {
		t.Errorf("%d transfers go from an account to itself", n)
	}

	// Another date in the same ledger adds that date's transfers over the
	// accounts already there (Accounts is ignored) and records the current
	// balances as its opening balances (past the unsettled first date only
	// when told to).
	before := readAccounts(t, a)
	firstDay := count(t, a, `SELECT count(*) FROM transfers WHERE business_date = $1`, testDate)
	next := settlement.SeedConfig{Accounts: 999, Transfers: 300, Date: "2026-11-29", Seed: 7, Balance: 1, AllowUnsettled: true}
	seed(t, a, next)
	if got := readAccounts(t, a); !mapsEqual(got, before) {
		t.Errorf("seeding another date changed the accounts: %d accounts before, %d after", len(before), len(got))
	}
	if n := count(t, a, `SELECT count(*) FROM transfers WHERE business_date = $1`, next.Date); n != next.Transfers {
		t.Errorf("%d transfers on %s, want %d", n, next.Date, next.Transfers)
	}
	if n := count(t, a, `SELECT count(*) FROM transfers WHERE business_date = $1`, testDate); n != firstDay {
		t.Errorf("%s has %d transfers after seeding another date, had %d", testDate, n, firstDay)
	}
	if n := count(t, a, `SELECT count(*) FROM transfers t WHERE business_date = $1
AND (NOT EXISTS (SELECT 1 FROM accounts WHERE id = t.from_account) OR NOT EXISTS (SELECT 1 FROM accounts WHERE id = t.to_account))`, next.Date); n != 0 {
		t.Errorf("%d transfers of %s name accounts that do not exist", n, next.Date)
	}
	if n := count(t, a, `SELECT count(*) FROM opening_balances o JOIN accounts a ON a.id = o.account_id
WHERE o.business_date = $1 AND o.balance = a.balance`, next.Date); n != len(before) {
		t.Errorf("%d of %d accounts have their current balance as %s's opening balance", n, len(before), next.Date)
	}
	if da, db := dump(t, a), dump(t, b); da == db {
		t.Error("seeding another date changed nothing")
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestSeedRefusesASeededDate(t *testing.T) {
	t.Parallel()
	path := newLocation(t, "ledger.db")
	seed(t, path, smallLedger)
	before := dump(t, path)
	db := openLedger(t, path)
	defer db.Close()
	again := smallLedger
	again.Seed = 99
	err := settlement.Seed(context.Background(), db, again)
	if !errors.Is(err, settlement.ErrAlreadySeeded) {
		t.Fatalf("seeding %s again: %v, want ErrAlreadySeeded", testDate, err)
	}
	if !strings.Contains(err.Error(), testDate) {
		t.Errorf("error %q does not name the date", err)
	}
	if after := dump(t, path); after != before {
		t.Error("a refused seed changed the ledger")
	}
}

func TestSettleThenCheck(t *testing.T) {
	t.Parallel()
	for _, l := range layouts(t) {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, l, smallLedger)
			if rep := s.check(t, testDate); rep.OK() {
				t.Fatalf("ledger check passed on a day not settled yet:\n%s", rep)
			}
			res := s.mustSettle(t, testDate, 100)
			if res.RunID != "settle/"+testDate || res.Attempt != 1 || res.Stats.Executed < 3 || res.Stats.Skipped != 0 {
				t.Errorf("result %+v, want run settle/%s with every step (count, post, summary, ...) executed", res, testDate)
			}

			rep := s.check(t, testDate)
			if !rep.OK() {
				t.Fatalf("ledger check failed after settlement:\n%s", rep)
			}
			if rep.Transfers != smallLedger.Transfers || rep.Accounts != smallLedger.Accounts {
				t.Errorf("check saw %d transfers over %d accounts, want %d over %d", rep.Transfers, rep.Accounts, smallLedger.Transfers, smallLedger.Accounts)
			}
			if rep.Posted == 0 || rep.Rejected == 0 {
				t.Fatalf("the test ledger should post some and reject some transfers: %d posted, %d rejected", rep.Posted, rep.Rejected)
			}

			// The job's own summary agrees with the independent audit, and
			// with the items it recorded.
			sum := s.summary(t, testDate)
			if sum.Date != testDate || sum.Transfers != int64(rep.Transfers) || sum.Posted != int64(rep.Posted) || sum.Rejected != int64(rep.Rejected) {
				t.Errorf("summary %s: %d transfers, %d posted, %d rejected; ledger check: %d, %d, %d",
					sum.Date, sum.Transfers, sum.Posted, sum.Rejected, rep.Transfers, rep.Posted, rep.Rejected)
			}
			items := s.items(t, testDate)
			var rejected []string
			for k, st := range items {
				switch st {
				case checkpoint.StepRejected:
					rejected = append(rejected, k)
				case checkpoint.StepCompleted:
				default:
					t.Errorf("item %s is %s after a successful run", k, st)
				}
			}
			slices.Sort(rejected)
			if len(items) != rep.Transfers || len(rejected) != rep.Rejected {
				t.Errorf("%d items recorded (%d rejected); want %d (%d)", len(items), len(rejected), rep.Transfers, rep.Rejected)
			}
			if want := rejected[:min(len(rejected), settlement.MaxListed)]; !slices.Equal(sum.RejectedIDs, want) {
				t.Errorf("summary lists rejected %v, want the first %d rejected items %v", sum.RejectedIDs, settlement.MaxListed, want)
			}
			total := int64(count(t, s.ledgerLoc(), `SELECT sum(amount) FROM transfers WHERE business_date = $1`, testDate))
			args := []any{}
			marks := []string{}
			for i, k := range rejected {
				args = append(args, k)
				marks = append(marks, "$"+strconv.Itoa(i+1))
			}
			rejAmount := int64(count(t, s.ledgerLoc(), `SELECT COALESCE(sum(amount), 0) FROM transfers WHERE id IN (`+
				strings.Join(marks, ",")+`)`, args...))
			if sum.RejectedAmount != rejAmount || sum.PostedAmount != total-rejAmount {
				t.Errorf("summary amounts: posted %d, rejected %d; want %d, %d", sum.PostedAmount, sum.RejectedAmount, total-rejAmount, rejAmount)
			}
		})
	}
}

func TestCheckNamesADoubleApply(t *testing.T) {
	t.Parallel()
	for _, l := range layouts(t) {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, l, smallLedger)
			s.mustSettle(t, testDate, 250)
			if rep := s.check(t, testDate); !rep.OK() {
				t.Fatalf("ledger check failed before the corruption:\n%s", rep)
			}
			// Post one posted transfer a second time, as a runner that
			// lost track of it would: both balances move, money is still
			// conserved, so only the per-account audit can see it.
			var key string
			for k, st := range s.items(t, testDate) {
				if st == checkpoint.StepCompleted && (key == "" || k < key) {
					key = k
				}
			}
			db := openLedger(t, s.ledgerLoc())
			var from, to string
			var amount int64
			if err := db.QueryRow(`SELECT from_account, to_account, amount FROM transfers WHERE id = $1`, key).Scan(&from, &to, &amount); err != nil {
				t.Fatal(err)
			}
			for _, q := range []struct {
				id    string
				delta int64
			}{{from, -amount}, {to, amount}} {
				if _, err := db.Exec(`UPDATE accounts SET balance = balance + $1, version = version + 1 WHERE id = $2`, q.delta, q.id); err != nil {
					t.Fatal(err)
				}
			}
			db.Close()

			rep := s.check(t, testDate)
			if rep.OK() {
				t.Fatalf("ledger check passed after %s was applied twice:\n%s", key, rep)
			}
			if rep.Total != rep.OpeningTotal {
				t.Errorf("a double transfer conserves money, yet check reports total %d, opening %d", rep.Total, rep.OpeningTotal)
			}
			wrong := map[string]int64{}
			for _, m := range rep.Mismatches {
				wrong[m.Account] = m.Got - m.Want
			}
			if want := map[string]int64{from: -amount, to: amount}; !mapsEqual(wrong, want) {
				t.Errorf("check names %v (account: off by), want exactly %v", wrong, want)
			}
			text := rep.String()
			for _, id := range []string{from, to} {
				if !strings.Contains(text, "WRONG "+id) {
					t.Errorf("report does not name %s:\n%s", id, text)
				}
			}
		})
	}
}

func TestRerunAfterSuccessPostsNothing(t *testing.T) {
	t.Parallel()
	for _, l := range layouts(t) {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, l, smallLedger)
			first := s.mustSettle(t, testDate, 100)
			before := readAccounts(t, s.ledgerLoc())
			plans := s.plans(t, testDate)
			if l.separate() && len(plans) == 0 {
				t.Error("no chunk plans recorded; a separate ledger is settled through them")
			}
			items := s.items(t, testDate)
			sum := s.summary(t, testDate)

			// A plain rerun is refused as already succeeded (exit 0 in the
			// CLI); a forced one replays every step from its checkpoint.
			res, err := s.settle(t, testDate, 100, false)
			if !errors.Is(err, checkpoint.ErrAlreadySucceeded) {
				t.Errorf("rerun without force: %+v, %v; want ErrAlreadySucceeded", res, err)
			}
			res, err = s.settle(t, testDate, 100, true)
			if err != nil || res.Status != checkpoint.RunSucceeded {
				t.Fatalf("forced rerun: %+v, %v", res, err)
			}
			if res.Attempt != 2 || res.Stats.Executed != 0 || res.Stats.Skipped != first.Stats.Executed {
				t.Errorf("forced rerun: attempt %d, %d steps executed, %d skipped; want attempt 2, 0 executed and all %d skipped",
					res.Attempt, res.Stats.Executed, res.Stats.Skipped, first.Stats.Executed)
			}
			if after := readAccounts(t, s.ledgerLoc()); !mapsEqual(after, before) {
				t.Error("a forced rerun of a settled day changed balances or versions")
			}
			if got := s.plans(t, testDate); !mapsEqual(got, plans) {
				t.Errorf("the rerun changed the chunk plans: %v, then %v", plans, got)
			}
			if got := s.items(t, testDate); !mapsEqual(got, items) {
				t.Error("a forced rerun changed the recorded items")
			}
			if got := s.summary(t, testDate); !slices.Equal(got.RejectedIDs, sum.RejectedIDs) || got.Posted != sum.Posted {
				t.Errorf("summary changed across the rerun: %+v, then %+v", sum, got)
			}
			if rep := s.check(t, testDate); !rep.OK() {
				t.Fatalf("ledger check failed after the forced rerun:\n%s", rep)
			}
		})
	}
}

// The next business date settles over the balances the last one left, and
// its check passes from the opening balances its seed recorded.
func TestSettleTheNextDay(t *testing.T) {
	t.Parallel()
	s := newStore(t, sameStoreLayout, smallLedger)
	s.mustSettle(t, testDate, 100)
	next := settlement.SeedConfig{Transfers: 500, Date: "2026-11-29", Seed: 8, Accounts: 2, Balance: 10_000}
	seed(t, s.ledgerLoc(), next)
	s.mustSettle(t, next.Date, 100)
	if rep := s.check(t, next.Date); !rep.OK() || rep.Transfers != next.Transfers {
		t.Fatalf("check of %s:\n%s", next.Date, rep)
	}
	// The earlier day still audits clean: it is compared with the next
	// day's opening balances, not with today's.
	if rep := s.check(t, testDate); !rep.OK() {
		t.Fatalf("check of the earlier day %s after the next one settled:\n%s", testDate, rep)
	}
}
