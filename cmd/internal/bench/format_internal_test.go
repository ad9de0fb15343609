package bench

import "testing"

// A ratio just under its goal never prints as the goal itself.
func TestFormatRatio(t *testing.T) {
	for _, c := range []struct {
		r    float64
		want string
	}{{0.797, "0.797"}, {0.8, "0.800"}, {1.364, "1.364"}, {0.00437, "0.00437"}, {0.0116, "0.0116"}} {
		if got := formatRatio(c.r); got != c.want {
			t.Errorf("formatRatio(%v) = %q, want %q", c.r, got, c.want)
		}
	}
}
