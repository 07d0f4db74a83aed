package redlock_test

import (
	"os"
	"testing"
)

// The tests against real servers are in tests/redlock (the development
// module); the examples here get their servers' addresses from the
// environment (startExampleServers).
func TestMain(m *testing.M) { startExampleServers(); os.Exit(m.Run()) }
