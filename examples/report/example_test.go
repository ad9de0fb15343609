package report_test

import (
	"fmt"

	"github.com/stepwise-run/stepwise/examples/report"
)

// The report's fee is 1.5% of an order's amount, at least 30 minor units.
func ExampleFee() {
	fmt.Println(report.Fee(1000), report.Fee(100000))
	// Output: 30 1500
}
