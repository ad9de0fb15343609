package ops

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ErrBadText is wrapped by the refusal (a *TextError) of a text field of
// a request (an API body or parameter, a dashboard form, a command-line
// flag) that is not valid UTF-8 or holds a control character. Every face
// checks its fields with CheckText as it reads them, before anything is
// looked up or changed: the CLI exits 2, the API answers 400.
var ErrBadText = errors.New("not valid text")

// TextError is a text field refused by CheckText.
type TextError struct {
	// Field names the field as its face calls it: "reason", "params.date",
	// "keys[0]", "--operator", "status" (of In "query parameter"), "path".
	Field string
	// In, if set, says what kind of field it is, before its name in the
	// message: "query parameter".
	In string
	// Problem says what is wrong with it, in words.
	Problem string
}

func (e *TextError) Error() string {
	name := e.Field
	if e.In != "" {
		name = e.In + " " + name
	}
	return fmt.Sprintf("%s %s; give valid UTF-8 text without control characters", name, e.Problem)
}

// Unwrap makes errors.Is(err, ErrBadText) hold.
func (e *TextError) Unwrap() error { return ErrBadText }

// Multiline reports whether field (as its face names it) is text that
// may span lines: a reason ("reason" in an API body, "--reason" on the
// command line), or resolve's --output, a JSON document whose whitespace
// may be newlines and tabs.
func Multiline(field string) bool {
	switch strings.TrimLeft(field, "-") {
	case "reason", "output":
		return true
	}
	return false
}

// CheckText is the rule for every text field of a request: valid UTF-8,
// no control character (C0, DEL, C1; NUL never), except newlines, tabs
// and carriage returns in a reason (Multiline), and no invisible
// formatting character that makes text read otherwise than it is stored
// (bidirectional overrides and isolates U+202A–U+202E, U+2066–U+2069,
// zero-width characters and marks U+200B–U+200F): an audit trail must read
// as written. It returns a *TextError naming field, or nil.
func CheckText(field, s string) error {
	multiline := Multiline(field)
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			return &TextError{Field: field, Problem: fmt.Sprintf("is not valid UTF-8 (byte %d)", i)}
		case r == 0:
			return &TextError{Field: field, Problem: fmt.Sprintf("holds a NUL character (byte %d)", i)}
		case multiline && (r == '\n' || r == '\t' || r == '\r'):
		case unicode.IsControl(r):
			return &TextError{Field: field, Problem: fmt.Sprintf("holds the control character %s (byte %d)", strconv.QuoteRune(r), i)}
		case invisible(r):
			return &TextError{Field: field, Problem: fmt.Sprintf("holds the invisible formatting character %s (byte %d)", strconv.QuoteRune(r), i)}
		}
	}
	return nil
}

// invisible reports whether r is a bidirectional override or isolate, or a
// zero-width character or mark: it changes how text reads without showing.
func invisible(r rune) bool {
	return r >= 0x200B && r <= 0x200F || r >= 0x202A && r <= 0x202E || r >= 0x2066 && r <= 0x2069
}

// Check applies CheckText to who's operator and reason, named as in the
// API ("operator", "reason"); a face that calls them otherwise checks
// them itself first.
func (w Who) Check() error {
	if err := CheckText("operator", w.Operator); err != nil {
		return err
	}
	return CheckText("reason", w.Reason)
}

// CheckJSON applies CheckText to every string of a JSON document, and
// to its object keys, naming each by its path: "reason", "params.date",
// "keys[0]". It reads the raw bytes, because a JSON decoder turns bytes
// that are not UTF-8 into U+FFFD without a word. What is not JSON is left
// to the decoder to refuse (nil).
func CheckJSON(doc []byte) error {
	return checkJSON("", doc)
}

func checkJSON(field string, raw []byte) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil
	}
	switch raw[0] {
	case '{':
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) != nil {
			return nil
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			f := k
			if field != "" {
				f = field + "." + k
			}
			if err := CheckText("the name of field "+strconv.Quote(f), k); err != nil {
				return err
			}
			if err := checkJSON(f, m[k]); err != nil {
				return err
			}
		}
		if !utf8.Valid(raw) { // not in a value: in a key, decoded as U+FFFD
			return &TextError{Field: "a field name in " + cmp.Or(field, "the body"), Problem: "is not valid UTF-8"}
		}
	case '[':
		var a []json.RawMessage
		if json.Unmarshal(raw, &a) != nil {
			return nil
		}
		for i, v := range a {
			if err := checkJSON(fmt.Sprintf("%s[%d]", field, i), v); err != nil {
				return err
			}
		}
	case '"':
		f := cmp.Or(field, "the body")
		if !utf8.Valid(raw) {
			return &TextError{Field: f, Problem: "is not valid UTF-8"}
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return nil
		}
		return CheckText(f, s)
	}
	return nil
}

// CheckURL applies CheckText to a request's path, as decoded (%00 is a
// NUL), and to each query parameter, name and values: a *TextError whose
// Field is "path", or the parameter's name In "query parameter".
func CheckURL(u *url.URL) error {
	if err := CheckText("path", u.Path); err != nil {
		return err
	}
	// Pairs that do not parse are dropped here as by URL.Query, which
	// the handlers read.
	q, _ := url.ParseQuery(u.RawQuery)
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if err := CheckText(strconv.Quote(k), k); err != nil {
			return in("the name of query parameter", err)
		}
		for _, v := range q[k] {
			if err := CheckText(k, v); err != nil {
				return in("query parameter", err)
			}
		}
	}
	return nil
}

// in sets the In of err, a *TextError.
func in(kind string, err error) error {
	var te *TextError
	if errors.As(err, &te) {
		te.In = kind
	}
	return err
}
