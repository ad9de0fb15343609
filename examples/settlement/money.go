package settlement

import (
	"errors"
	"fmt"
	"math/big"
	"math/bits"
)

// ErrOverflow is wrapped by the errors of the summary and of Check when a
// sum of minor units does not fit in an int64: the data is wrong (or not in
// minor units), and a wrapped-around total would be a silent lie.
var ErrOverflow = errors.New("int64 overflow")

// sum is a total of int64 minor units kept in 128 bits, so the order of
// the terms never matters: only a total that does not fit in an int64 is
// an error (from value), naming what was summed and its exact value.
type sum struct {
	what string // what the total is, for the error: "the opening total"
	hi   int64  // the total is hi<<64 + lo, two's complement; fewer
	lo   uint64 // than 2^63 terms cannot overflow it
}

// add adds x.
func (s *sum) add(x int64) { s.add128(x>>63, uint64(x)) }

func (s *sum) add128(hi int64, lo uint64) {
	var carry uint64
	s.lo, carry = bits.Add64(s.lo, lo, 0)
	s.hi += hi + int64(carry)
}

// value returns the total, or an error wrapping ErrOverflow when it does
// not fit in an int64.
func (s *sum) value() (int64, error) {
	if v := int64(s.lo); s.hi == v>>63 {
		return v, nil
	}
	exact := new(big.Int).Lsh(big.NewInt(s.hi), 64)
	exact.Add(exact, new(big.Int).SetUint64(s.lo))
	return 0, fmt.Errorf("%w: %s is %s, which does not fit in int64 minor units", ErrOverflow, s.what, exact)
}

// difference is a-b in decimal, exact even where it does not fit in an
// int64 (a report must not lie about how far off a balance is).
func difference(a, b int64) string {
	return new(big.Int).Sub(big.NewInt(a), big.NewInt(b)).String()
}
