package web

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// timeLayout is how the pages show a time, in Config.Location.
const timeLayout = "2006-01-02 15:04:05 MST"

func (h *Handler) funcs() template.FuncMap {
	return template.FuncMap{
		// usertext and sentence are an error's text for an operator:
		// without Go package prefixes, and (sentence) as a sentence.
		"usertext": ops.UserText,
		"sentence": ops.Sentence,
		"when": func(t any) string {
			switch t := t.(type) {
			case time.Time:
				if t.IsZero() {
					return "—"
				}
				return t.In(h.cfg.Location).Format(timeLayout)
			case *time.Time:
				if t == nil || t.IsZero() {
					return "—"
				}
				return t.In(h.cfg.Location).Format(timeLayout)
			}
			return ""
		},
		"iso": func(t any) string {
			switch t := t.(type) {
			case time.Time:
				return t.UTC().Format(time.RFC3339)
			case *time.Time:
				if t != nil {
					return t.UTC().Format(time.RFC3339)
				}
			}
			return ""
		},
		"inZone": func(t time.Time, zone string) string {
			loc, err := time.LoadLocation(zone)
			if err != nil {
				loc = time.UTC
			}
			return t.In(loc).Format("Mon 2006-01-02 15:04:05 MST")
		},
		"ago": func(now time.Time, t time.Time) string { return duration(now.Sub(t)) + " ago" },
		"dur": duration,
		"took": func(r ops.RunView, now time.Time) string {
			d := duration(ended(r, now).Sub(r.CreatedAt))
			if r.FinishedAt == nil && r.Status == "running" && !r.Stale {
				d += " so far"
			}
			return d
		},
		"runURL":  runURL,
		"num":     groupDigits,
		"signed":  func(n int64) string { return signed(n) },
		"pct":     func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
		"rate":    func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
		"raw":     rawJSON,
		"short":   func(s string, n int) string { return shorten(s, n) },
		"misfire": ops.MisfireNote,
		"overlap": overlapNote,
		"attr":    func(n int) string { return strconv.Itoa(n) },
		"query":   func(q string) template.URL { return template.URL("?" + q) },
		"add":     func(a, b int) int { return a + b },
		"int64":   func(n int) int64 { return int64(n) },
	}
}

// runURL is the path of a run's page: each part of its ID escaped.
func runURL(id string) string {
	parts := strings.Split(id, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return "/runs/" + strings.Join(parts, "/")
}

// duration is d rounded for reading: 850ms, 12.3s, 4m05s, 2h10m.
func duration(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	case d < time.Hour && d%time.Minute == 0:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

// groupDigits writes n with thin spaces between groups of three digits:
// 1 234 567 (exact: money is int64 minor units, never a float).
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteRune('\u202f')
		}
		b.WriteRune(c)
	}
	if neg {
		return "−" + b.String()
	}
	return b.String()
}

func signed(n int64) string {
	if n > 0 {
		return "+" + groupDigits(n)
	}
	if n == 0 {
		return "±0"
	}
	return groupDigits(n)
}

// rawJSON is a recorded JSON value, indented for reading.
func rawJSON(v json.RawMessage) string {
	if len(v) == 0 {
		return ""
	}
	var b bytes.Buffer
	if err := json.Indent(&b, v, "", "  "); err != nil {
		return string(v)
	}
	return b.String()
}

func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

// overlapNote says what happens to a fire while the last run still runs.
func overlapNote(policy string) string {
	switch runner.OverlapPolicy(policy) {
	case runner.OverlapForbid:
		return "a fire while the last run still runs is skipped"
	case runner.OverlapQueue:
		return "a fire while the last run still runs waits for it"
	case runner.OverlapAllow:
		return "a fire starts even while the last run still runs"
	}
	return ""
}
