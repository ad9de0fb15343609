package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/cmd"
	"github.com/stepwise-run/stepwise/examples/settlement"
)

// shownSettle is the part of `show --json` these tests read.
type shownSettle struct {
	Steps []struct {
		ID     string          `json:"id"`
		Output json.RawMessage `json:"output"`
	} `json:"steps"`
	ChunkPlans []struct {
		Step     string `json:"step"`
		EffectID string `json:"effect_id"`
		Status   string `json:"status"`
		Target   string `json:"target"`
		Items    []struct {
			Key string `json:"key"`
		} `json:"items"`
		Writes []checkpoint.Write `json:"writes"`
	} `json:"chunk_plans"`
	ChunkPlansTotal int64 `json:"chunk_plans_total"`
	Items           *struct {
		Status string `json:"status"`
		Total  int64  `json:"total"`
		Items  []struct {
			ID     string          `json:"id"`
			Step   string          `json:"step"`
			Key    string          `json:"key"`
			Status string          `json:"status"`
			Reason string          `json:"reason"`
			Output json.RawMessage `json:"output"`
		} `json:"items"`
		Next string `json:"next"`
	} `json:"items"`
	Outbox []struct {
		Topic   string          `json:"topic"`
		Payload json.RawMessage `json:"payload"`
	} `json:"outbox"`
}

func showSettle(t *testing.T, args ...string) shownSettle {
	t.Helper()
	out, _ := mustRun(t, cmd.ExitOK, append(args, "--json")...)
	var v shownSettle
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("show --json: %v\n%s", err, out)
	}
	return v
}

// TestShowSettlementEffectsAndItems settles a day whose ledger overdraws
// often, then checks what an auditor asks of show: --effects lists every
// chunk's plan (items; each account before -> after), applied, and those
// plans alone account for every balance; --items rejected lists the
// rejected transfers with their reasons, a page at a time that --after
// continues, or --all, the same in text and JSON; the settled
// notification's payload is a JSON object.
func TestShowSettlementEffectsAndItems(t *testing.T) {
	t.Parallel()
	for _, layout := range ledgerLayouts(t) {
		t.Run(layout.name, func(t *testing.T) {
			t.Parallel()
			db := testDB(t)
			ledgerPath, ledgerFlag, ledgerParam := db, []string{}, []string{}
			if layout.ledger != nil {
				ledgerPath = layout.ledger(t)
				ledgerFlag = []string{"--ledger", ledgerPath}
				ledgerParam = []string{"-p", "ledger=" + ledgerPath}
			}
			const opening, chunk, transfers = 50, 10, 120
			mustRun(t, cmd.ExitOK, append([]string{"--db", db, "ledger", "seed", "--date", "2026-11-28",
				"--accounts", "4", "--transfers", itoa(transfers), "--balance", itoa(opening)}, ledgerFlag...)...)
			settle := append([]string{"--db", db, "run", "settle", "-p", "date=2026-11-28", "-p", "chunk=" + itoa(chunk),
				"--progress", "none"}, ledgerParam...)
			if code, stdout, stderr := stepwise(t, settle...); code != cmd.ExitOK {
				t.Fatalf("stepwise %s: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", strings.Join(settle, " "), code, stdout, stderr)
			}
			const runID = "settle/2026-11-28"
			show := []string{"--db", db, "show", runID}

			v := showSettle(t, append(show, "--effects", "--items", "rejected", "--all")...)
			var sum settlement.Summary
			for _, s := range v.Steps {
				if s.ID == "summary" {
					if err := json.Unmarshal(s.Output, &sum); err != nil {
						t.Fatal(err)
					}
				}
			}
			if sum.Rejected < 12 || sum.Posted == 0 {
				t.Fatalf("summary %+v; the test wants a dozen rejections or more, and posted transfers", sum)
			}

			// The chunk plans: applied, one per chunk, every posted
			// transfer in exactly one, each account's writes chaining from
			// its opening balance to its balance now.
			if len(v.ChunkPlans) != transfers/chunk || v.ChunkPlansTotal != int64(len(v.ChunkPlans)) {
				t.Errorf("%d chunk plans listed of %d; want %d, all", len(v.ChunkPlans), v.ChunkPlansTotal, transfers/chunk)
			}
			inPlan := map[string]bool{}
			last := map[string]checkpoint.Write{}
			for _, p := range v.ChunkPlans {
				if p.Step != "post" || p.Status != checkpoint.ChunkApplied || p.Target == "" || p.EffectID == "" || len(p.Writes) == 0 {
					t.Errorf("chunk plan %+v; want post's, applied, with its target, ID and writes", p)
				}
				for _, it := range p.Items {
					if inPlan[it.Key] {
						t.Errorf("transfer %s is in two chunk plans", it.Key)
					}
					inPlan[it.Key] = true
				}
				for _, w := range p.Writes {
					want := checkpoint.Write{Key: w.Key, OldValue: opening}
					if prev, ok := last[w.Key]; ok {
						want = checkpoint.Write{Key: w.Key, OldVersion: prev.OldVersion + 1, OldValue: prev.NewValue}
					}
					if w.OldVersion != want.OldVersion || w.OldValue != want.OldValue {
						t.Errorf("write %+v of %s does not follow the one before (version %d, value %d)", w, p.EffectID, want.OldVersion, want.OldValue)
					}
					last[w.Key] = w
				}
			}
			if int64(len(inPlan)) != sum.Posted {
				t.Errorf("%d transfers in the chunk plans; the summary posted %d", len(inPlan), sum.Posted)
			}
			ledger := openTestLedger(t, ledgerPath)
			for acct, w := range last {
				var bal, ver int64
				if err := ledger.QueryRow(`SELECT balance, version FROM accounts WHERE id = $1`, acct).Scan(&bal, &ver); err != nil {
					t.Fatal(err)
				}
				if bal != w.NewValue || ver != w.OldVersion+1 {
					t.Errorf("%s is %d (version %d); its last recorded write says %d (version %d)", acct, bal, ver, w.NewValue, w.OldVersion+1)
				}
			}

			// The rejected items, all of them: the summary's, with reasons.
			if v.Items == nil || v.Items.Status != "rejected" || v.Items.Total != sum.Rejected ||
				int64(len(v.Items.Items)) != sum.Rejected || v.Items.Next != "" {
				t.Fatalf("show --items rejected --all: %+v; want all %d rejected, no next page", v.Items, sum.Rejected)
			}
			var all []string
			for _, it := range v.Items.Items {
				all = append(all, it.ID)
				if inPlan[it.Key] || it.Step != "post" || it.ID != "post/"+it.Key || it.Status != "rejected" ||
					!strings.Contains(it.Reason, "breaking its guard (not below 0)") || len(it.Output) == 0 {
					t.Errorf("rejected item %+v; want post's, in no plan, with its guard's reason and its amount", it)
				}
			}
			if !slices.IsSorted(all) || all[0] != "post/"+sum.RejectedIDs[0] {
				t.Errorf("rejected items %v; want them in key order, starting with the summary's first, %s", all, sum.RejectedIDs[0])
			}

			// Five at a time, --after the last of each page, the pages
			// make up the whole list.
			var paged []string
			after := ""
			for page := 0; ; page++ {
				args := append(show, "--items", "rejected", "--limit", "5")
				if after != "" {
					args = append(args, "--after", after)
				}
				p := showSettle(t, args...).Items
				if len(p.Items) > 5 || (p.Next != "" && (len(p.Items) != 5 || p.Next != p.Items[4].ID)) {
					t.Fatalf("page %d: %d items, next %q; want at most 5, next the last of a full page", page, len(p.Items), p.Next)
				}
				for _, it := range p.Items {
					paged = append(paged, it.ID)
				}
				if p.Next == "" || page > 10 {
					break
				}
				after = p.Next
			}
			if !slices.Equal(paged, all) {
				t.Errorf("pages of 5 give %v; want --all's %v", paged, all)
			}

			// The same in text.
			out, _ := mustRun(t, cmd.ExitOK, append(show, "--items", "rejected", "--limit", "5")...)
			wantContains(t, "show --items rejected --limit 5", out,
				"REJECTED ITEMS: "+itoa(int(sum.Rejected))+", 5 listed",
				all[0]+"  ", "breaking its guard (not below 0)",
				"next page: stepwise show "+runID+" --items rejected --limit 5 --after "+all[4])
			if strings.Contains(out, all[5]) {
				t.Errorf("the first page of 5 lists the sixth rejected item %s:\n%s", all[5], out)
			}
			out, _ = mustRun(t, cmd.ExitOK, append(show, "--items", "rejected", "--all")...)
			for _, id := range all {
				if lineWith(out, id+"  ") == "" {
					t.Errorf("show --items rejected --all does not list %s", id)
				}
			}
			if strings.Contains(out, "next page") {
				t.Errorf("show --all offers a next page:\n%s", out)
			}
			out, _ = mustRun(t, cmd.ExitOK, append(show, "--effects", "--limit", "3")...)
			p0 := v.ChunkPlans[0]
			w0 := p0.Writes[0]
			wantContains(t, "show --effects --limit 3", out, "EFFECTS",
				"post chunk  on "+p0.Target+"  ["+p0.EffectID+"]  applied  10 items: ",
				"    "+w0.Key+": "+itoa(int(w0.OldValue))+" -> "+itoa(int(w0.NewValue)),
				"... and "+itoa(transfers/chunk-3)+" more chunk plans not listed (--limit 3): --all lists every one")
			if n := strings.Count(out, "post chunk  on "); n != 3 {
				t.Errorf("show --effects --limit 3 lists %d chunk plans; want 3\n%s", n, out)
			}
			// --limit bounds the keys listed for each plan too.
			out, _ = mustRun(t, cmd.ExitOK, append(show, "--effects", "--limit", "1")...)
			if n := strings.Count(out, ", version "); n != 1 || len(p0.Writes) < 2 {
				t.Errorf("show --effects --limit 1 lists %d keys; want 1 (of the first plan's %d)\n%s", n, len(p0.Writes), out)
			}
			wantContains(t, "show --effects --limit 1", out, "    ... and "+itoa(len(p0.Writes)-1)+" more key")

			// The notification's payload is JSON, not base64.
			if len(v.Outbox) != 1 {
				t.Fatalf("outbox = %+v; want the settled notification", v.Outbox)
			}
			var payload map[string]string
			if err := json.Unmarshal(v.Outbox[0].Payload, &payload); err != nil || payload["date"] != "2026-11-28" {
				t.Errorf("outbox payload %s: %v; want a JSON object with the date", v.Outbox[0].Payload, err)
			}
		})
	}
}

// TestShowBadPaging checks show's paging flags say what is wrong.
func TestShowBadPaging(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--items", "rejected", "--limit", "0"}, "--limit 0: give at least 1, or --all"},
		{[]string{"--after", "post/T-1"}, "--after pages through --items"},
		{[]string{"--items", "rejected", "--after", "T-1"}, `--after "T-1": want an item as show lists it, STEP/KEY`},
		{[]string{"--items", "nonsense"}, "--items"},
	} {
		_, stderr := mustRun(t, cmd.ExitUsage, append([]string{"--db", db, "show", "settle/2026-11-28"}, tc.args...)...)
		wantContains(t, "show "+strings.Join(tc.args, " "), stderr, tc.want)
	}
}

// lineWith returns the first line of out containing s.
func lineWith(out, s string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}
