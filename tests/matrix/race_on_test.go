//go:build race

package matrix_test

// raceDetector: whether this test binary was built with -race (see explorer.resets).
const raceDetector = true
