package steps

import (
	"fmt"
	"strings"
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
	for part := range strings.SplitSeq(id, "/") {
		if part == "" {
			return fmt.Errorf("%w: step ID %q has an empty part; each part between / must be non-empty", ErrInvalidID, id)
		}
		for _, c := range part {
			if !validIDRune(c) {
				return fmt.Errorf("%w: step ID %q contains %q; use letters, digits and . _ - : @ = +",
					ErrInvalidID, id, c)
			}
		}
	}
	return nil
}

func validIDRune(c rune) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.ContainsRune("._-:@=+", c)
}
