package steps

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxIDLength is the longest step ID accepted, in bytes.
const MaxIDLength = 256

// ID builds a step ID from a name and optional business keys, joined with
// "/": ID("post", "T-1001") is "post/T-1001". Each part may hold letters,
// digits and . _ - : @ = +; the ID is checked when a step runs with it, and a
// bad one fails that step with ErrInvalidID.
func ID(name string, keys ...string) string {
	if len(keys) == 0 {
		return name
	}
	return name + "/" + strings.Join(keys, "/")
}

// ValidateID returns an error wrapping ErrInvalidID, naming the problem, if
// id is not a valid step ID.
func ValidateID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty step ID; give the step a name, e.g. steps.ID(\"load\")", ErrInvalidID)
	}
	if len(id) > MaxIDLength {
		return fmt.Errorf("%w: step ID %.40q... is %d bytes, the limit is %d; shorten its key",
			ErrInvalidID, id, len(id), MaxIDLength)
	}
	start := 0
	for i := 0; i <= len(id); i++ {
		if i < len(id) && id[i] != '/' {
			if !validIDByte(id[i]) {
				c, _ := utf8.DecodeRuneInString(id[i:])
				return fmt.Errorf("%w: step ID %q contains %q; use letters, digits and . _ - : @ = +",
					ErrInvalidID, id, c)
			}
			continue
		}
		if i == start {
			return fmt.Errorf("%w: step ID %q has an empty part; each part between / must be non-empty", ErrInvalidID, id)
		}
		start = i + 1
	}
	return nil
}

func validIDByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	switch c {
	case '.', '_', '-', ':', '@', '=', '+':
		return true
	}
	return false
}
