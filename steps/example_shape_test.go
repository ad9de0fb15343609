package steps_test

import (
	"fmt"

	"github.com/stepwise-run/stepwise/steps"
)

// An outside call step records the shape of its output type with its
// intent; resolve checks an operator's output against it.
func ExampleCheckShape() {
	type Receipt struct {
		ID     string `json:"id"`
		Amount int64  `json:"amount"`
		Note   string `json:"note,omitempty"`
	}
	shape := steps.OutputShape[Receipt]()
	fmt.Println(shape)
	fmt.Println(steps.CheckShape(shape, []byte(`{"id":"rcpt-77","amount":1200}`)))
	fmt.Println(steps.CheckShape(shape, []byte(`{"id":"rcpt-77"}`)))
	// Output:
	// {"id": string, "amount": integer (int64), "note"?: string}
	// <nil>
	// steps: the value does not fit the output type: $ lacks field "amount" (integer (int64)): only fields marked ? may be left out
}
