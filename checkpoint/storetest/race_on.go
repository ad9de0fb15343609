//go:build race

package storetest

// raceDetector is true when the race detector is compiled in.
const raceDetector = true
