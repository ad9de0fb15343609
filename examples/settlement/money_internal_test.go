package settlement

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestSum(t *testing.T) {
	for _, tc := range []struct {
		name  string
		add   []int64
		want  int64
		exact string // the exact total when it does not fit
	}{
		{name: "small", add: []int64{1, 2, -4}, want: -1},
		{name: "up to the limit", add: []int64{math.MaxInt64 - 1, 1}, want: math.MaxInt64},
		{name: "past the limit and back: the order does not matter", add: []int64{math.MaxInt64, math.MaxInt64, -math.MaxInt64}, want: math.MaxInt64},
		{name: "down to the limit", add: []int64{math.MinInt64 + 1, -1}, want: math.MinInt64},
		{name: "past the maximum", add: []int64{math.MaxInt64, 1}, exact: "9223372036854775808"},
		{name: "past the minimum", add: []int64{math.MinInt64, -1}, exact: "-9223372036854775809"},
		{name: "far past", add: []int64{math.MaxInt64, math.MaxInt64, math.MaxInt64}, exact: "27670116110564327421"},
	} {
		s := sum{what: "the test total"}
		for _, x := range tc.add {
			s.add(x)
		}
		got, err := s.value()
		switch {
		case tc.exact == "" && (err != nil || got != tc.want):
			t.Errorf("%s: value = %d, %v; want %d", tc.name, got, err, tc.want)
		case tc.exact != "" && (!errors.Is(err, ErrOverflow) || !strings.Contains(err.Error(), tc.exact) || !strings.Contains(err.Error(), "the test total")):
			t.Errorf("%s: value = %d, %v; want ErrOverflow naming the total and %s", tc.name, got, err, tc.exact)
		}
	}
	if d := difference(math.MaxInt64, math.MinInt64); d != "18446744073709551615" {
		t.Errorf("difference = %s", d)
	}
}
