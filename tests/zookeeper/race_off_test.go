//go:build !race

package zookeeper_test

// raceDetector: whether this test binary was built with -race (see reconnects).
const raceDetector = false
