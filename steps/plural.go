package steps

import "strconv"

// plural is n followed by one (n == 1) or many: plural(1, "try", "tries")
// is "1 try", plural(3, "try", "tries") "3 tries", so counted words in
// messages agree with their numbers.
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}
