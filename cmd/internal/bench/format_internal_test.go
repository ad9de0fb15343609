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

// A goal of 0.95 prints as itself, not rounded to 0.9 or 1.0.
func TestFormatGoal(t *testing.T) {
	for g, want := range map[float64]string{0.95: "0.95", 0.9: "0.9", 1.5: "1.5", 0.5: "0.5"} {
		if got := formatGoal(g); got != want {
			t.Errorf("formatGoal(%v) = %q, want %q", g, got, want)
		}
	}
}
