package ops

import (
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// goPrefix matches a Go package's prefix in an error's text ("steps: ",
// "checkpoint: "), at its start or after another part's colon: what the
// package adds for a programmer, not words for an operator.
var goPrefix = regexp.MustCompile(`(^|: )(?:checkpoint|jobs|steps|runner|ops|sqlite|postgres|settlement|httpapi): `)

// UserText is an error's text as an operator reads it, on the command
// line, in the API and on the dashboard: without the Go package prefixes
// the packages' errors carry.
func UserText(s string) string {
	for {
		t := goPrefix.ReplaceAllString(s, "$1")
		if t == s {
			return s
		}
		s = t
	}
}

// Sentence is an error's text as a sentence, for the dashboard: UserText,
// its first letter upper case, ending with a full stop.
func Sentence(s string) string {
	s = strings.TrimSpace(UserText(s))
	if s == "" {
		return s
	}
	r, n := utf8.DecodeRuneInString(s)
	s = string(unicode.ToUpper(r)) + s[n:]
	if !strings.HasSuffix(s, ".") && !strings.HasSuffix(s, "?") && !strings.HasSuffix(s, "!") {
		s += "."
	}
	return s
}
