package steps_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/steps"
)

// TestItemChangedNamesTheFields: a refusal of a changed item names the
// fields that changed with their old and new values (the item's content
// is recorded with its fingerprint), in the error and in an acceptance's
// audit record; after an acceptance the accepted content is the one a
// later change is compared with. Content over MaxRecordedInput, or an
// ItemInput string, is named by fingerprints only.
func TestItemChangedNamesTheFields(t *testing.T) {
	for _, separate := range []bool{false, true} {
		t.Run(fmt.Sprintf("separate=%v", separate), func(t *testing.T) {
			b := newFPBatch(t, separate, 30)
			b.crashed(b.slice())
			b.set("T007", 500) // posted with 8
			for i := range b.items {
				if b.items[i].ID == "T007" {
					b.items[i].To = "a"
				}
			}
			_, err := b.settle(b.slice(), "")
			ce := wantChange(t, err, steps.ItemContentChanged, "T007")
			want := []steps.FieldChange{{Field: "Amount", Old: "8", New: "500"}, {Field: "To", Old: `"b"`, New: `"a"`}}
			if !slices.Equal(ce.Fields, want) {
				t.Errorf("fields %+v; want %+v", ce.Fields, want)
			}
			if !strings.Contains(err.Error(), `item T007 of batch step post (run j/k) changed since it was processed: Amount was 8, now 500; To was "b", now "a"`) {
				t.Errorf("the refusal does not name the fields: %v", err)
			}
			b.accept = &steps.Acceptance{Operator: "ops", Reason: "checked"}
			if _, err := b.settle(b.slice(), "T020"); err == nil || !strings.Contains(err.Error(), "stopped here") {
				t.Fatalf("accepted, then stopped at T020: %v", err)
			}
			audits, err := b.st.Audits(context.Background(), "j/k")
			if err != nil || len(audits) != 1 || !strings.Contains(audits[0].Details, `item T007 changed (Amount was 8, now 500; To was "b", now "a")`) {
				t.Errorf("audit %+v (%v); want it to name the fields", audits, err)
			}
			b.accept = nil
			b.set("T007", 501)
			_, err = b.settle(b.slice(), "")
			ce = wantChange(t, err, steps.ItemContentChanged, "T007")
			if want := []steps.FieldChange{{Field: "Amount", Old: "500", New: "501"}}; !slices.Equal(ce.Fields, want) {
				t.Errorf("after the acceptance: fields %+v; want %+v (compared with the accepted content)", ce.Fields, want)
			}
		})
	}
	t.Run("unrecorded content", func(t *testing.T) {
		b := newFPBatch(t, false, 30)
		long := strings.Repeat("x", steps.MaxRecordedInput)
		big := func(x xfer) any { return map[string]any{"id": x.ID, "amount": x.Amount, "pad": long} }
		if _, err := b.settle(b.slice().ItemInput(big), "T012"); err == nil {
			t.Fatal("the first attempt should stop at T012")
		}
		b.set("T003", 99)
		_, err := b.settle(b.slice().ItemInput(big), "")
		ce := wantChange(t, err, steps.ItemContentChanged, "T003")
		if len(ce.Fields) != 0 || !strings.Contains(err.Error(), "(fingerprint "+ce.Old[:12]+", now "+ce.New[:12]+")") {
			t.Errorf("content over MaxRecordedInput: fields %+v, %v; want fingerprints only", ce.Fields, err)
		}
	})
}
