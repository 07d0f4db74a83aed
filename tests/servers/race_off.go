//go:build !race

package servers

// RaceDetector reports whether this binary was built with -race. Tests that
// drive the go-zookeeper client through reconnects use it: that client has
// data races of its own there (see tests/zookeeper reconnects and
// tests/matrix explorer.resets), which scripts/test.sh runs without -race.
const RaceDetector = false
