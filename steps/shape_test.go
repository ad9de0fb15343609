package steps_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/steps"
)

type shapeReceipt struct {
	ID     string    `json:"id"`
	Amount int64     `json:"amount"`
	At     time.Time `json:"at"`
	Tags   []string  `json:"tags,omitempty"`
	Note   *string   `json:"note"`
	hidden int
	Skip   string `json:"-"`
	shapeBase
}

type shapeBase struct {
	Provider string `json:"provider"`
}

type shapeTree struct {
	Name     string       `json:"name"`
	Children []*shapeTree `json:"children"`
}

// CheckShape accepts exactly what encoding/json decodes into the type,
// strictly (no unknown field, no null where there is no nil), and names
// the place that does not fit with the type's shape.
func TestCheckShape(t *testing.T) {
	_ = shapeReceipt{hidden: 1} // unexported: not in the shape
	receipt := steps.OutputShape[shapeReceipt]()
	if got, want := receipt.String(), `{"id": string, "amount": integer (int64), "at": string (RFC 3339 time), "tags"?: [string]|null, "note"?: string|null, "provider": string}`; got != want {
		t.Errorf("shape = %s\nwant    %s", got, want)
	}
	cases := []struct {
		shape *steps.Shape
		json  string
		bad   string // a part of the error, "" when it fits
	}{
		{receipt, `{"id":"rcpt-77","amount":1200,"at":"2026-11-28T09:00:00Z","provider":"acme","note":null}`, ""},
		{receipt, `{"id":"rcpt-77","amount":1200,"at":"2026-11-28T09:00:00Z","provider":"acme","tags":["x"],"note":"n"}`, ""},
		{receipt, `{"id":"rcpt-77","amount":1200,"provider":"acme"}`, `$ lacks field "at" (string (RFC 3339 time))`},
		{receipt, `{"id":"rcpt-77","receipt":"x"}`, `$ has no field "receipt" (its fields: id, amount, at, tags, note, provider)`},
		{receipt, `{"id":77}`, `$.id is the number 77, want string`},
		{receipt, `{"amount":12.5}`, `$.amount is 12.5, not an integer`},
		{receipt, `{"amount":"12"}`, `$.amount is a string, want integer (int64)`},
		{receipt, `{"at":"yesterday"}`, `$.at is "yesterday", not an RFC 3339 time`},
		{receipt, `{"tags":[1]}`, `$.tags[0] is the number 1, want string`},
		{receipt, `{"id":null}`, `$.id is null, want string`},
		{receipt, `"rcpt-77"`, `$ is a string, want {"id"`},
		{receipt, `{"id":"a"} {"id":"b"}`, `more than one JSON value`},
		{steps.OutputShape[string](), `{"id":"rcpt-77"}`, `$ is an object, want string`},
		{steps.OutputShape[string](), `"rcpt-77"`, ""},
		{steps.OutputShape[int8](), `300`, `not an integer that fits integer (int8)`},
		{steps.OutputShape[uint](), `-1`, `not an integer that fits`},
		{steps.OutputShape[map[string]int](), `{"a":1,"b":true}`, `$.b is a boolean, want integer`},
		{steps.OutputShape[json.RawMessage](), `{"anything":[1,2]}`, ""},
		{steps.OutputShape[any](), `[1,"x"]`, ""},
		{steps.OutputShape[[]byte](), `"aGVsbG8="`, ""},
		{steps.OutputShape[[]byte](), `"%%%"`, `not base64`},
		{steps.OutputShape[shapeTree](), `{"name":"a","children":[{"name":"b","children":[{"name":"c","extra":1}]}]}`, ""},
		{steps.OutputShape[shapeTree](), `{"name":"a"}`, `$ lacks field "children"`},
	}
	for _, c := range cases {
		err := steps.CheckShape(c.shape, []byte(c.json))
		switch {
		case c.bad == "" && err != nil:
			t.Errorf("%s into %s: %v; want it to fit", c.json, c.shape, err)
		case c.bad != "" && (!errors.Is(err, steps.ErrShape) || !strings.Contains(err.Error(), c.bad)):
			t.Errorf("%s into %s: %v; want ErrShape saying %q", c.json, c.shape, err, c.bad)
		}
		// What fits, encoding/json decodes.
		if err == nil && c.shape == receipt {
			var r shapeReceipt
			if err := json.Unmarshal([]byte(c.json), &r); err != nil {
				t.Errorf("%s fits, but encoding/json refuses it: %v", c.json, err)
			}
		}
	}
	// A shape survives its own JSON (the store keeps it so).
	b, err := json.Marshal(receipt)
	if err != nil {
		t.Fatal(err)
	}
	var back steps.Shape
	if err := json.Unmarshal(b, &back); err != nil || back.String() != receipt.String() {
		t.Errorf("shape through JSON: %s (%v); want %s", back.String(), err, receipt)
	}
}
