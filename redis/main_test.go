package redis_test

import (
	"os"
	"testing"
)

// The tests against real servers are in tests/redis (the development
// module); the examples here get their server's address from the
// environment (startExampleServers).
func TestMain(m *testing.M) { startExampleServers(); os.Exit(m.Run()) }
