package runner_test

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/stepwise-run/stepwise/runner"
)

func mustZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("load zone %s: %v", name, err)
	}
	return loc
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

// fire is an expected fire: its instant in UTC and its DST note.
type fire struct {
	at  string
	dst runner.DST
}

// The 2026 changes: New York springs forward on 8 March at 02:00 EST (07:00
// UTC) and falls back on 1 November at 02:00 EDT (06:00 UTC); Berlin on 29
// March at 02:00 CET (01:00 UTC) and 25 October at 03:00 CEST (01:00 UTC).
func TestFiresAcrossDST(t *testing.T) {
	ny, berlin := mustZone(t, "America/New_York"), mustZone(t, "Europe/Berlin")
	for _, tc := range []struct {
		name  string
		zone  *time.Location
		spec  string
		after string
		want  []fire
	}{
		// New York, spring forward: 02:00-02:59 does not exist.
		{"NY 02:30 skipped fires at the change", ny, "30 2 * * *", "2026-03-06T12:00:00Z", []fire{
			{"2026-03-07T07:30:00Z", ""},                // 02:30 EST
			{"2026-03-08T07:00:00Z", runner.DSTSkipped}, // 03:00 EDT, the moment of the change
			{"2026-03-09T06:30:00Z", ""},                // 02:30 EDT
		}},
		{"NY 02:00 skipped", ny, "0 2 * * *", "2026-03-07T12:00:00Z", []fire{
			{"2026-03-08T07:00:00Z", runner.DSTSkipped},
			{"2026-03-09T06:00:00Z", ""},
		}},
		{"NY seconds field in the gap", ny, "15 30 2 * * *", "2026-03-07T12:00:00Z", []fire{
			{"2026-03-08T07:00:00Z", runner.DSTSkipped},
			{"2026-03-09T06:30:15Z", ""},
		}},
		{"NY half-hourly: the skipped times fire once together", ny, "*/30 * * * *", "2026-03-08T05:45:00Z", []fire{
			{"2026-03-08T06:00:00Z", ""},                // 01:00 EST
			{"2026-03-08T06:30:00Z", ""},                // 01:30 EST
			{"2026-03-08T07:00:00Z", runner.DSTSkipped}, // 02:00, 02:30 (skipped) and 03:00 EDT: one fire
			{"2026-03-08T07:30:00Z", ""},                // 03:30 EDT
		}},
		{"NY @daily around the change", ny, "@daily", "2026-03-07T12:00:00Z", []fire{
			{"2026-03-08T05:00:00Z", ""}, // midnight EST
			{"2026-03-09T04:00:00Z", ""}, // midnight EDT
		}},
		// New York, fall back: 01:00-01:59 happens twice.
		{"NY 01:30 repeated fires once, at the first", ny, "30 1 * * *", "2026-10-31T12:00:00Z", []fire{
			{"2026-11-01T05:30:00Z", runner.DSTRepeated}, // 01:30 EDT; 01:30 EST (06:30Z) does not fire
			{"2026-11-02T06:30:00Z", ""},                 // 01:30 EST
		}},
		{"NY from inside the repeated hour", ny, "30 1 * * *", "2026-11-01T06:10:00Z", []fire{
			{"2026-11-02T06:30:00Z", ""}, // 01:30 EST of 1 November is the repeat: skipped
		}},
		{"NY 02:00 after fall back happens once", ny, "0 2 * * *", "2026-10-31T12:00:00Z", []fire{
			{"2026-11-01T07:00:00Z", ""}, // 02:00 EST
			{"2026-11-02T07:00:00Z", ""},
		}},
		{"NY half-hourly over the repeated hour", ny, "*/30 * * * *", "2026-11-01T04:15:00Z", []fire{
			{"2026-11-01T04:30:00Z", ""},                 // 00:30 EDT
			{"2026-11-01T05:00:00Z", runner.DSTRepeated}, // 01:00 EDT
			{"2026-11-01T05:30:00Z", runner.DSTRepeated}, // 01:30 EDT
			{"2026-11-01T07:00:00Z", ""},                 // 02:00 EST; the repeated 01:00 and 01:30 EST do not fire
		}},
		// Berlin, spring forward: 02:00-02:59 does not exist.
		{"Berlin 02:30 skipped", berlin, "30 2 * * *", "2026-03-28T12:00:00Z", []fire{
			{"2026-03-29T01:00:00Z", runner.DSTSkipped}, // 03:00 CEST
			{"2026-03-30T00:30:00Z", ""},                // 02:30 CEST
		}},
		{"Berlin 03:00 exists on the spring day", berlin, "0 3 * * *", "2026-03-28T12:00:00Z", []fire{
			{"2026-03-29T01:00:00Z", ""},
			{"2026-03-30T01:00:00Z", ""},
		}},
		{"Berlin midnight", berlin, "0 0 * * *", "2026-03-28T12:00:00Z", []fire{
			{"2026-03-28T23:00:00Z", ""}, // 00:00 CET
			{"2026-03-29T22:00:00Z", ""}, // 00:00 CEST
		}},
		// Berlin, fall back: 02:00-02:59 happens twice.
		{"Berlin 02:30 repeated", berlin, "30 2 * * *", "2026-10-24T12:00:00Z", []fire{
			{"2026-10-25T00:30:00Z", runner.DSTRepeated}, // 02:30 CEST
			{"2026-10-26T01:30:00Z", ""},                 // 02:30 CET
		}},
		{"Berlin from inside the repeated hour", berlin, "30 2 * * *", "2026-10-25T01:10:00Z", []fire{
			{"2026-10-26T01:30:00Z", ""},
		}},
		{"Berlin 03:00 after fall back", berlin, "0 3 * * *", "2026-10-24T12:00:00Z", []fire{
			{"2026-10-25T02:00:00Z", ""}, // 03:00 CET
		}},
		// @every counts elapsed time; DST does not move it.
		{"@every 1h over the NY gap", ny, "@every 1h", "2026-03-08T05:30:00Z", []fire{
			{"2026-03-08T06:30:00Z", ""},
			{"2026-03-08T07:30:00Z", ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := runner.Schedule{Name: "s", Job: "job", Spec: tc.spec, Location: tc.zone}
			got, err := s.Fires(utc(tc.after), len(tc.want))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("Fires = %v; want %d fires", got, len(tc.want))
			}
			for i, w := range tc.want {
				g := got[i]
				if !g.At.Equal(utc(w.at)) || g.DST != w.dst {
					t.Errorf("fire %d = %s (%s, %q); want %s (%q)", i, g.At.UTC().Format(time.RFC3339),
						g.At.Format("15:04 MST"), g.DST, w.at, w.dst)
				}
				if g.At.Location() != tc.zone {
					t.Errorf("fire %d is in %s; want the schedule's zone %s", i, g.At.Location(), tc.zone)
				}
			}
		})
	}
}

// The reason Stepwise computes fire times itself: robfig's Next, run in the
// zone, skips the missing 02:30 and fires 01:30 twice.
func TestRobfigAloneMisfiresOnDST(t *testing.T) {
	ny := mustZone(t, "America/New_York")
	spec := func(s string) cron.Schedule {
		p, err := cron.ParseStandard(s)
		if err != nil {
			t.Fatal(err)
		}
		p.(*cron.SpecSchedule).Location = ny
		return p
	}
	if got := spec("30 2 * * *").Next(utc("2026-03-07T12:00:00Z")); !got.Equal(utc("2026-03-09T06:30:00Z")) {
		t.Errorf("robfig 02:30 after 7 March = %s; expected it to skip 8 March", got.UTC())
	}
	first := spec("30 1 * * *").Next(utc("2026-10-31T12:00:00Z"))
	if second := spec("30 1 * * *").Next(first); !second.Equal(utc("2026-11-01T06:30:00Z")) {
		t.Errorf("robfig 01:30 after %s = %s; expected the repeat at 06:30Z", first.UTC(), second.UTC())
	}
}

func TestFireWall(t *testing.T) {
	s := runner.Schedule{Name: "s", Job: "job", Spec: "30 2 * * *", Location: mustZone(t, "America/New_York")}
	got, err := s.Fires(utc("2026-03-07T12:00:00Z"), 1)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Wall != "2026-03-08 02:30:00" || got[0].At.Format("15:04 MST") != "03:00 EDT" {
		t.Errorf("fire = %+v; want wall 2026-03-08 02:30:00 firing at 03:00 EDT", got[0])
	}
}

func TestKeyRules(t *testing.T) {
	ny, berlin := mustZone(t, "America/New_York"), mustZone(t, "Europe/Berlin")
	christmas := func(d time.Time) bool {
		return runner.Weekdays(d) && d.Format("01-02") != "12-25"
	}
	for _, tc := range []struct {
		name string
		rule runner.KeyRule
		zone *time.Location
		fire string // UTC
		want string
	}{
		{"fire date is the zone's date, not UTC's", runner.FireDate("date"), berlin, "2026-03-29T22:30:00Z", "2026-03-30"},
		{"fire date late evening in NY", runner.FireDate("date"), ny, "2026-11-02T04:30:00Z", "2026-11-01"},
		{"fire date on the NY skipped fire", runner.FireDate("date"), ny, "2026-03-08T07:00:00Z", "2026-03-08"},
		{"previous business date, Tuesday", runner.PreviousBusinessDate("date", nil), ny, "2026-03-10T06:00:00Z", "2026-03-09"},
		{"previous business date, Monday after DST starts", runner.PreviousBusinessDate("date", nil), ny, "2026-03-09T06:00:00Z", "2026-03-06"},
		{"previous business date, the DST Sunday itself", runner.PreviousBusinessDate("date", runner.Weekdays), ny, "2026-03-08T07:00:00Z", "2026-03-06"},
		{"previous business date, Saturday", runner.PreviousBusinessDate("date", nil), berlin, "2026-10-24T00:00:00Z", "2026-10-23"},
		{"previous business date, Monday after Berlin falls back", runner.PreviousBusinessDate("date", nil), berlin, "2026-10-26T01:00:00Z", "2026-10-23"},
		{"previous business date, Berlin 00:30 is already Tuesday", runner.PreviousBusinessDate("date", nil), berlin, "2026-03-30T22:30:00Z", "2026-03-30"},
		{"previous date, every day a business day", runner.PreviousBusinessDate("date", runner.EveryDay), ny, "2026-03-08T07:00:00Z", "2026-03-07"},
		{"previous business date over a holiday", runner.PreviousBusinessDate("day", christmas), berlin, "2026-12-26T01:00:00Z", "2026-12-24"},
		{"previous business date over the year end", runner.PreviousBusinessDate("date", nil), ny, "2027-01-01T07:00:00Z", "2026-12-31"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.rule(utc(tc.fire).In(tc.zone))
			if len(got) != 1 {
				t.Fatalf("rule gave %v; want one parameter", got)
			}
			for _, v := range got {
				if v != tc.want {
					t.Errorf("rule(%s in %s) = %v; want %s", tc.fire, tc.zone, got, tc.want)
				}
			}
		})
	}
}

func TestScheduleParams(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	// The default key rule is the fire's date in the schedule's zone; the
	// key wins over Values.
	s := runner.Schedule{Name: "s", Job: "settle", Spec: "30 0 * * *", Location: berlin,
		Values: map[string]string{"date": "ignored", "chunk": "500"}}
	got, err := s.Params(utc("2026-03-29T22:30:00Z"))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"date": "2026-03-30", "chunk": "500"}; !maps.Equal(got, want) {
		t.Errorf("Params = %v; want %v", got, want)
	}
	if s.Values["date"] != "ignored" {
		t.Errorf("Params changed the schedule's Values: %v", s.Values)
	}
	// The key rule sees the fire in the schedule's zone.
	var seen *time.Location
	s.Key = func(f time.Time) map[string]string {
		seen = f.Location()
		return map[string]string{"k": f.Format("15:04")}
	}
	got, err = s.Params(utc("2026-03-29T22:30:00Z"))
	if err != nil {
		t.Fatal(err)
	}
	if seen != berlin || got["k"] != "00:30" {
		t.Errorf("key rule saw zone %v and gave %v; want Europe/Berlin and k=00:30", seen, got)
	}
}

func TestScheduleValidation(t *testing.T) {
	ok := runner.Schedule{Name: "nightly", Job: "settle", Spec: "0 2 * * *", Location: time.UTC}
	for _, tc := range []struct {
		name   string
		mutate func(*runner.Schedule)
		want   string
	}{
		{"no name", func(s *runner.Schedule) { s.Name = "" }, "Schedule.Name"},
		{"slash in name", func(s *runner.Schedule) { s.Name = "a/b" }, "Schedule.Name"},
		{"no job", func(s *runner.Schedule) { s.Job = "" }, "Schedule.Job"},
		{"no zone", func(s *runner.Schedule) { s.Location = nil }, "Schedule.Location"},
		{"zone in spec", func(s *runner.Schedule) { s.Spec = "CRON_TZ=Europe/Berlin 0 2 * * *" }, "Schedule.Location instead"},
		{"bad spec", func(s *runner.Schedule) { s.Spec = "0 25 * * *" }, "Schedule.Spec"},
		{"bad misfire", func(s *runner.Schedule) { s.Misfire = "later" }, "Schedule.Misfire"},
		{"bad overlap", func(s *runner.Schedule) { s.Overlap = "sometimes" }, "Schedule.Overlap"},
		{"negative deadline", func(s *runner.Schedule) { s.StartingDeadline = -time.Second }, "Schedule.StartingDeadline"},
	} {
		s := ok
		tc.mutate(&s)
		_, err := s.Fires(utc("2026-01-01T00:00:00Z"), 1)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v; want one naming %s", tc.name, err, tc.want)
		}
	}
	if _, err := ok.Fires(utc("2026-01-01T00:00:00Z"), 1); err != nil {
		t.Errorf("valid schedule: %v", err)
	}
}

// gapToMidnight returns the zone and the date of its spring change whose
// clocks jump from 23:00 straight to midnight, checked against the tz
// database (Greenland's since 2023: -02 to -01 at 01:00 UTC).
func gapToMidnight(t *testing.T, zone string, year int) (*time.Location, string) {
	t.Helper()
	loc := mustZone(t, zone)
	// The last Sunday of March, 01:00 UTC.
	d := time.Date(year, 3, 31, 1, 0, 0, 0, time.UTC)
	for d.Weekday() != time.Sunday {
		d = d.AddDate(0, 0, -1)
	}
	before, after := d.Add(-time.Second).In(loc), d.In(loc)
	if before.Format("15:04:05") != "22:59:59" || after.Format("15:04") != "00:00" || after.Day() == before.Day() {
		t.Fatalf("%s in %d: clocks go from %s to %s; the tz database here predates Greenland's 2023 change (tzdata 2023a+ needed)",
			zone, year, before, after)
	}
	return loc, before.Format("2006-01-02")
}

// In a zone whose spring gap runs to midnight, a 23:30 fire on the gap day
// fires at 00:00 the next day but keeps the gap day's key, so the next
// day's own fire gets a run of its own (issue 11, point 12).
func TestGapToMidnightKeepsItsDay(t *testing.T) {
	for _, tc := range []struct {
		zone string
		year int
	}{{"America/Nuuk", 2026}, {"America/Scoresbysund", 2026}, {"America/Nuuk", 2027}, {"America/Scoresbysund", 2027}} {
		t.Run(tc.zone+"/"+strconv.Itoa(tc.year), func(t *testing.T) {
			loc, gapDay := gapToMidnight(t, tc.zone, tc.year)
			day := func(off int) string {
				d, _ := time.Parse("2006-01-02", gapDay)
				return d.AddDate(0, 0, off).Format("2006-01-02")
			}
			s := runner.Schedule{Name: "late", Job: "settle", Spec: "30 23 * * *", Location: loc}
			after, _ := time.ParseInLocation("2006-01-02 15:04", day(-1)+" 12:00", loc)
			fires, err := s.Fires(after, 3)
			if err != nil {
				t.Fatal(err)
			}
			wantAt := []string{day(-1) + " 23:30 -02", day(1) + " 00:00 -01", day(1) + " 23:30 -01"}
			wantKey := []string{day(-1), day(0), day(1)}
			for i, f := range fires {
				if got := f.At.Format("2006-01-02 15:04 -07"); got != wantAt[i] {
					t.Errorf("fire %d at %s; want %s", i, got, wantAt[i])
				}
				if got := f.Scheduled.Format("2006-01-02 15:04"); got != wantKey[i]+" 23:30" {
					t.Errorf("fire %d scheduled %s; want %s 23:30", i, got, wantKey[i])
				}
				if !f.Scheduled.Equal(f.At) {
					t.Errorf("fire %d: scheduled instant %s differs from the fire's %s", i, f.Scheduled.UTC(), f.At.UTC())
				}
				// As Fire.Scheduled's doc says: midnight -01:00 read as 23:30.
				if want := day(0) + "T23:30:00-01:30"; i == 1 && f.Scheduled.Format(time.RFC3339) != want {
					t.Errorf("fire 1 scheduled reads %s; want %s", f.Scheduled.Format(time.RFC3339), want)
				}
				p, err := s.Params(f.At)
				if err != nil {
					t.Fatal(err)
				}
				if p["date"] != wantKey[i] {
					t.Errorf("fire %d at %s (%s) keys date %s; want %s", i, f.At, f.DST, p["date"], wantKey[i])
				}
			}
			if fires[1].DST != runner.DSTSkipped {
				t.Errorf("the gap day's fire is %q; want skipped", fires[1].DST)
			}
			prev := runner.PreviousBusinessDate("date", runner.EveryDay)(fires[1].Scheduled)["date"]
			if prev != day(-1) {
				t.Errorf("previous business date of the gap day's fire = %s; want %s", prev, day(-1))
			}
		})
	}
}

// A key rule reading the instant still gets distinct keys: the skipped
// 02:30 fires at 03:00 EDT (07:00Z), before 03:30 EDT's own fire (07:30Z).
func TestSkippedFireKeepsItsInstant(t *testing.T) {
	s := runner.Schedule{Name: "s", Job: "job", Spec: "30 * * * *", Location: mustZone(t, "America/New_York"),
		Key: func(f time.Time) map[string]string {
			return map[string]string{"key": f.UTC().Format("15:04"), "clock": f.Format("15:04")}
		}}
	fires, err := s.Fires(utc("2026-03-08T06:00:00Z"), 3)
	if err != nil {
		t.Fatal(err)
	}
	var keys, clocks []string
	for _, f := range fires {
		p, err := s.Params(f.At)
		if err != nil {
			t.Fatal(err)
		}
		keys, clocks = append(keys, p["key"]), append(clocks, p["clock"])
	}
	if want := []string{"06:30", "07:00", "07:30"}; !slices.Equal(keys, want) {
		t.Errorf("UTC keys %v; want %v", keys, want)
	}
	if want := []string{"01:30", "02:30", "03:30"}; !slices.Equal(clocks, want) {
		t.Errorf("wall clocks %v; want %v", clocks, want)
	}
}

// robfig gives up five years ahead; Fires searches on, so 29 February
// after 2096 is found in 2104, and a spec that never fires is an error.
func TestFiresPastRobfigsWindow(t *testing.T) {
	leap := runner.Schedule{Name: "leap", Job: "job", Spec: "0 2 29 2 *", Location: time.UTC}
	p, err := cron.ParseStandard(leap.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Next(utc("2096-03-01T00:00:00Z")); !got.IsZero() {
		t.Fatalf("robfig found %s; this test documents that it gives up", got)
	}
	fires, err := leap.Fires(utc("2096-03-01T00:00:00Z"), 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(fires) != 2 || !fires[0].At.Equal(utc("2104-02-29T02:00:00Z")) || !fires[1].At.Equal(utc("2108-02-29T02:00:00Z")) {
		t.Errorf("fires after 2096 = %+v; want 2104-02-29 and 2108-02-29 at 02:00", fires)
	}
	never := runner.Schedule{Name: "never", Job: "job", Spec: "0 0 30 2 *", Location: time.UTC}
	if _, err := never.Fires(utc("2026-01-01T00:00:00Z"), 1); err == nil || !strings.Contains(err.Error(), "never fires within 100 years") {
		t.Errorf("Fires of 30 February: err = %v; want one saying it never fires", err)
	}
}

// robfig's rules that the Spec documentation spells out.
func TestSpecRules(t *testing.T) {
	days := func(spec string) []string {
		t.Helper()
		s := runner.Schedule{Name: "s", Job: "job", Spec: spec, Location: time.UTC}
		fires, err := s.Fires(utc("2026-06-01T00:00:00Z"), 6)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range fires {
			out = append(out, f.At.Format("Mon 02"))
		}
		return out
	}
	for _, tc := range []struct {
		spec string
		want []string
	}{
		// Both day fields restricted: either matches.
		{"0 0 1 * 1", []string{"Mon 08", "Mon 15", "Mon 22", "Mon 29", "Wed 01", "Mon 06"}},
		// A step is a restriction too: odd days or Mondays.
		{"0 0 */2 * 1", []string{"Wed 03", "Fri 05", "Sun 07", "Mon 08", "Tue 09", "Thu 11"}},
		// A bare * (or */1) is not: Mondays only.
		{"0 0 * * 1", []string{"Mon 08", "Mon 15", "Mon 22", "Mon 29", "Mon 06", "Mon 13"}},
		{"0 0 */1 * 1", []string{"Mon 08", "Mon 15", "Mon 22", "Mon 29", "Mon 06", "Mon 13"}},
		{"0 0 * * 0", []string{"Sun 07", "Sun 14", "Sun 21", "Sun 28", "Sun 05", "Sun 12"}},
	} {
		if got := days(tc.spec); !slices.Equal(got, tc.want) {
			t.Errorf("%q fires on %v; want %v", tc.spec, got, tc.want)
		}
	}
	seven := runner.Schedule{Name: "s", Job: "job", Spec: "0 0 * * 7", Location: time.UTC}
	if _, err := seven.Fires(utc("2026-06-01T00:00:00Z"), 1); err == nil || !strings.Contains(err.Error(), "above maximum (6)") {
		t.Errorf("day-of-week 7: err = %v; want it refused (Sunday is 0)", err)
	}
}
