package runner_test

import (
	"fmt"
	"log"
	"time"

	"github.com/stepwise-run/stepwise/runner"
)

// A nightly settlement at 02:30 New York time, settling the previous
// business day. On 8 March 2026 the clocks jump from 02:00 to 03:00: the
// missing 02:30 fires once, at the change. Each fire names its run through
// the key rule: the Saturday, Sunday and Monday fires all name Friday's
// run, so the first settles it and the others find it done.
func ExampleSchedule_Fires() {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		log.Fatal(err)
	}
	nightly := runner.Schedule{
		Name:     "settle-nightly",
		Job:      "settle",
		Spec:     "30 2 * * *",
		Location: ny,
		Key:      runner.PreviousBusinessDate("date", runner.Weekdays),
		Misfire:  runner.MisfireRunOnce,
		Overlap:  runner.OverlapForbid,
	}
	fires, err := nightly.Fires(time.Date(2026, 3, 6, 12, 0, 0, 0, ny), 4)
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range fires {
		params, err := nightly.Params(f.At)
		if err != nil {
			log.Fatal(err)
		}
		note := ""
		if f.DST == runner.DSTSkipped {
			note = "  (" + f.Wall[11:16] + " skipped by DST)"
		}
		fmt.Printf("%s  date=%s%s\n", f.At.Format("Mon 2006-01-02 15:04 MST"), params["date"], note)
	}
	// Output:
	// Sat 2026-03-07 02:30 EST  date=2026-03-06
	// Sun 2026-03-08 03:00 EDT  date=2026-03-06  (02:30 skipped by DST)
	// Mon 2026-03-09 02:30 EDT  date=2026-03-06
	// Tue 2026-03-10 02:30 EDT  date=2026-03-09
}
