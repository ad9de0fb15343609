package settlement_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
)

// The changed-source cases: a settlement is killed with SIGKILL mid-post
// (in a real process, as in the crash campaign), the day's transfers
// table is changed, and the rerun must stop with exit 5 naming the
// transfer and the change, with no balance moved twice, instead of
// settling silently wrong. Then the operator's path (restore the data,
// accept the change, or reset the count) ends with the run succeeded and
// ledger check passing. A transfer never posted and altered since is not a
// change to refuse: it posts with its new amount.

// changeCase is one change to the transfers table between two attempts.
type changeCase struct {
	name  string
	crash string // where the first attempt dies
	// change alters the ledger and returns the transfer concerned.
	change func(t *testing.T, c *changeRun) string
	// refused is what the exit-5 error says; "" when the rerun must succeed.
	refused string
	// fix is the operator's way out after the refusal.
	fix func(t *testing.T, c *changeRun)
	// accepted: the fix went through --accept-changed (audited).
	accepted bool
}

// changeRun is one case's settlement, with what the ledger held before the
// change, so the test knows what each posted transfer moved.
type changeRun struct {
	s         store
	runID     string
	transfers map[string]settlement.Transfer // every transfer ever in the table
}

// cli runs the stepwise command line in this process (the rerun and the
// operator's commands; the killed attempt is a real process).
func (c *changeRun) cli(t *testing.T, args ...string) (int, string) {
	t.Helper()
	args = append([]string{"--db", c.s.db, "--log-level", "error"}, args...)
	var out, errb bytes.Buffer
	code := cmd.Execute(context.Background(), registry(), args, &out, &errb)
	return code, out.String() + errb.String()
}

// settle runs the settle job as the campaign's children do.
func (c *changeRun) settle(t *testing.T) (int, string) {
	t.Helper()
	args := []string{"run", "settle", "--progress", "none"}
	for k, v := range c.s.values(testDate, campaignChunk) {
		args = append(args, "-p", k+"="+v)
	}
	return c.cli(t, args...)
}

func (c *changeRun) exec(t *testing.T, query string, args ...any) {
	t.Helper()
	db := openLedger(t, c.s.ledgerLoc())
	defer db.Close()
	res, err := db.Exec(query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("%s %v changed %d rows, want 1", query, args, n)
	}
}

// add inserts a transfer into the day (and into what the test knows).
func (c *changeRun) add(t *testing.T, tr settlement.Transfer) string {
	t.Helper()
	c.exec(t, `INSERT INTO transfers (id, business_date, from_account, to_account, amount) VALUES ($1, $2, $3, $4, $5)`,
		tr.ID, testDate, tr.From, tr.To, tr.Amount)
	c.transfers[tr.ID] = tr
	return tr.ID
}

// posted returns a transfer the killed attempt posted, at or after the nth.
func (c *changeRun) posted(t *testing.T, n int) string {
	t.Helper()
	items := c.s.items(t, testDate)
	for ; n <= campaignLedger.Transfers; n++ {
		if id := settlement.TransferID(testDate, n); items[id] == checkpoint.StepCompleted {
			return id
		}
	}
	t.Fatalf("no posted transfer from number %d on", n)
	return ""
}

// lastPosted returns the last transfer of the day the killed attempt
// posted.
func (c *changeRun) lastPosted(t *testing.T) string {
	t.Helper()
	items := c.s.items(t, testDate)
	for n := campaignLedger.Transfers; n > 0; n-- {
		if id := settlement.TransferID(testDate, n); items[id] == checkpoint.StepCompleted {
			return id
		}
	}
	t.Fatal("no posted transfer")
	return ""
}

func readTransfers(t *testing.T, path string) map[string]settlement.Transfer {
	t.Helper()
	db := openLedger(t, path)
	defer db.Close()
	rows, err := db.Query(`SELECT id, from_account, to_account, amount FROM transfers WHERE business_date = $1`, testDate)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]settlement.Transfer{}
	for rows.Next() {
		var tr settlement.Transfer
		if err := rows.Scan(&tr.ID, &tr.From, &tr.To, &tr.Amount); err != nil {
			t.Fatal(err)
		}
		out[tr.ID] = tr
	}
	return out
}

// postedOnce returns how the ledger disagrees with its opening balances
// plus the transfers recorded as posted, each once, with the amount it was
// posted with (its item's output): a transfer posted twice, or posted and
// not recorded, shows here whatever the transfers table now says; so does
// money not conserved.
func (c *changeRun) postedOnce(t *testing.T) []string {
	t.Helper()
	ctx := context.Background()
	opening := map[string]int64{}
	db := openLedger(t, c.s.ledgerLoc())
	rows, err := db.Query(`SELECT account_id, balance FROM opening_balances WHERE business_date = $1`, testDate)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var b int64
		if err := rows.Scan(&id, &b); err != nil {
			t.Fatal(err)
		}
		opening[id] = b
	}
	rows.Close()
	db.Close()
	st := c.s.open(t)
	defer st.Close()
	var posted []checkpointtest.Transfer
	err = st.Items(ctx, checkpoint.ItemQuery{RunID: c.runID, Step: "post", Status: checkpoint.StepCompleted}, func(it checkpoint.Item) error {
		var amount int64
		if err := json.Unmarshal(it.Output, &amount); err != nil {
			return fmt.Errorf("item %s: %w", it.Key, err)
		}
		tr, ok := c.transfers[it.Key]
		if !ok {
			return fmt.Errorf("item %s is no transfer the test knows", it.Key)
		}
		posted = append(posted, checkpointtest.Transfer{ID: it.Key, From: tr.From, To: tr.To, Amount: amount})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]checkpoint.State{}
	for id, bv := range readAccounts(t, c.s.ledgerLoc()) {
		got[id] = checkpoint.State{Value: bv[0], Version: bv[1], Exists: true}
	}
	// Chunks merge transfers into one write per account: versions follow
	// no count the test keeps.
	return checkpointtest.LedgerCheck{Opening: opening, Applied: posted, SkipVersions: true}.Problems(got)
}

func (c *changeRun) audits(t *testing.T) []string {
	t.Helper()
	st := c.s.open(t)
	defer st.Close()
	as, err := st.Audits(context.Background(), c.runID)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range as {
		out = append(out, a.Command+": "+a.Reason+": "+a.Details)
	}
	return out
}

func (c *changeRun) mustSucceed(t *testing.T, what string, code int, out string) {
	t.Helper()
	if code != cmd.ExitOK {
		t.Fatalf("%s exited %d, want 0:\n%s", what, code, out)
	}
}

// midPost kills the first attempt after chunk #2 of six: 150 transfers
// posted or rejected, 150 to go.
const midPost = "step:post#2:after-commit"

// appended is a transfer added to the day after the crash: small enough to
// overdraw nothing, so the rest of the day settles as before.
func appended(id string) settlement.Transfer {
	return settlement.Transfer{ID: id, From: settlement.AccountID(3), To: settlement.AccountID(4), Amount: 1}
}

func changeCases() []changeCase {
	accept := func(t *testing.T, c *changeRun) {
		code, out := c.cli(t, "resume", c.runID, "--progress", "none", "--operator", "ops@bank",
			"--accept-changed", "--reason", "late transfer confirmed by the ledger team")
		c.mustSucceed(t, "resume --accept-changed", code, out)
	}
	restore := func(t *testing.T, c *changeRun, id string) {
		tr := c.transfers[id]
		db := openLedger(t, c.s.ledgerLoc())
		defer db.Close()
		if _, err := db.Exec(`INSERT INTO transfers (id, business_date, from_account, to_account, amount) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (id) DO UPDATE SET business_date = excluded.business_date, from_account = excluded.from_account,
to_account = excluded.to_account, amount = excluded.amount`,
			tr.ID, testDate, tr.From, tr.To, tr.Amount); err != nil {
			t.Fatal(err)
		}
		code, out := c.cli(t, "resume", c.runID, "--progress", "none")
		c.mustSucceed(t, "resume after restoring "+id, code, out)
	}
	var deleted, altered string                                         // of the mid-post cases
	var deletedLast, deletedLastOne, alteredLast, alteredLastOne string // of the last-chunk cases
	return []changeCase{{
		name:  "append one",
		crash: midPost,
		change: func(t *testing.T, c *changeRun) string {
			return c.add(t, appended(settlement.TransferID(testDate, campaignLedger.Transfers+1)))
		},
		refused:  "yields more items than the 300 it declares",
		fix:      accept,
		accepted: true,
	}, {
		name:  "delete a posted one",
		crash: midPost,
		change: func(t *testing.T, c *changeRun) string {
			deleted = c.posted(t, 42)
			c.exec(t, `DELETE FROM transfers WHERE id = $1`, deleted)
			return deleted
		},
		refused: "the source no longer yields it",
		fix:     func(t *testing.T, c *changeRun) { restore(t, c, deleted) },
	}, {
		name:  "alter a posted one",
		crash: midPost,
		change: func(t *testing.T, c *changeRun) string {
			altered = c.posted(t, 77)
			c.exec(t, `UPDATE transfers SET amount = amount + 100 WHERE id = $1`, altered)
			return altered
		},
		refused: "changed since it was processed",
		fix:     func(t *testing.T, c *changeRun) { restore(t, c, altered) },
	}, {
		name:  "alter a not-yet-posted one",
		crash: midPost,
		change: func(t *testing.T, c *changeRun) string {
			id := settlement.TransferID(testDate, 250)
			c.exec(t, `UPDATE transfers SET amount = 1 WHERE id = $1`, id)
			return id
		},
	}, {
		name:  "insert one in the middle",
		crash: midPost,
		change: func(t *testing.T, c *changeRun) string {
			return c.add(t, appended(settlement.TransferID(testDate, 50)+"a"))
		},
		refused:  "is new, yet sorts before",
		fix:      accept,
		accepted: true,
	}, {
		// Every declared item is finished and the post step is not: the
		// rerun must read the transfers again, not finish from the counts.
		name:  "delete a posted one after a crash at the last chunk",
		crash: "step:post#" + strconv.Itoa(lastChunk) + ":after-commit",
		change: func(t *testing.T, c *changeRun) string {
			deletedLast = c.posted(t, 142)
			c.exec(t, `DELETE FROM transfers WHERE id = $1`, deletedLast)
			return deletedLast
		},
		refused: "the source no longer yields it",
		fix:     func(t *testing.T, c *changeRun) { restore(t, c, deletedLast) },
	}, {
		name:  "delete the last posted one after a crash at the last chunk",
		crash: "step:post#" + strconv.Itoa(lastChunk) + ":after-commit",
		change: func(t *testing.T, c *changeRun) string {
			deletedLastOne = c.lastPosted(t)
			c.exec(t, `DELETE FROM transfers WHERE id = $1`, deletedLastOne)
			return deletedLastOne
		},
		refused: "the source no longer yields it",
		fix:     func(t *testing.T, c *changeRun) { restore(t, c, deletedLastOne) },
	}, {
		name:  "alter a posted one after a crash at the last chunk",
		crash: "step:post#" + strconv.Itoa(lastChunk) + ":after-commit",
		change: func(t *testing.T, c *changeRun) string {
			alteredLast = c.posted(t, 142)
			c.exec(t, `UPDATE transfers SET amount = amount + 1 WHERE id = $1`, alteredLast)
			return alteredLast
		},
		refused: "changed since it was processed",
		fix:     func(t *testing.T, c *changeRun) { restore(t, c, alteredLast) },
	}, {
		name:  "alter the last posted one after a crash at the last chunk",
		crash: "step:post#" + strconv.Itoa(lastChunk) + ":after-commit",
		change: func(t *testing.T, c *changeRun) string {
			alteredLastOne = c.lastPosted(t)
			c.exec(t, `UPDATE transfers SET amount = amount + 1 WHERE id = $1`, alteredLastOne)
			return alteredLastOne
		},
		refused: "changed since it was processed",
		fix:     func(t *testing.T, c *changeRun) { restore(t, c, alteredLastOne) },
	}, {
		name:  "append after a crash at the last chunk",
		crash: "step:post#" + strconv.Itoa(lastChunk) + ":after-commit",
		change: func(t *testing.T, c *changeRun) string {
			return c.add(t, appended(settlement.TransferID(testDate, campaignLedger.Transfers+1)))
		},
		refused: "yields more items than the 300 it declares",
		// The count step's total is stale: counted again, the day has
		// 301 transfers and the new one posts.
		fix: func(t *testing.T, c *changeRun) {
			code, out := c.cli(t, "reset", c.runID, "--step", "count", "--reason", "a late transfer joined the day")
			c.mustSucceed(t, "reset --step count", code, out)
			code, out = c.cli(t, "resume", c.runID, "--progress", "none")
			c.mustSucceed(t, "resume after the recount", code, out)
			if sum := c.s.summary(t, testDate); sum.Transfers != int64(campaignLedger.Transfers+1) {
				t.Errorf("summary counts %d transfers, want %d", sum.Transfers, campaignLedger.Transfers+1)
			}
		},
	}}
}

func TestChangedSourceBetweenAttempts(t *testing.T) {
	t.Parallel()
	for _, l := range layouts(t) {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			for _, cc := range changeCases() {
				t.Run(cc.name, func(t *testing.T) {
					t.Parallel()
					s := newStore(t, l, campaignLedger)
					c := &changeRun{s: s, runID: jobs.RunID(settlement.Job.Name(), testDate), transfers: readTransfers(t, s.ledgerLoc())}
					crashAt(t, s, cc.crash)
					id := cc.change(t, c)

					code, out := c.settle(t)
					if wrong := c.postedOnce(t); len(wrong) > 0 {
						t.Fatalf("after the rerun, balances disagree with the transfers posted:\n%s\n%s", strings.Join(wrong, "\n"), out)
					}
					if cc.refused == "" {
						c.mustSucceed(t, "the rerun", code, out)
						if tr := c.s.items(t, testDate)[id]; tr != checkpoint.StepCompleted && tr != checkpoint.StepRejected {
							t.Fatalf("%s is %q after the rerun, want it posted", id, tr)
						}
					} else {
						if code != cmd.ExitOperator {
							t.Fatalf("the rerun exited %d, want %d (operator decision):\n%s", code, cmd.ExitOperator, out)
						}
						for _, want := range []string{id, cc.refused, "--accept-changed"} {
							if !strings.Contains(out, want) {
								t.Errorf("the refusal does not say %q:\n%s", want, out)
							}
						}
						// Refused again the same way: the rerun is not a
						// one-off that an impatient second try gets past.
						if code2, out2 := c.settle(t); code2 != cmd.ExitOperator || !strings.Contains(out2, id) {
							t.Fatalf("a second rerun exited %d:\n%s", code2, out2)
						}
						cc.fix(t, c)
					}

					if rep := c.s.check(t, testDate); !rep.OK() {
						t.Fatalf("ledger check fails after the operator's path:\n%s", rep)
					}
					if wrong := c.postedOnce(t); len(wrong) > 0 {
						t.Fatalf("balances disagree with the transfers posted:\n%s", strings.Join(wrong, "\n"))
					}
					items := c.s.items(t, testDate)
					now := readTransfers(t, s.ledgerLoc())
					var posted, postedAmount int64
					for tid, tr := range now {
						switch st := items[tid]; st {
						case checkpoint.StepCompleted:
							posted++
							postedAmount += tr.Amount
						case checkpoint.StepRejected:
						default:
							t.Errorf("transfer %s is %q, want posted or rejected", tid, st)
						}
					}
					// The summary is of what was posted, as the ledger holds it.
					if sum := c.s.summary(t, testDate); sum.Transfers != int64(len(now)) || sum.Posted != posted || sum.PostedAmount != postedAmount {
						t.Errorf("summary says %d transfers, %d posted for %d; the ledger has %d transfers, %d posted for %d",
							sum.Transfers, sum.Posted, sum.PostedAmount, len(now), posted, postedAmount)
					}
					audits := strings.Join(c.audits(t), "\n")
					if cc.accepted {
						for _, want := range []string{"resume --accept-changed: late transfer confirmed", "accept-changed post: late transfer confirmed", id} {
							if !strings.Contains(audits, want) {
								t.Errorf("the audit log does not say %q:\n%s", want, audits)
							}
						}
					} else if strings.Contains(audits, "accept-changed") {
						t.Errorf("nothing was accepted, yet the audit log says:\n%s", audits)
					}
				})
			}
		})
	}
}

// TestAcceptChangedAcceptsOnlyWhatWasShown is the reviewer's case: two
// posted transfers altered in one chunk, one deleted in a later chunk. The
// refusal names the two; --accept-changed accepts those two and refuses the
// deletion, which it never showed, with its own exit 5; a second
// acceptance takes it. The audit log names each item under its acceptance.
func TestAcceptChangedAcceptsOnlyWhatWasShown(t *testing.T) {
	t.Parallel()
	for _, l := range layouts(t) {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, l, campaignLedger)
			c := &changeRun{s: s, runID: jobs.RunID(settlement.Job.Name(), testDate), transfers: readTransfers(t, s.ledgerLoc())}
			crashAt(t, s, midPost)
			first, second, gone := c.posted(t, 5), c.posted(t, 30), c.posted(t, 60) // chunks #0, #0 and #1
			c.exec(t, `UPDATE transfers SET amount = amount + 1 WHERE id = $1`, first)
			c.exec(t, `UPDATE transfers SET amount = amount + 1 WHERE id = $1`, second)
			c.exec(t, `DELETE FROM transfers WHERE id = $1`, gone)

			code, out := c.settle(t)
			if code != cmd.ExitOperator || !strings.Contains(out, first) || !strings.Contains(out, second) || strings.Contains(out, gone) {
				t.Fatalf("the rerun exited %d; want 5 naming %s and %s, not %s:\n%s", code, first, second, gone, out)
			}
			accept := func() (int, string) {
				return c.cli(t, "resume", c.runID, "--progress", "none", "--operator", "ops@bank",
					"--accept-changed", "--reason", "amounts corrected by the ledger team")
			}
			code, out = accept()
			if code != cmd.ExitOperator || !strings.Contains(out, gone) || !strings.Contains(out, "no longer yields it") ||
				strings.Contains(out, first) {
				t.Fatalf("the acceptance exited %d; want 5 naming %s alone, never shown before:\n%s", code, gone, out)
			}
			audits := c.audits(t)
			var accepted []string
			for _, a := range audits {
				if strings.HasPrefix(a, "accept-changed post:") {
					accepted = append(accepted, a)
				}
			}
			if len(accepted) != 1 || !strings.Contains(accepted[0], first) || !strings.Contains(accepted[0], second) ||
				strings.Contains(accepted[0], gone) {
				t.Fatalf("accepted so far:\n%s\nwant %s and %s, not %s", strings.Join(audits, "\n"), first, second, gone)
			}
			code, out = accept()
			c.mustSucceed(t, "the second acceptance", code, out)
			// ledger check compares with the transfers table as it is now,
			// which the accepted changes made differ from what was posted:
			// the balances are held to what was posted, each once.
			if wrong := c.postedOnce(t); len(wrong) > 0 {
				t.Fatalf("balances disagree with the transfers posted:\n%s", strings.Join(wrong, "\n"))
			}
			audits = c.audits(t)
			last := audits[len(audits)-1]
			if !strings.HasPrefix(last, "accept-changed post: amounts corrected") || !strings.Contains(last, gone) {
				t.Fatalf("the last audit record is %q; want the acceptance of %s", last, gone)
			}
		})
	}
}
