package runner

import (
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/stepwise-run/stepwise/steps"
)

// Schedule fires a job on a cron spec in an explicit time zone. Each fire
// time becomes a run through the key rule, so a duplicate fire, a restart,
// or two schedulers firing the same time all land on the same run. Define
// schedules in Go beside the jobs they start and give them to a Scheduler
// (the CLI's `serve`).
type Schedule struct {
	// Name identifies the schedule in the store, logs and metrics; unique
	// within a scheduler. Letters, digits and . _ - : @ = +. Required.
	Name string
	// Job is the registered job the schedule starts. Required.
	Job string
	// Spec is the cron spec: five fields (minute hour day-of-month month
	// day-of-week), or six with seconds first, or a descriptor such as
	// @daily, @hourly or @every 10m. It is read in Location; a TZ= or
	// CRON_TZ= prefix is refused (the zone is Location). Required.
	//
	// robfig/cron's rules apply, three of them easy to trip on:
	//   - When both day-of-month and day-of-week are restricted, a day
	//     matches if either does (the classic cron OR): "0 0 1 * 1" fires
	//     on the 1st and on every Monday. Only a bare * or ? leaves a field
	//     unrestricted; a step counts as a restriction, so "0 0 */2 * 1"
	//     fires on odd days and on Mondays ("*/1" is still unrestricted).
	//   - Day-of-week is 0-6 with 0 for Sunday (or SUN-SAT); 7 is refused.
	//   - robfig looks at most five years ahead for the next fire, so
	//     "0 2 29 2 *" after 29 February 2096 (2100 is no leap year) would
	//     never fire again. This package searches on past that window, up
	//     to a hundred years, so that spec fires next on 29 February 2104;
	//     a spec that never fires at all ("0 0 30 2 *") is refused by
	//     NewScheduler and Fires.
	Spec string
	// Location is the time zone the spec's wall-clock times are read in,
	// e.g. time.UTC or time.LoadLocation("America/New_York"). Required:
	// a schedule never silently follows the host's zone.
	Location *time.Location
	// Key turns a fire's scheduled time (Fire.Scheduled, in Location)
	// into the run's identifying parameters. Defaults to
	// FireDate("date"): the date the spec named in the schedule's zone.
	Key KeyRule
	// Values are further parameters of every run, under the key's (which
	// win). They must not change between fires of one run key: a run key
	// always means the same parameters.
	Values map[string]string
	// Misfire says what happens to fires missed while no scheduler was
	// firing (downtime, a stall). Defaults to MisfireRunOnce.
	Misfire MisfirePolicy
	// StartingDeadline is how late a fire may still start; older fires are
	// logged and counted, not run, whatever the misfire policy. Zero means
	// no deadline.
	StartingDeadline time.Duration
	// Overlap says what happens to a fire while an earlier run of this
	// schedule is still going. Defaults to OverlapForbid.
	Overlap OverlapPolicy
}

// MisfirePolicy says which missed fires run. A fire is missed when it is
// seen later than the scheduler's misfire threshold after its time, or when
// a newer fire of the same schedule is already due.
type MisfirePolicy string

// Misfire policies.
const (
	// MisfireSkip runs no missed fire; firing resumes with the next one.
	MisfireSkip MisfirePolicy = "skip"
	// MisfireRunOnce runs the latest missed fire only.
	MisfireRunOnce MisfirePolicy = "run-once"
	// MisfireRunAll runs every missed fire, oldest first, one after
	// another (or all at once under OverlapAllow).
	MisfireRunAll MisfirePolicy = "run-all"
)

// OverlapPolicy says what a fire does while an earlier run of its schedule,
// started by this scheduler, is unfinished.
type OverlapPolicy string

// Overlap policies.
const (
	// OverlapForbid skips the fire (logged and counted). Missed fires that
	// MisfireRunAll catches up on still run, one after another.
	OverlapForbid OverlapPolicy = "forbid"
	// OverlapQueue starts the fire when the earlier runs have ended, in
	// order.
	OverlapQueue OverlapPolicy = "queue"
	// OverlapAllow starts the fire at once, beside the earlier run.
	OverlapAllow OverlapPolicy = "allow"
)

// KeyRule turns a fire's scheduled time (Fire.Scheduled: the time the spec
// named, in the schedule's zone) into the run's identifying parameters. It
// must be a pure function of that time: the same time always gives the
// same run.
//
// For a wall-clock time the clocks skipped, the scheduled time reads the
// spec's date and clock, not the clock at the moment the fire happens: in
// America/Nuuk, whose spring change jumps from 23:00 to midnight,
// "30 23 * * *" fires at 00:00 on the Sunday, but its key rule sees 23:30
// on the Saturday, so Saturday still gets its run and Sunday's own fire
// keys Sunday. Its instant is still the fire's (see Fire.Scheduled).
type KeyRule func(fire time.Time) map[string]string

const dateLayout = "2006-01-02"

// FireDate is the key rule giving param the fire's calendar date in the
// schedule's zone, YYYY-MM-DD: a fire at 00:30 in Berlin on 30 March is
// 30 March, though it is still 29 March in UTC. It is the date the spec
// named, also when a DST change moves the fire past midnight (see
// KeyRule).
func FireDate(param string) KeyRule {
	return func(fire time.Time) map[string]string {
		return map[string]string{param: fire.Format(dateLayout)}
	}
}

// BusinessDays says whether a date (its year, month and day; ignore the
// clock and zone) is a business day. Weekdays is the usual one; a holiday
// calendar wraps it.
type BusinessDays func(date time.Time) bool

// Weekdays counts Monday to Friday as business days.
func Weekdays(date time.Time) bool {
	wd := date.Weekday()
	return wd != time.Saturday && wd != time.Sunday
}

// EveryDay counts every date as a business day.
func EveryDay(time.Time) bool { return true }

// PreviousBusinessDate is the key rule giving param the last business day
// before the fire's date in the schedule's zone: the nightly settlement
// fired at 02:00 on Tuesday settles Monday, and on Monday settles Friday.
// A nil days means Weekdays.
func PreviousBusinessDate(param string, days BusinessDays) KeyRule {
	if days == nil {
		days = Weekdays
	}
	return func(fire time.Time) map[string]string {
		// Noon UTC on the fire's local date: date arithmetic never meets
		// a DST change.
		d := time.Date(fire.Year(), fire.Month(), fire.Day(), 12, 0, 0, 0, time.UTC)
		for range 366 {
			d = d.AddDate(0, 0, -1)
			if days(d) {
				break
			}
		}
		return map[string]string{param: d.Format(dateLayout)}
	}
}

// DST says how a fire relates to a daylight-saving (or other offset) change
// of the schedule's zone.
type DST string

// DST notes of a Fire.
const (
	// DSTNone: the spec's wall-clock time happens once that day.
	DSTNone DST = ""
	// DSTSkipped: the clocks jumped over the spec's wall-clock time that
	// day; the schedule fires once, at the moment of the change.
	DSTSkipped DST = "skipped"
	// DSTRepeated: the clocks went back and the spec's wall-clock time
	// happens twice that day; the schedule fires once, at the first.
	DSTRepeated DST = "repeated"
)

// Fire is one fire time of a schedule.
type Fire struct {
	// At is when it fires, in the schedule's zone.
	At time.Time
	// Wall is the wall-clock time the spec names, "2006-01-02 15:04:05" in
	// the zone; it differs from At's clock reading when DST is
	// DSTSkipped.
	Wall string
	// DST notes a daylight-saving change at this fire.
	DST DST
	// Scheduled is what key rules get: the instant At, read in a zone
	// whose clock shows Wall. It is At itself unless DST is DSTSkipped;
	// then its zone is a fixed one (named as the zone before the change)
	// with the offset that makes the moment of the change read as the
	// time the spec named: -04:30 for 02:30 on New York's spring day,
	// -01:30 for 23:30 on Nuuk's (2026-03-28T23:30:00-01:30), whose
	// clocks jump from 23:00 (-02:00) to midnight (-01:00). A key rule reading its date or clock gets the spec's; one
	// reading its instant (UTC, Unix) gets when it fired; both are
	// distinct for distinct fires.
	Scheduled time.Time
}

// Fires returns the schedule's next n fire times after t, computed as the
// Scheduler does.
func (s Schedule) Fires(after time.Time, n int) ([]Fire, error) {
	c, err := s.compile()
	if err != nil {
		return nil, err
	}
	var out []Fire
	for range n {
		f := c.next(after)
		if f.At.IsZero() {
			break
		}
		out = append(out, f)
		after = f.At
	}
	if len(out) == 0 && n > 0 {
		return nil, c.neverFires(after)
	}
	return out, nil
}

// Params returns the parameters of the run a fire at time fire starts: the
// key rule's values over Values. When fire is one of the schedule's fire
// times (a Fire's At) the key rule gets its Scheduled time, as in the
// Scheduler.
func (s Schedule) Params(fire time.Time) (map[string]string, error) {
	c, err := s.compile()
	if err != nil {
		return nil, err
	}
	return c.params(c.fireAt(fire)), nil
}

// specParser reads 5-field specs, 6 with a leading seconds field, and
// descriptors (@daily, @every 1h).
var specParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// compiled is a validated schedule with its parsed spec and defaults
// applied.
type compiled struct {
	Schedule
	// wall matches wall-clock times: robfig's Next runs in UTC on a clock
	// reading, so it never meets DST; this package maps each reading to
	// the instant it names in Location. Nil for @every.
	wall *cron.SpecSchedule
	// every is the interval of an @every spec, counted in elapsed time.
	every time.Duration
}

// compile validates s and applies its defaults.
func (s Schedule) compile() (*compiled, error) {
	if err := steps.ValidateID(s.Name); err != nil || strings.Contains(s.Name, "/") {
		return nil, fmt.Errorf("runner: Schedule.Name %q must be non-empty letters, digits and . _ - : @ = +", s.Name)
	}
	where := "schedule " + s.Name
	if s.Job == "" {
		return nil, fmt.Errorf("runner: %s: Schedule.Job is empty; name the job it starts", where)
	}
	if s.Location == nil {
		return nil, fmt.Errorf("runner: %s: Schedule.Location is nil; give the zone explicitly (time.UTC, time.LoadLocation(...))", where)
	}
	spec := strings.TrimSpace(s.Spec)
	if strings.HasPrefix(spec, "TZ=") || strings.HasPrefix(spec, "CRON_TZ=") {
		return nil, fmt.Errorf("runner: %s: Schedule.Spec %q names a zone; put it in Schedule.Location instead", where, s.Spec)
	}
	parsed, err := specParser.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("runner: %s: Schedule.Spec %q: %w", where, s.Spec, err)
	}
	c := &compiled{Schedule: s}
	switch p := parsed.(type) {
	case *cron.SpecSchedule:
		w := *p
		w.Location = time.UTC
		c.wall = &w
	case cron.ConstantDelaySchedule:
		c.every = p.Delay
	default:
		return nil, fmt.Errorf("runner: %s: Schedule.Spec %q: unsupported schedule type %T", where, s.Spec, parsed)
	}
	switch c.Misfire {
	case "":
		c.Misfire = MisfireRunOnce
	case MisfireSkip, MisfireRunOnce, MisfireRunAll:
	default:
		return nil, fmt.Errorf("runner: %s: Schedule.Misfire is %q; use %q, %q or %q", where, c.Misfire, MisfireSkip, MisfireRunOnce, MisfireRunAll)
	}
	switch c.Overlap {
	case "":
		c.Overlap = OverlapForbid
	case OverlapForbid, OverlapQueue, OverlapAllow:
	default:
		return nil, fmt.Errorf("runner: %s: Schedule.Overlap is %q; use %q, %q or %q", where, c.Overlap, OverlapForbid, OverlapQueue, OverlapAllow)
	}
	if c.StartingDeadline < 0 {
		return nil, fmt.Errorf("runner: %s: Schedule.StartingDeadline is %s; use zero (no deadline) or more", where, c.StartingDeadline)
	}
	if c.Key == nil {
		c.Key = FireDate("date")
	}
	return c, nil
}

// params returns the run parameters for a fire: the key rule reads its
// scheduled time.
func (c *compiled) params(f Fire) map[string]string {
	v := maps.Clone(c.Values)
	if v == nil {
		v = map[string]string{}
	}
	at := f.Scheduled
	if at.IsZero() {
		at = f.At.In(c.Location)
	}
	maps.Copy(v, c.Key(at))
	return v
}

// fireAt returns the fire at instant t if the spec fires then, else a Fire
// of t itself.
func (c *compiled) fireAt(t time.Time) Fire {
	if f := c.next(t.Add(-time.Nanosecond)); f.At.Equal(t) {
		return f
	}
	at := t.In(c.Location)
	return Fire{At: at, Wall: at.Format(wallLayout), Scheduled: at}
}

// searchYears is how far ahead next looks for a fire, in robfig's
// five-year windows: far past the longest gap a spec without a year field
// can have (eight years, for 29 February over 2100).
const searchYears = 100

// neverFires is the error for a spec with no fire within searchYears
// after t.
func (c *compiled) neverFires(t time.Time) error {
	return fmt.Errorf("runner: schedule %s: Schedule.Spec %q: %w within %d years of %s",
		c.Name, c.Spec, errNeverFires, searchYears, t.Format(time.RFC3339))
}

// next returns the first fire strictly after t; At is zero if the spec
// does not fire within searchYears.
//
// Each wall-clock time the spec names fires once: a time the clocks jump
// over fires at the moment of the jump (several such times fire once
// together), and a time the clocks pass twice fires at the first pass.
func (c *compiled) next(t time.Time) Fire {
	if c.wall == nil {
		at := cron.ConstantDelaySchedule{Delay: c.every}.Next(t).In(c.Location)
		return Fire{At: at, Wall: at.Format(wallLayout), Scheduled: at}
	}
	w := wallClock(t, c.Location)
	for {
		w = c.wallNext(w)
		if w.IsZero() {
			return Fire{}
		}
		at, scheduled, dst := instant(w, c.Location)
		// A repeated time whose first pass is behind t has fired.
		if at.After(t) {
			return Fire{At: at, Wall: w.Format(wallLayout), DST: dst, Scheduled: scheduled}
		}
	}
}

// wallNext is robfig's Next on wall-clock readings, searching on past its
// five-year window up to searchYears: robfig gives up on "0 2 29 2 *"
// after 2096 although 2104 has a 29 February. Each window starts five
// years on from the last one's start, inside the last one, so nothing is
// missed.
func (c *compiled) wallNext(w time.Time) time.Time {
	for from := w; from.Year() <= w.Year()+searchYears; from = from.AddDate(5, 0, 0) {
		if n := c.wall.Next(from); !n.IsZero() {
			return n
		}
	}
	return time.Time{}
}

const wallLayout = "2006-01-02 15:04:05"

// wallClock returns t's clock reading in loc as a time in UTC: its fields
// are loc's date and clock, and it has no DST.
func wallClock(t time.Time, loc *time.Location) time.Time {
	l := t.In(loc)
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), l.Nanosecond(), time.UTC)
}

// instant returns the moment at which loc's clocks read w (a clock reading
// held in UTC, see wallClock): the only one, the first of two when the
// clocks went back over it (DSTRepeated), or the moment they jumped over it
// (DSTSkipped). It also returns the scheduled time (see Fire.Scheduled):
// the moment itself, or for a skipped reading that moment in a fixed zone
// whose clock reads w. It assumes a zone changes its offset at most once in the two days
// around w, which holds for every zone in the tz database.
func instant(w time.Time, loc *time.Location) (at, scheduled time.Time, dst DST) {
	const day = 24 * 60 * 60
	secs, nanos := w.Unix(), int64(w.Nanosecond())
	// The offsets in force a day before and a day after the reading.
	name, before := time.Unix(secs-day, 0).In(loc).Zone()
	_, after := time.Unix(secs+day, 0).In(loc).Zone()
	var found []time.Time
	for i, off := range []int{before, after} {
		if i == 1 && off == before {
			break
		}
		at := time.Unix(secs-int64(off), nanos).In(loc)
		if _, got := at.Zone(); got == off {
			found = append(found, at)
		}
	}
	switch {
	case len(found) == 2:
		if found[1].Before(found[0]) {
			found[0] = found[1]
		}
		return found[0], found[0], DSTRepeated
	case len(found) == 1:
		return found[0], found[0], DSTNone
	}
	// Neither offset gives the reading: the clocks skipped it. Read with
	// the old offset it falls after the change, in the new zone period,
	// which starts at the change.
	start, _ := time.Unix(secs-int64(before), nanos).In(loc).ZoneBounds()
	at = start.In(loc)
	return at, at.In(time.FixedZone(name, int(secs-at.Unix()))), DSTSkipped
}
