package sqlite_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
)

func TestItemFingerprintsAndAcceptingChanges(t *testing.T) {
	ctx := context.Background()
	st := checkpointtest.OpenSQLite(t)
	c, err := st.Claim(ctx, claimReq("settle/2026-11-28", "host:1", claimNow))
	if err != nil {
		t.Fatal(err)
	}
	l := c.Lease
	old, now := bytes.Repeat([]byte{1}, 16), bytes.Repeat([]byte{2}, 16)
	err = st.InTx(ctx, l, func(tx checkpoint.Tx) error {
		return tx.PutItems([]checkpoint.Item{
			{Step: "post", Key: "T1", Status: checkpoint.StepCompleted, Output: []byte("1"), Fingerprint: old},
			{Step: "post", Key: "T2", Status: checkpoint.StepRejected, Output: []byte("2")}, // recorded before fingerprints
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	read := func(q checkpoint.ItemQuery) map[string][]byte {
		t.Helper()
		out := map[string][]byte{}
		q.RunID, q.Step = l.RunID, "post"
		if err := st.Items(ctx, q, func(it checkpoint.Item) error { out[it.Key] = it.Fingerprint; return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	// Every read-back a batch step uses carries the fingerprint.
	for name, q := range map[string]checkpoint.ItemQuery{
		"range": {From: "T0", To: "T9", KeysOnly: true}, "keys": {Keys: []string{"T1", "T2"}, KeysOnly: true},
		"all": {}, "last": {KeysOnly: true, Limit: 1, Last: true},
	} {
		got := read(q)
		if !bytes.Equal(got["T1"], old) && name != "last" {
			t.Errorf("%s read: T1 fingerprint %x, want %x", name, got["T1"], old)
		}
		if fp, ok := got["T2"]; ok && fp != nil {
			t.Errorf("%s read: T2 fingerprint %x, want none", name, fp)
		}
		if name == "last" && (len(got) != 1 || got["T2"] != nil) {
			t.Errorf("last read %v, want T2 alone", got)
		}
	}
	// A refusal records what it named; a later refusal replaces it.
	changes := func() []string {
		t.Helper()
		cs, err := st.ItemChanges(ctx, l.RunID, "post")
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, c := range cs {
			out = append(out, fmt.Sprintf("%s %s %x %d %s %s", c.Key, c.Change, c.Fingerprint, c.Items, c.Status, c.Operator))
		}
		return out
	}
	for _, refused := range [][]checkpoint.ItemChange{
		{{Key: "T0", Change: "missing"}, {Key: "T1", Change: "changed", Fingerprint: now}},
		{{Key: "T1", Change: "changed", Fingerprint: now}, {Key: "", Change: "missing", Items: 3}},
	} {
		if err := st.InTx(ctx, l, func(tx checkpoint.Tx) error { return tx.RefuseItemChanges("post", claimNow, refused) }); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := changes(), []string{" missing  3 refused ", fmt.Sprintf("T1 changed %x 1 refused ", now)}; !slices.Equal(got, want) {
		t.Fatalf("refused changes %q, want %q", got, want)
	}
	a := checkpoint.Audit{RunID: l.RunID, At: claimNow, Operator: "ops", Command: "accept-changed post", Reason: "checked", Details: "post: item T1 changed"}
	if err := st.InTx(ctx, l, func(tx checkpoint.Tx) error {
		return tx.AcceptItemChanges(a, []checkpoint.Item{{Step: "post", Key: "T1", Fingerprint: now}},
			[]checkpoint.ItemChange{{Step: "post", Key: "T1", Change: "changed", Fingerprint: now}})
	}); err != nil {
		t.Fatal(err)
	}
	if got := read(checkpoint.ItemQuery{}); !bytes.Equal(got["T1"], now) {
		t.Fatalf("T1 fingerprint %x after accepting, want %x", got["T1"], now)
	}
	// Accepted, the row names its operator and a new refusal leaves it.
	if err := st.InTx(ctx, l, func(tx checkpoint.Tx) error { return tx.RefuseItemChanges("post", claimNow, nil) }); err != nil {
		t.Fatal(err)
	}
	if got, want := changes(), []string{fmt.Sprintf("T1 changed %x 1 accepted ops", now)}; !slices.Equal(got, want) {
		t.Fatalf("changes after accepting %q, want %q", got, want)
	}
	// An item not recorded is refused, and the audit record with it.
	err = st.InTx(ctx, l, func(tx checkpoint.Tx) error {
		return tx.AcceptItemChanges(a, []checkpoint.Item{{Step: "post", Key: "T9", Fingerprint: now}}, nil)
	})
	if !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("accepting an unrecorded item: %v, want ErrNotFound", err)
	}
	audits, err := st.Audits(ctx, l.RunID)
	if err != nil || len(audits) != 1 || audits[0].Details != a.Details || audits[0].Operator != "ops" {
		t.Fatalf("audits %+v, %v; want the one accepted change", audits, err)
	}
	// A later claim fences the old lease out.
	if _, err := st.Claim(ctx, claimReq("settle/2026-11-28", "host:2", claimNow.Add(2*time.Minute))); err != nil {
		t.Fatal(err)
	}
	err = st.InTx(ctx, l, func(tx checkpoint.Tx) error { return tx.AcceptItemChanges(a, nil, nil) })
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("a fenced acceptance: %v, want ErrFenced", err)
	}
}
